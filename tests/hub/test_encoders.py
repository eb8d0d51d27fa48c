"""BERT (BertForMaskedLM) against transformers: the fixtures in tests/fixtures/hf/bert*/ were
computed by transformers in float64 (tools/make_hf_fixtures_encoders.py); here the loaded
MaskedLM must give the same logits (1e-9 relative) from input_ids and token_type_ids, the
same gradient for every parameter in BERT's names (1e-8), save back bit-identically, and
refuse what it cannot model by name. No torch here."""
import dataclasses
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scratchllm.hub import flat_of, grad_dict, load_pretrained, save_pretrained, state_dict
from scratchllm.lm import LM, MaskedLM, preset
from hub_fixtures import HF, expected, rel_err

CHECKPOINTS = ["bert", "bert_tanh"]


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_and_every_gradient_match_transformers(name):
    ref = expected(name)
    model = load_pretrained(HF / name, dtype=np.float64)
    assert isinstance(model, MaskedLM)
    logits, cache = model.forward(input_ids=ref["input_ids"],
                                  token_type_ids=ref["token_type_ids"])  # (B, T, V)
    assert rel_err(logits, ref["logits"]) < 1e-9
    G = np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape)  # (B, T, V)
    model.zero_grad()
    model.backward(G, cache)
    grads = grad_dict(model)
    want = {k.removeprefix("grad/"): v for k, v in ref.items() if k.startswith("grad/")}
    assert sorted(grads) == sorted(want)
    scale = max(np.abs(g).max() for g in want.values())
    for hf_name, g in want.items():
        assert grads[hf_name].shape == g.shape, hf_name
        if hf_name.endswith("attention.self.key.bias"):  # exactly 0: softmax(s + q.bk) =
            assert np.abs(grads[hf_name] - g).max() < 1e-12 * scale  # softmax(s)
        else:
            assert rel_err(grads[hf_name], g) < 1e-8, hf_name


def test_token_types_default_to_zero_and_attention_looks_both_ways():
    ref = expected("bert")
    model = load_pretrained(HF / "bert", dtype=np.float64)
    ids = ref["input_ids"]
    zeros, _ = model.forward(input_ids=ids, token_type_ids=np.zeros_like(ids))
    assert np.array_equal(model.forward(input_ids=ids)[0], zeros)
    changed = ids.copy()
    changed[:, -1] = (changed[:, -1] + 1) % flat_of(model.cfg).vocab_size
    moved = np.abs(model.forward(input_ids=changed)[0] - zeros).max(axis=-1)  # (B, T)
    assert (moved[:, 0] > 0).all()  # the first token sees the last one


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
    config = json.loads((HF / name / "config.json").read_text())
    assert {k: v for k, v in written.items() if k != "transformers_version"} == {
        k: v for k, v in config.items() if k != "transformers_version"}
    # the generator loaded scratchllm's save with from_pretrained: float32 rounding only
    assert expected(name)["saved_by_scratchllm_rel_err"] < 1e-5


@pytest.mark.parametrize("field, value, match", [
    ("tie_word_embeddings", False, "tie_word_embeddings = False"),
    ("position_embedding_type", "relative_key", "position_embedding_type"),
    ("is_decoder", True, "is_decoder"), ("hidden_act", "relu", "hidden_act = 'relu'")])
def test_options_the_library_cannot_model_are_refused_by_name(field, value, match, tmp_path):
    d = tmp_path / "bert"
    shutil.copytree(HF / "bert", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, field: value}))
    with pytest.raises(ValueError, match=match):
        load_pretrained(d)


def test_masked_lm_refuses_causal_layers_and_decoding_and_bad_token_types():
    with pytest.raises(ValueError, match="causal attention"):
        MaskedLM(preset("dense", vocab_size=11, d_model=8, n_layers=1, n_heads=2,
                        n_kv_heads=1, d_ff=8), rng=np.random.default_rng(0))
    model = load_pretrained(HF / "bert", dtype=np.float64)
    with pytest.raises(ValueError, match="no token-by-token decoding"):
        model.init_state(1, 4)
    ids = expected("bert")["input_ids"]
    with pytest.raises(ValueError, match="token_type_ids"):
        model.forward(input_ids=ids, token_type_ids=ids[:, :3])


def test_a_bert_shaped_config_saves_only_as_bert(tmp_path):
    """A causal LM config is never claimed by bert, and bert's check names what differs."""
    cfg = load_pretrained(HF / "bert").cfg
    causal = dataclasses.replace(preset("dense", vocab_size=11, d_model=8, n_layers=1,
                                        n_heads=2, n_kv_heads=2, d_ff=8), name="bert")
    model = LM(causal, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="bert checkpoint only with .*causal=False"):
        save_pretrained(model, tmp_path)
    assert flat_of(cfg).mlm_head and not flat_of(cfg).causal


def test_a_tf_era_checkpoint_loads_with_gamma_beta_pooler_and_nsp_head(tmp_path):
    """google-bert/bert-base-uncased's names: LayerNorm.gamma / .beta, plus the pooler and the
    next-sentence head of BertForPreTraining, and the tied decoder saved anyway: the same
    model as the fixture, and a save writes transformers' names."""
    d = tmp_path / "tf_era"
    shutil.copytree(HF / "bert", d)
    tensors = load_file(d / "model.safetensors")
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias",
                                                                     "LayerNorm.beta"): v
           for k, v in tensors.items()}
    D = tensors["bert.embeddings.LayerNorm.weight"].shape[0]
    old.update({"bert.pooler.dense.weight": np.zeros((D, D), np.float32),
                "bert.pooler.dense.bias": np.zeros(D, np.float32),
                "cls.seq_relationship.weight": np.zeros((2, D), np.float32),
                "cls.seq_relationship.bias": np.zeros(2, np.float32),
                "cls.predictions.decoder.weight": tensors[
                    "bert.embeddings.word_embeddings.weight"]})
    save_file(old, d / "model.safetensors")
    ref = expected("bert")
    model = load_pretrained(d, dtype=np.float64)
    logits, _ = model.forward(input_ids=ref["input_ids"], token_type_ids=ref["token_type_ids"])
    assert rel_err(logits, ref["logits"]) < 1e-9
    save_pretrained(model, tmp_path / "saved")
    assert sorted(load_file(tmp_path / "saved" / "model.safetensors")) == sorted(tensors)
