"""Hugging Face checkpoints against transformers: the fixtures in tests/fixtures/hf/ were
computed by transformers in float64 (tools/make_hf_fixtures.py); here scratchllm must give
the same logits (1e-9 relative), the same gradient for every parameter (1e-8), the same
greedy tokens with cached decoding equal to the full forward, and bit-identical save/load.
No torch here."""
import json
import shutil

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scratchllm.hub import flat_of, grad_dict, load_pretrained, save_pretrained, state_dict
from scratchllm.lm import LM, preset
from hub_fixtures import HF, expected, rel_err

FAMILIES = ["llama", "llama_yarn", "llama_linear", "llama_dynamic", "mistral", "qwen2", "qwen3",
            "gemma3", "gpt2",
            "mamba", "jamba"]  # tools/make_hf_fixtures_ssm.py
FAMILIES += ["gpt_oss"]  # sinks, sliding/full layer_types, biased router, clamped experts
FAMILIES += ["mixtral", "deepseek_v3", "deepseek_v3_plain"]  # tools/make_hf_fixtures_moe.py
FAMILIES += ["olmo2", "gemma2", "qwen3_moe", "qwen3_moe_step", "deepseek_v2",
             "deepseek_v2_lite", "mamba2", "mamba2_groups"]  # tools/make_hf_fixtures_causal.py
FAMILIES += ["llama4_text"]  # chunks, NoPE, L2 QK-norm, input-gated MoE (same tool)
FAMILIES += ["deepseek_v32"]  # MLA with the lightning indexer's top-k keys (same tool)
FAMILIES += ["rwkv"]  # RWKV-4: time mix + channel mix (its decoding state), pre_ln
FAMILIES += ["qwen3_next"]  # gated DeltaNet + gated attention (make_hf_fixtures_qwen3_next.py)
FAMILIES += [pytest.param("qwen3_next_dense", marks=pytest.mark.slow)]  # biases, dense, r = 1
FAMILIES += [pytest.param("llama4_text_plain", marks=pytest.mark.slow)]  # llama3 RoPE, top-2
FAMILIES += [pytest.param("rwkv_rescale", marks=pytest.mark.slow)]  # rescale_every 2 of 3


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers(family):
    ref = expected(family)
    model = load_pretrained(HF / family, dtype=np.float64)
    logits, _ = model.forward(input_ids=ref["ids"])  # (B, T, V), transformers' keyword
    assert rel_err(logits, ref["logits"]) < 1e-9


@pytest.mark.parametrize("family", FAMILIES)
def test_every_gradient_matches_transformers(family):
    """d sum(logits * G) / d every parameter, HF names and layouts (grad_dict)."""
    ref = expected(family)
    model = load_pretrained(HF / family, dtype=np.float64)
    logits, cache = model.forward(ref["ids"])
    G = np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape)  # (B, T, V)
    model.backward(G, cache)
    grads = grad_dict(model)
    want = {k.removeprefix("grad/"): v for k, v in ref.items() if k.startswith("grad/")}
    assert sorted(grads) == sorted(want)
    for name, g in want.items():
        assert grads[name].shape == g.shape, name
        if not g.any():  # DeepSeek-V3.2's indexer: a top-k choice passes no gradient
            assert not grads[name].any(), name
            continue
        assert rel_err(grads[name], g) < 1e-8, name


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_ids_and_cached_decoding(family):
    """Greedy decoding through the decoding states gives transformers' ids; at every step the
    decoded logits equal the last row of a full forward over the sequence so far. Dynamic
    NTK RoPE is the exception past max_position_embeddings (8 in that fixture): there a full
    forward rotates every key with the current length's base, while decoding (here as in
    transformers' cache) keeps the keys rotated with the base of their own step."""
    ref = expected(family)
    model = load_pretrained(HF / family, dtype=np.float64)
    seq = [int(t) for t in ref["ids"][0, :5]]
    n_new = len(ref["greedy"])
    state = model.init_state(1, len(seq) + n_new)
    for pos, t in enumerate(seq):
        logits = model.decode(np.array([t]), state, pos)  # (1, V)
    scaling = flat_of(model.cfg).rope_scaling or {}
    for _ in range(n_new):
        full, _ = model.forward(np.array([seq]))  # (1, t, V)
        grown = scaling.get("rope_type") == "dynamic" and len(seq) > scaling[
            "original_max_position_embeddings"]
        assert (rel_err(logits[0], full[0, -1]) < 1e-10) != grown
        seq.append(int(np.argmax(logits[0])))
        logits = model.decode(np.array(seq[-1:]), state, len(seq) - 1)
    assert seq[5:] == ref["greedy"].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_is_bit_identical(family, tmp_path):
    model = load_pretrained(HF / family)
    save_pretrained(model, tmp_path)
    again = state_dict(load_pretrained(tmp_path))
    original = load_file(HF / family / "model.safetensors")
    saved = load_file(tmp_path / "model.safetensors")
    for name, array in state_dict(model).items():
        assert again[name].dtype == array.dtype and np.array_equal(again[name], array), name
        assert np.array_equal(saved[name], original[name]), name
    assert sorted(saved) == sorted(original)


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_checkpoints_loaded_by_transformers(family):
    """The generator saved each checkpoint with scratchllm's save_pretrained, loaded it with
    transformers' from_pretrained (float32, no missing or unexpected tensors) and recorded
    how far its logits were from the float64 reference: float32 rounding only."""
    assert expected(family)["saved_by_scratchllm_rel_err"] < 1e-5


