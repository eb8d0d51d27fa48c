"""Mixtral and DeepSeek-V3 checkpoints beyond what test_pretrained.py checks for every family:
the presets saved as these families (recorded by tools/make_hf_fixtures_moe.py), what
DeepSeek-V3's layers are made of, its selection-only bias and latent decoding state, and the
errors for options the families cannot express. No torch here."""
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scratchllm.attention.kv_state import LatentKVState
from scratchllm.hub import flat_of, grad_dict, load_pretrained, save_pretrained, state_dict
from scratchllm.lm import LM, preset
from scratchllm.moe import MoE
from hub_fixtures import HF, rel_err


@pytest.mark.parametrize("name,family", [("moe", "mixtral"), ("mla", "deepseek_v3")])
def test_presets_saved_load_in_transformers(name, family):
    """tests/fixtures/hf/{moe,mla} were written by save_pretrained of the tiny presets and
    their logits computed by transformers after from_pretrained (no missing or unexpected
    tensors; float32 logits within 1e-5 of float64); the same preset saved now gives the same
    bytes, and load_pretrained of the directory gives transformers' float64 logits."""
    ref = dict(np.load(HF / name / "expected.npz"))
    assert ref["from_pretrained_float32_rel_err"] < 1e-5
    model = load_pretrained(HF / name, dtype=np.float64)
    assert flat_of(model.cfg).name == family
    assert rel_err(model.forward(ref["ids"])[0], ref["logits"]) < 1e-9
    fields = json.loads(str(ref["preset"]))
    fresh = LM(preset(name, **fields), rng=np.random.default_rng(0))
    if name == "mla":  # the generator's selection biases: N(0, 0.1^2) from default_rng(2)
        E = fields["n_experts"]
        for layer, b in zip(fresh.layers, 0.1 * np.random.default_rng(2).standard_normal(
                (fields["n_layers"], E))):
            layer.ffn.selection_bias[...] = b
    committed = load_file(HF / name / "model.safetensors")
    assert sorted(state_dict(fresh)) == sorted(committed)
    for hf_name, array in state_dict(fresh).items():
        assert np.array_equal(committed[hf_name], array), hf_name


def test_mla_preset_keeps_its_selection_bias_as_the_correction_bias():
    """The aux-loss-free bias update has no config field (nothing of it in config.json); the
    bias it leaves is e_score_correction_bias, loaded back as the selection bias."""
    hf = json.loads((HF / "mla" / "config.json").read_text())
    assert not {"bias_gamma", "balance_coef", "z_coef"} & set(hf)
    model = load_pretrained(HF / "mla")
    assert flat_of(model.cfg).bias_gamma == 0.0
    committed = load_file(HF / "mla" / "model.safetensors")
    for i, layer in enumerate(model.layers):
        bias = committed[f"model.layers.{i}.mlp.gate.e_score_correction_bias"]
        assert np.abs(bias).min() > 0 and np.array_equal(layer.ffn.selection_bias, bias)


def test_deepseek_v3_layers():
    """first_k_dense_replace = 1: layer 0 a dense SwiGLU of intermediate_size, the others MoE
    with moe_intermediate_size experts and a shared expert; q_lora_rank or a plain q_proj."""
    model = load_pretrained(HF / "deepseek_v3")
    assert [isinstance(layer.ffn, MoE) for layer in model.layers] == [False, True, True]
    assert model.layers[0].ffn.W1.data.shape == (16, 24)
    moe = model.layers[1].ffn
    assert moe.w1.data.shape == (8, 16, 8) and moe.shared_w1.data.shape == (16, 8)
    r = moe.spec.router
    assert (r.n_group, r.topk_group, r.norm_topk_prob, r.routed_scaling_factor) == (4, 2, True,
                                                                                   2.5)
    assert model.layers[0].mixer.wq_a.data.shape == (16, 12)
    plain = load_pretrained(HF / "deepseek_v3_plain")
    assert plain.layers[0].mixer.wq.data.shape == (16, 4 * 8)
    assert flat_of(plain.cfg).rope_style == "half"
    assert flat_of(model.cfg).rope_style == "interleaved"
    assert plain.layers[0].ffn.shared_w1.data.shape == (16, 16)  # 2 shared experts


