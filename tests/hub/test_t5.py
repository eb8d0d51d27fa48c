"""T5 (T5ForConditionalGeneration) against transformers: the fixtures in tests/fixtures/hf/t5*/
were computed by transformers in float64 (tools/make_hf_fixtures_t5.py); here the loaded
Seq2SeqLM must give the same logits (1e-9 relative) from input_ids and decoder_input_ids, the
same gradient for every parameter in T5's names (1e-8), generate's greedy ids with cached
decoding equal to the full forward, save back bit-identically, and refuse by name what it
cannot model. No torch here. t5 (relu, tied, scaled) is the fast tier's encoder-decoder;
t5_v11 (gated-gelu, untied, 3 decoder layers) runs in the slow tier."""
import dataclasses
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scratchllm.hub import grad_dict, load_pretrained, save_pretrained, state_dict
from scratchllm.lm import Seq2SeqLM
from hub_fixtures import HF, expected, rel_err

CHECKPOINTS = ["t5", pytest.param("t5_v11", marks=pytest.mark.slow)]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_every_gradient_and_greedy_ids_match_transformers(name):
    ref = expected(name)
    model = load_pretrained(HF / name, dtype=np.float64)
    assert isinstance(model, Seq2SeqLM)
    logits, cache = model.forward(input_ids=ref["input_ids"],
                                  decoder_input_ids=ref["decoder_input_ids"])  # (B, Tt, V)
    assert rel_err(logits, ref["logits"]) < 1e-9
    G = np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape)
    model.zero_grad()
    model.backward(G, cache)
    grads = grad_dict(model)
    want = {k.removeprefix("grad/"): v for k, v in ref.items() if k.startswith("grad/")}
    assert sorted(grads) == sorted(want)
    for hf_name, g in want.items():
        assert grads[hf_name].shape == g.shape, hf_name
        assert rel_err(grads[hf_name], g) < 1e-8, hf_name
    greedy = model.greedy(ref["input_ids"], ref["greedy"].shape[1])  # cached decoding
    assert np.array_equal(greedy, ref["greedy"])
    start = np.full((greedy.shape[0], 1), model.cfg.decoder_start_id)
    full, _ = model.forward(input_ids=ref["input_ids"],  # the full forward agrees
                            decoder_input_ids=np.concatenate([start, greedy[:, :-1]], 1))
    assert np.array_equal(full.argmax(-1), greedy)


def test_decoding_state_prefill_and_steps_equal_the_full_forward():
    ref = expected("t5")
    model = load_pretrained(HF / "t5", dtype=np.float64)
    src, tgt = ref["input_ids"], ref["decoder_input_ids"]
    full, _ = model.forward(input_ids=src, decoder_input_ids=tgt)  # (B, Tt, V)
    state = model.init_state(src.shape[0], tgt.shape[1], input_ids=src)
    head = model.prefill(tgt[:, :3], state)  # (B, 3, V)
    steps = [model.decode(tgt[:, t], state, t) for t in range(3, tgt.shape[1])]
    got = np.concatenate([head, np.stack(steps, axis=1)], axis=1)
    assert np.abs(got - full).max() < 1e-12 * np.abs(full).max()


def test_a_padded_source_batch_matches_transformers_with_its_attention_mask():
    """expected_masked.npz: rows of lengths 9, 5 and 3 padded to 9, with attention_mask;
    the logits, every gradient and generate's greedy ids (cached decoding, the padded
    CrossContext) as transformers computes them."""
    ref = dict(np.load(HF / "t5" / "expected_masked.npz"))
    model = load_pretrained(HF / "t5", dtype=np.float64)
    logits, cache = model.forward(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                                  decoder_input_ids=ref["decoder_input_ids"])
    assert rel_err(logits, ref["logits"]) < 1e-9
    model.zero_grad()
    model.backward(np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape), cache)
    for hf_name, g in grad_dict(model).items():
        assert rel_err(g, ref["grad/" + hf_name]) < 1e-8, hf_name
    greedy = model.greedy(ref["input_ids"], ref["greedy"].shape[1],
                          attention_mask=ref["attention_mask"])
    assert np.array_equal(greedy, ref["greedy"])


def test_each_padded_row_equals_the_row_run_alone_unpadded():
    """Logits row by row, Param gradients as the sum of the rows' own: a padded key gets no
    attention and no gradient; decoding over the padded CrossContext gives the same logits."""
    model = load_pretrained(HF / "t5", dtype=np.float64)
    rng, lengths, Ts, Tt, V = np.random.default_rng(0), (4, 2), 4, 3, model.cfg.vocab_size
    mask = (np.arange(Ts)[None] < np.array(lengths)[:, None]).astype(np.int64)  # (B, Ts)
    src = np.where(mask == 1, rng.integers(3, V, (2, Ts)), 0)
    tgt, G = rng.integers(3, V, (2, Tt)), rng.standard_normal((2, Tt, V))
    model.zero_grad()
    logits, cache = model.forward(input_ids=src, decoder_input_ids=tgt, attention_mask=mask)
    model.backward(G, cache)
    batch = {k: v.copy() for k, v in grad_dict(model).items()}
    model.zero_grad()
    for b, n in enumerate(lengths):
        alone, c = model.forward(input_ids=src[b:b + 1, :n], decoder_input_ids=tgt[b:b + 1])
        assert rel_err(logits[b], alone[0]) < 1e-12
        model.backward(G[b:b + 1], c)
    for name, g in grad_dict(model).items():
        assert rel_err(batch[name], g) < 1e-12, name
    state = model.init_state(2, Tt, input_ids=src, attention_mask=mask)  # a padded context
    steps = [model.prefill(tgt[:, :1], state)[:, 0]] + [
        model.decode(tgt[:, t], state, t) for t in range(1, Tt)]
    assert rel_err(np.stack(steps, axis=1), logits) < 1e-12


