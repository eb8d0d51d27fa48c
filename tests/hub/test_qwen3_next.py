"""Qwen3-Next beyond what test_pretrained.py checks for every family: what the loaded layers
are made of, that the output gate, the partial RoPE and the DeltaNet's decay really act on
the fixture's logits, the config fields it cannot read, the configs it cannot write, and a
preset-shaped hybrid saved as qwen3_next. No torch here."""
import dataclasses
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scratchllm.hub import (config_from_flat, family_for, family_named, flat_of, load_pretrained,
                            save_pretrained)
from scratchllm.hub.peft import LoRA
from scratchllm.lm import LM, preset
from scratchllm.linear_attention import GatedDeltaNet
from scratchllm.moe import MoE
from hub_fixtures import HF, expected, rel_err


def test_the_loaded_layers():
    model = load_pretrained(HF / "qwen3_next")
    f = flat_of(model.cfg)
    assert f.layer_pattern == "NANA" and (f.rope_partial, f.norm_offset) == (0.25, 1.0)
    assert [type(layer.mixer) is GatedDeltaNet for layer in model.layers] == [1, 0, 1, 0]
    assert [isinstance(layer.ffn, MoE) for layer in model.layers] == [False, True, True, True]
    gdn, attn, moe = model.layers[0].mixer, model.layers[1].mixer, model.layers[1].ffn
    assert (gdn.Wq.data.shape, gdn.Wv.data.shape, gdn.conv_w.data.shape) == (
        (16, 8), (16, 24), (40, 4))
    assert attn.spec.output_gate and attn.wg.data.shape == (16, 64)
    assert moe.shared_w1.data.shape == (16, 16) and moe.spec.shared_gate


def test_prefill_then_decode_equals_the_forward():
    """LM.prefill runs the gated DeltaNet layers in one chunked pass (their prefill), the
    attention layers filling their KV states; the next token decodes from there."""
    ids = expected("qwen3_next")["ids"]
    model = load_pretrained(HF / "qwen3_next", dtype=np.float64)
    full = model.forward(ids)[0]
    state = model.init_state(2, 9)
    np.testing.assert_allclose(model.prefill(ids[:, :8], state), full[:, :8], rtol=0,
                               atol=1e-12 * np.abs(full).max())
    assert rel_err(model.decode(ids[:, 8], state, 8), full[:, 8]) < 1e-12


@pytest.mark.parametrize("change", ["gate", "rope", "decay"])
def test_each_option_moves_the_logits(change):
    """Gate off (wg = 0: every gate 1/2 becomes 1), RoPE over whole heads, or no decay
    (A_log = -inf): each moves the logits far past the 1e-9 the fixture is matched to."""
    ref = expected("qwen3_next")
    model = load_pretrained(HF / "qwen3_next", dtype=np.float64)
    base = model.forward(ref["ids"])[0]
    if change == "gate":
        for layer in model.layers[1::2]:
            layer.mixer.wg.data[...] = 0
            layer.mixer.wo.data *= 2  # o sigmoid(0) wo 2 = o wo: the layer without its gate
    elif change == "decay":
        for layer in model.layers[0::2]:
            layer.mixer.A_log.data[...] = -np.inf  # g = 0: the plain delta rule
    else:
        for layer in model.layers[1::2]:
            layer.mixer.spec = dataclasses.replace(layer.mixer.spec, rope=dataclasses.replace(
                layer.mixer.spec.rope, partial=1.0))
    assert rel_err(model.forward(ref["ids"])[0], base) > 1e-3


@pytest.mark.parametrize("field, value", [
    ("mlp_only_layers", [1]), ("shared_expert_intermediate_size", 12),
    ("layer_types", ["sliding_attention"] * 4), ("hidden_act", "gelu"),
    ("rope_parameters", dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=2))])
def test_config_errors_name_the_field(field, value, tmp_path):
    d = tmp_path / "qwen3_next"
    shutil.copytree(HF / "qwen3_next", d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, field: value}))
    name = "partial_rotary_factor" if field == "rope_parameters" else field
    with pytest.raises(ValueError, match=f"{name} = "):
        load_pretrained(d)