def test_correction_bias_selects_only():
    """The loaded bias is the file's e_score_correction_bias; it has no gradient entry; and it
    does change the routing (so the fixture checks it): without it the logits move."""
    ref = dict(np.load(HF / "deepseek_v3" / "expected.npz"))
    model = load_pretrained(HF / "deepseek_v3", dtype=np.float64)
    tensors = load_file(HF / "deepseek_v3" / "model.safetensors")
    bias = model.layers[1].ffn.selection_bias
    assert np.array_equal(bias, tensors["model.layers.1.mlp.gate.e_score_correction_bias"])
    logits, cache = model.forward(ref["ids"])
    model.backward(np.ones_like(logits), cache)
    assert not any(k.endswith("e_score_correction_bias") for k in grad_dict(model))
    for layer in model.layers[1:]:
        layer.ffn.selection_bias[...] = 0
    assert rel_err(model.forward(ref["ids"])[0], ref["logits"]) > 1e-3


def test_deepseek_v3_decodes_from_the_latent_state():
    """Each layer's decoding state holds kv_lora_rank + qk_rope_head_dim numbers per token."""
    model = load_pretrained(HF / "deepseek_v3", dtype=np.float64)
    state = model.init_state(1, 12)
    assert all(isinstance(s, LatentKVState) for s in state)
    assert state[0].latents.shape == (1, 12, 8 + 4)


def _moe(**overrides):
    return LM(preset("moe", vocab_size=11, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1,
                     d_ff=8, n_experts=4, top_k=2, **overrides), rng=np.random.default_rng(0))


@pytest.mark.parametrize("model,named", [
    (lambda: _moe(n_shared=1), "n_shared=1"),
    (lambda: _moe(capacity_factor=1.25), "capacity_factor=1.25"),
    (lambda: _moe(bias_gamma=1e-3), "bias_gamma=0.001"),
    (lambda: _moe(moe_every=2), "moe_every=2"),
    (lambda: _moe(score="sigmoid", norm_topk_prob=False), "score='sigmoid', norm_topk_prob"),
    (lambda: LM(preset("mla", vocab_size=11, d_model=8, n_layers=1, n_heads=2, d_ff=8,
                       mla_norm_eps=1e-5), rng=np.random.default_rng(0)), "mla_norm_eps=1e-05"),
    (lambda: LM(preset("mla", vocab_size=11, d_model=8, n_layers=1, n_heads=2, d_ff=8,
                       norm_eps=1e-6, n_shared=0), rng=np.random.default_rng(0)), "n_shared=0"),
])
def test_save_names_the_option_the_family_cannot_express(model, named, tmp_path):
    with pytest.raises(ValueError, match=f"cannot express {named}"):
        save_pretrained(model(), tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("field,value", [("attention_bias", True),
                                         ("hidden_act", "gelu"), ("n_shared_experts", 0)])
def test_deepseek_v3_config_errors_name_the_field(field, value, tmp_path):
    d = tmp_path / "ds"
    shutil.copytree(HF / "deepseek_v3", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, field: value}))
    with pytest.raises(ValueError, match=f"{field} = {value!r}"):
        load_pretrained(d)


def test_mixtral_expert_tensor_shape_error_names_it(tmp_path):
    d = tmp_path / "mx"
    shutil.copytree(HF / "mixtral", d)
    tensors = load_file(d / "model.safetensors")
    name = "model.layers.1.block_sparse_moe.experts.3.w2.weight"
    tensors[name] = np.ascontiguousarray(tensors[name].T)
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match=f"'{name}' has shape"):
        load_pretrained(d)