@pytest.mark.parametrize("mask, match", [
    (np.ones((2, 3), np.int64), r"input_ids' shape \(2, 4\)"),
    (np.full((2, 4), 2), "0/1"),
    (np.array([[1, 1, 0, 0], [0, 0, 0, 0]]), r"only padding \(rows \[1\]\)")])
def test_a_bad_attention_mask_is_named(mask, match):
    model = load_pretrained(HF / "t5")
    with pytest.raises(ValueError, match=match):
        model.forward(input_ids=np.ones((2, 4), np.int64),
                      decoder_input_ids=np.ones((2, 2), np.int64), attention_mask=mask)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_save_load_is_bit_identical_and_transformers_loads_it(name, tmp_path):
    model = load_pretrained(HF / name)
    save_pretrained(model, tmp_path)
    original, saved = load_file(HF / name / "model.safetensors"), load_file(
        tmp_path / "model.safetensors")
    assert sorted(saved) == sorted(original)
    for key, array in original.items():
        assert np.array_equal(saved[key], array), key
    again = state_dict(load_pretrained(tmp_path))
    for key, array in state_dict(model).items():
        assert np.array_equal(again[key], array), key
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "t5" and written["d_kv"] == 6
    assert written["scale_decoder_outputs"] == (name == "t5")
    # the generator loaded scratchllm's save with from_pretrained: float32 rounding only
    assert expected(name)["saved_by_scratchllm_rel_err"] < 1e-5


def test_the_head_ties_and_scales_as_transformers_5_reads_the_config(tmp_path):
    """t5_v11's config says tie_word_embeddings false (no scale) and holds lm_head.weight: an
    untied head. A transformers-5 config says tie_word_embeddings true always; its head is
    then untied by an lm_head.weight of other values, tied by an equal one."""
    v11 = load_pretrained(HF / "t5_v11")
    assert not v11.cfg.tie_embeddings and not v11.cfg.scale_output
    t5 = load_pretrained(HF / "t5")
    assert t5.cfg.tie_embeddings and t5.cfg.scale_output
    d = tmp_path / "v5"
    shutil.copytree(HF / "t5", d)
    tensors = load_file(d / "model.safetensors")
    save_file({**tensors, "lm_head.weight": tensors["shared.weight"]}, d / "model.safetensors")
    assert load_pretrained(d).cfg.tie_embeddings  # equal: still tied
    save_file({**tensors, "lm_head.weight": tensors["shared.weight"] * 2},
              d / "model.safetensors")
    assert not load_pretrained(d).cfg.tie_embeddings


@pytest.mark.parametrize("field, value, match", [
    ("feed_forward_proj", "gated-relu", "feed_forward_proj = 'gated-relu'"),
    ("is_encoder_decoder", False, "is_encoder_decoder"),
    ("model_type", "t6", "model_type 't6' is not supported")])
def test_options_the_library_cannot_model_are_refused_by_name(field, value, match, tmp_path):
    d = tmp_path / "t5"
    shutil.copytree(HF / "t5", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, field: value}))
    with pytest.raises(ValueError, match=match):
        load_pretrained(d)


def test_a_missing_tensor_and_an_inexpressible_config_are_named(tmp_path):
    d = tmp_path / "t5"
    shutil.copytree(HF / "t5", d)
    tensors = load_file(d / "model.safetensors")
    del tensors["decoder.block.1.layer.1.EncDecAttention.k.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match="EncDecAttention.k.weight"):
        load_pretrained(d)
    model = load_pretrained(HF / "t5")
    layer = model.cfg.encoder[0]
    biased = dataclasses.replace(layer, mixer=dataclasses.replace(layer.mixer, qkv_bias=True))
    cfg = dataclasses.replace(model.cfg, encoder=(biased,) * 2)
    with pytest.raises(ValueError, match="t5 checkpoint only with plain=True"):
        save_pretrained(Seq2SeqLM(cfg, rng=np.random.default_rng(0)), tmp_path / "out")


def test_the_whole_model_backward_passes_its_gradient_check():
    """lm_seq2seq: d loss / d every Param of tiny T5 and T5 v1.1 models by finite
    differences (the shared bias tables, the tied scaled head, the cross-attention; Switch with
    its router losses)."""
    from grads.cases import CASES
    reports = CASES["lm_seq2seq"](np.random.default_rng(0))
    assert [r.label for r in reports] == ["t5", "t5_v11", "switch"]
    for report in reports:
        assert report.ok, f"\n{report}"


def test_sample_hf_prints_the_decoders_greedy_text(capsys):
    """`sample --hf` on t5: the prompt (with the tokenizer's </s>) is the source; greedy
    decoding prints the ids the model's greedy decoding gives, up to the eos id."""
    from scratchllm import cli
    from scratchllm.hub import load_tokenizer
    prompt = "the cat is here."
    assert cli.main(["sample", "--hf", str(HF / "t5"), "--prompt", prompt, "--max-tokens",
                     "8", "--temperature", "0", "--top-p", "1"]) == 0
    model, tok = load_pretrained(HF / "t5", dtype=np.float64), load_tokenizer(HF / "t5")
    src = tok.encode_ordinary(prompt, add_special_tokens=True)
    assert src[-1] == 1  # T5's </s>
    ids = list(model.greedy(np.array([src]), 8)[0])
    ids = ids[:ids.index(1)] if 1 in ids else ids
    assert capsys.readouterr().out == tok.decode(ids) + "\n"