def test_an_older_config_gives_its_pattern_by_interval(tmp_path):
    """Without layer_types, full_attention_interval n makes every n-th layer attention."""
    d = tmp_path / "qwen3_next"
    shutil.copytree(HF / "qwen3_next", d)
    cfg = json.loads((d / "config.json").read_text())
    del cfg["layer_types"]
    (d / "config.json").write_text(json.dumps({**cfg, "full_attention_interval": 2}))
    ref = expected("qwen3_next")
    model = load_pretrained(d, dtype=np.float64)
    assert rel_err(model.forward(ref["ids"])[0], ref["logits"]) < 1e-9


def test_the_mtp_tensors_of_published_checkpoints_are_read_past(tmp_path):
    """transformers ignores mtp.* on loading (its _keys_to_ignore_on_load_unexpected)."""
    d = tmp_path / "qwen3_next"
    shutil.copytree(HF / "qwen3_next", d)
    tensors = load_file(d / "model.safetensors")
    save_file({**tensors, "mtp.fc.weight": np.ones((16, 32), np.float32)},
              d / "model.safetensors")
    ref = expected("qwen3_next")
    assert rel_err(load_pretrained(d, dtype=np.float64).forward(ref["ids"])[0],
                   ref["logits"]) < 1e-9


def test_the_published_geometry_counts_transformers_parameters():
    """transformers' Qwen3NextConfig() (Qwen3-Next-80B-A3B: 48 layers, 512 experts) built on
    the meta device holds 79,674,391,296 parameters; the config its defaults give here counts
    the same."""
    hf = dict(model_type="qwen3_next", vocab_size=151936, hidden_size=2048,
              intermediate_size=5632, num_hidden_layers=48, num_attention_heads=16)
    cfg = config_from_flat(family_named("qwen3_next").from_hf(hf))
    assert flat_of(cfg).layer_pattern == "NNNA" * 12 and flat_of(cfg).rope_partial == 0.25
    assert cfg.n_params() == 79_674_391_296


def test_lora_refuses_the_interleaved_projections_by_name():
    """q_proj holds each head's query and output gate, in_proj_qkvz four arrays per key-head
    group: LoRA names them rather than leaving them out (the default targets are q_proj and v_proj)."""
    model = load_pretrained(HF / "qwen3_next")
    with pytest.raises(ValueError, match=r"LoRA: targets \['in_proj_qkvz', 'q_proj'\] are "
                                         r"projections this model keeps interleaved"):
        LoRA(model, 2, targets=("q_proj", "v_proj", "in_proj_qkvz"))
    assert len(LoRA(model, 2, targets=("v_proj", "out_proj")).sites) == 4


def _hybrid(**overrides):
    return preset("dense", **{**dict(
        vocab_size=11, d_model=16, n_layers=4, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=8,
        layer_pattern="NANA", attn_output_gate=True, qk_norm=True, norm_offset=1.0,
        gdn_k_heads=1, gdn_v_heads=2, gdn_k_head_dim=4, gdn_v_head_dim=4, ffn="moe",
        n_experts=4, shared_gate=True, n_shared=1), **overrides})


def test_a_hybrid_of_its_shape_saves_as_qwen3_next(tmp_path):
    model = LM(_hybrid(), rng=np.random.default_rng(0), dtype=np.float64)
    assert family_for(flat_of(model.cfg)).model_type == "qwen3_next"
    save_pretrained(model, tmp_path)
    again = load_pretrained(tmp_path, dtype=np.float64)
    ids = np.arange(6)[None] % 11
    assert rel_err(again.forward(ids)[0], model.forward(ids)[0]) < 1e-6  # float32 weights


@pytest.mark.parametrize("overrides, named", [
    (dict(attn_output_gate=False), "attn_output_gate=False"),
    (dict(norm_offset=0.0), "norm_offset=0.0"), (dict(n_shared=0, shared_gate=False),
                                                 "n_shared=0")])
def test_save_names_what_qwen3_next_cannot_express(overrides, named, tmp_path):
    model = LM(_hybrid(**overrides), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=f"qwen3_next cannot express .*{named}"):
        save_pretrained(model, tmp_path)
    assert not list(tmp_path.iterdir())
