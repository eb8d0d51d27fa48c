"""Switch Transformers (SwitchTransformersForConditionalGeneration) against transformers: the
fixture tests/fixtures/hf/switch/ was computed by transformers in float64
(tools/make_hf_fixtures_t5.py): 4 experts of capacity 2 per sequence, a sparse layer every
second layer. Here: the same logits (1e-9), every gradient (1e-8) without the router losses
(a loaded model's default) and with them (transformers' output_router_logits loss), the
same router losses, generate's greedy ids, a bit-identical save; and Switch's layer keeps the
first C tokens of each expert in each sequence and passes the rest through. No torch here."""

import numpy as np
import pytest
from safetensors.numpy import load_file

from scratchllm.hub import grad_dict, load_pretrained, save_pretrained
from scratchllm.lm import Block
from scratchllm.moe import MoEWeights, moe_forward, switch_moe_forward
from scratchllm.specs import AttentionSpec, ExpertsSpec, LayerSpec, Mask, MoESpec, RouterSpec
from hub_fixtures import HF, rel_err


@pytest.fixture(scope="module")
def loaded():
    ref = dict(np.load(HF / "switch" / "expected.npz"))
    model = load_pretrained(HF / "switch", dtype=np.float64)
    logits, cache = model.forward(input_ids=ref["input_ids"],
                                  decoder_input_ids=ref["decoder_input_ids"])
    return ref, model, logits, cache


def _grads_match(model, ref, key):
    want = {k.removeprefix(f"{key}/"): v for k, v in ref.items() if k.startswith(f"{key}/")}
    grads = grad_dict(model)
    assert sorted(grads) == sorted(want)
    for name, g in want.items():
        if np.abs(g).max() == 0:  # an expert no token reached (or only dropped ones)
            assert np.abs(grads[name]).max() == 0, name
        else:
            assert rel_err(grads[name], g) < 1e-8, name


@pytest.mark.slow
def test_logits_gradients_router_losses_and_greedy_ids_match_transformers(loaded):
    ref, model, logits, cache = loaded
    assert rel_err(logits, ref["logits"]) < 1e-9
    G = np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape)
    model.zero_grad()
    model.backward(G, cache)  # a loaded model's router losses are off
    _grads_match(model, ref, "grad")
    terms = dict(model.aux_losses(cache))
    spec = model.encoder[1].ffn.spec
    z = (terms["encoder_z"] + terms["decoder_z"]) / spec.z_coef
    aux = (terms["encoder_balance"] + terms["decoder_balance"]) / spec.balance_coef
    assert abs(z - ref["z_loss"]) < 1e-12 * ref["z_loss"]
    assert abs(aux - ref["aux_loss"]) < 1e-12 * ref["aux_loss"]
    model.zero_grad()
    model.backward(G, cache, 1.0)  # asked for: logits * G + the weighted router losses
    _grads_match(model, ref, "grad_aux")
    assert np.array_equal(model.greedy(ref["input_ids"], ref["greedy"].shape[1]),
                          ref["greedy"])


@pytest.mark.slow
def test_the_fixture_drops_tokens_and_saves_bit_identically(loaded, tmp_path):
    ref, model, logits, cache = loaded
    inner = cache.enc[1].ffn.inner[0]  # the first sparse encoder layer
    assert len(inner.slots) < inner.counts.sum()  # capacity 2 dropped tokens there
    save_pretrained(model, tmp_path, dtype="float32")
    original, saved = load_file(HF / "switch" / "model.safetensors"), load_file(
        tmp_path / "model.safetensors")
    assert sorted(saved) == sorted(original)
    for key, array in original.items():
        assert np.array_equal(saved[key], array), key
    assert ref["saved_by_scratchllm_rel_err"] < 1e-5