def test_dense_preset_saved_loads_in_transformers():
    """tests/fixtures/hf/dense was written by save_pretrained of the tiny dense preset (seed 0)
    and its logits computed by transformers after from_pretrained; the same preset saved now
    gives the same bytes, and load_pretrained of it gives transformers' logits."""
    ref = dict(np.load(HF / "dense" / "expected.npz"))
    model = load_pretrained(HF / "dense", dtype=np.float64)
    f = flat_of(model.cfg)
    assert f.name == "llama"
    assert rel_err(model.forward(ref["ids"])[0], ref["logits"]) < 1e-9
    V = f.vocab_size
    fresh = LM(preset("dense", vocab_size=V, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2,
                      d_ff=40), rng=np.random.default_rng(0))
    committed = load_file(HF / "dense" / "model.safetensors")
    for name, array in state_dict(fresh).items():
        assert np.array_equal(committed[name], array), name


def _copy(tmp_path, family="qwen2"):
    d = tmp_path / family
    shutil.copytree(HF / family, d)
    return d


def test_bfloat16_float16_and_shards_load(tmp_path):
    """Weights stored as bfloat16 and float16 across two shards with an index file load as the
    float32 weights rounded to those types."""
    tensors = load_file(HF / "llama" / "model.safetensors")
    d = tmp_path / "sharded"
    d.mkdir()
    shutil.copy(HF / "llama" / "config.json", d)
    names = sorted(tensors)
    half = {n: (ml_dtypes.bfloat16 if i % 2 else np.float16) for i, n in enumerate(names)}
    shards = {"a.safetensors": names[:7], "b.safetensors": names[7:]}
    for file, part in shards.items():
        save_file({n: tensors[n].astype(half[n]) for n in part}, d / file)
    index = {"metadata": {}, "weight_map": {n: f for f, part in shards.items() for n in part}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    loaded = state_dict(load_pretrained(d))
    for n in names:
        assert np.array_equal(loaded[n], tensors[n].astype(half[n]).astype(np.float32)), n


def test_errors_name_the_field_or_tensor(tmp_path):
    with pytest.raises(ValueError, match="not a Hugging Face checkpoint"):
        load_pretrained(tmp_path)
    d = _copy(tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "opt"}))
    with pytest.raises(ValueError, match="model_type 'opt' is not supported"):
        load_pretrained(d)
    (d / "config.json").write_text(json.dumps({**cfg, "hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="hidden_act = 'gelu'"):
        load_pretrained(d)
    (d / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(d / "model.safetensors")
    gone = dict(tensors)
    del gone["model.layers.1.self_attn.k_proj.bias"]
    save_file(gone, d / "model.safetensors")
    with pytest.raises(ValueError, match="model.layers.1.self_attn.k_proj.bias.*missing"):
        load_pretrained(d)
    save_file({**tensors, "model.layers.2.mlp.up_proj.weight": tensors[
        "model.layers.1.mlp.up_proj.weight"]}, d / "model.safetensors")
    with pytest.raises(ValueError, match="unexpected.*model.layers.2.mlp.up_proj.weight"):
        load_pretrained(d)
    bad = dict(tensors)
    bad["model.layers.0.mlp.down_proj.weight"] = bad["model.layers.0.mlp.down_proj.weight"].T
    save_file({k: np.ascontiguousarray(v) for k, v in bad.items()}, d / "model.safetensors")
    with pytest.raises(ValueError, match="'model.layers.0.mlp.down_proj.weight' has shape"):
        load_pretrained(d)


def test_save_refuses_a_model_no_family_covers(tmp_path):
    model = LM(preset("linear", vocab_size=11, d_model=8, n_layers=4, n_heads=2, n_kv_heads=1,
                      d_ff=8), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="save_pretrained: config 'linear'"):
        save_pretrained(model, tmp_path)
    assert not (tmp_path / "model.safetensors").exists()