def test_switch_keeps_the_first_tokens_of_each_expert_per_sequence():
    rng = np.random.default_rng(0)
    B, T, D, E, F, C = 2, 6, 4, 3, 5, 1
    spec = MoESpec(RouterSpec(E, 1, norm_topk_prob=False), ExpertsSpec("relu", F),
                   expert_capacity=C)
    w = MoEWeights(rng.standard_normal((D, E)), w1=rng.standard_normal((E, D, F)),
                   w2=rng.standard_normal((E, F, D)))
    x = rng.standard_normal((B, T, D))
    out, _ = switch_moe_forward(x, w, spec=spec)
    choice = (x @ w.w_router).argmax(-1)  # (B, T)
    for b in range(B):
        for t in range(T):
            first = (choice[b, :t] != choice[b, t]).all()  # its expert's first token here
            assert (np.abs(out.y[b, t]).max() > 0) == first
    steps = np.stack([switch_moe_forward(x[:, t], w, spec=spec)[0].y for t in range(T)], 1)
    assert np.abs(steps).min(axis=-1).all()  # one token at a time: nothing is dropped
    with pytest.raises(ValueError, match="switch_moe_forward"):
        moe_forward(x, w, spec=spec)
    attn = AttentionSpec(2, 2, rope=None, mask=Mask(causal=False))
    block = Block(D, LayerSpec(attn, spec), rng=rng, dtype=np.float64)
    y, c = block.forward(x)
    m, _ = block.mixer.forward(block.norm1.forward(x)[0])
    h = (x + m).reshape(B * T, D)  # after the attention sub-layer
    dropped = ~np.isin(np.arange(B * T), c.ffn.inner[0].slots)
    assert dropped.any()  # a dropped token passes the FFN sub-layer unchanged: h + 0
    assert np.array_equal(y.reshape(B * T, D)[dropped], h[dropped])


def test_a_config_switch_cannot_express_is_refused_by_name(tmp_path):
    """Sparse layers where transformers' step would not put them, or of another kind."""
    import dataclasses
    from scratchllm.lm import Seq2SeqLM
    model = load_pretrained(HF / "switch")
    cfg = model.cfg
    moved = dataclasses.replace(cfg, encoder=(cfg.encoder[1],) + cfg.encoder[1:])
    with pytest.raises(ValueError, match=r"encoder sparse layers \[0, 1, 3\]"):
        save_pretrained(Seq2SeqLM(moved, rng=np.random.default_rng(0)), tmp_path / "a")
    spec = cfg.encoder[1].ffn
    other = dataclasses.replace(spec, expert_capacity=None, capacity_factor=1.0,
                                experts=ExpertsSpec("mlp", spec.experts.d_ff))
    layer = dataclasses.replace(cfg.encoder[1], ffn=other)
    odd = dataclasses.replace(cfg, encoder=(cfg.encoder[0], layer) + cfg.encoder[2:])
    with pytest.raises(ValueError, match="sparse layers other than Switch's"):
        save_pretrained(Seq2SeqLM(odd, rng=np.random.default_rng(0)), tmp_path / "b")


@pytest.mark.slow
def test_a_padded_source_batch_matches_transformers_with_its_attention_mask():
    """switch/expected_masked.npz: rows of 9, 5 and 3 tokens padded to 9 (the padding routed
    and counted by capacity as in transformers; it comes after the real tokens, so it takes
    no slot of theirs), with attention_mask: logits, every gradient, greedy ids."""
    ref = dict(np.load(HF / "switch" / "expected_masked.npz"))
    model = load_pretrained(HF / "switch", dtype=np.float64)
    logits, cache = model.forward(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                                  decoder_input_ids=ref["decoder_input_ids"])
    assert rel_err(logits, ref["logits"]) < 1e-9
    model.zero_grad()
    model.backward(np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape), cache)
    _grads_match(model, ref, "grad")
    greedy = model.greedy(ref["input_ids"], ref["greedy"].shape[1],
                          attention_mask=ref["attention_mask"])
    assert np.array_equal(greedy, ref["greedy"])
