"""gpt-oss beyond test_pretrained's five checks (logits, every gradient, greedy ids with
cached == full, bit-identical save/load, saved checkpoint read by transformers): the grads
case of the whole loaded model, the options its config turns on, the fixture exercising the
clamps and the sinks, flash attention on the loaded model, and config round trips."""
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.hub import (config_from_flat, family_for, family_named, flat_of, load_pretrained,
                            read_hf_config)
from scratchllm.lm import LM

D = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "gpt_oss"
GPT_OSS = family_named("gpt_oss")


def test_whole_loaded_model_passes_its_gradient_check():
    report = CASES["hub_gpt_oss"](np.random.default_rng(0))
    assert report.ok, f"\n{report}"


def test_config_turns_on_every_gpt_oss_option():
    cfg = flat_of(load_pretrained(D).cfg)
    assert (cfg.name, cfg.ffn, cfg.experts, cfg.router_bias, cfg.attn_sinks) == (
        "gpt_oss", "moe", "clamped", True, True)
    assert cfg.layer_types == ["sliding_attention", "full_attention"] and cfg.window == 4
    assert cfg.qkv_bias and cfg.o_bias and (cfg.n_experts, cfg.top_k) == (4, 2)
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.rope_scaling["truncate"] is False
    assert (cfg.swiglu_limit, cfg.balance_coef, cfg.z_coef) == (1.2, 0.0, 0.0)
    model = load_pretrained(D)
    assert [m.mixer.spec.mask.window for m in model.layers] == [4, None]
    assert all(np.abs(m.mixer.sinks.data).max() > 0.1 for m in model.layers)


def test_the_fixture_binds_the_clamps_on_both_sides():
    """The experts' gate and up pre-activations of the fixture's forward pass the limit (the
    clamp's kinks are inside the compared gradients), recomputed here from the weights."""
    model = load_pretrained(D, dtype=np.float64)
    ids = np.load(D / "expected.npz")["ids"]
    x = model.layers[0].norm1.forward(model.embed.forward(ids)[0])[0]  # (B, T, D)
    ffn = model.layers[0].ffn
    h = x.reshape(-1, x.shape[-1]) @ ffn.gate_up.data + ffn.gate_up_b.data[:, None]  # (E,BT,2F)
    gate, up = h[..., ::2], h[..., 1::2]
    limit = flat_of(model.cfg).swiglu_limit
    assert (gate > limit).mean() > 0.05 and (up > limit).mean() > 0.05
    assert (up < -limit).mean() > 0.05


def test_flash_attention_on_the_loaded_model_equals_sdpa():
    ref = load_pretrained(D, dtype=np.float64)
    cfg = config_from_flat({**dataclasses.asdict(flat_of(ref.cfg)), "attn_impl": "flash"})
    flash = LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    for p, q in zip(ref.parameters(), flash.parameters()):
        q.data = p.data
    ids = np.load(D / "expected.npz")["ids"]
    np.testing.assert_allclose(flash.forward(ids)[0], ref.forward(ids)[0], rtol=0, atol=1e-12)


def test_config_round_trip_and_refusals():
    cfg = config_from_flat(GPT_OSS.from_hf(read_hf_config(D)))
    assert config_from_flat(GPT_OSS.from_hf(GPT_OSS.to_hf(flat_of(cfg), "float32"))) == cfg
    assert family_for(flat_of(cfg)) is GPT_OSS
    with pytest.raises(ValueError, match="attn_sinks=True"):
        family_for(dataclasses.replace(flat_of(cfg), attn_sinks=False))
    with pytest.raises(ValueError, match="missing field"):
        GPT_OSS.from_hf({"model_type": "gpt_oss"})


def test_transformers_defaults_apply_when_fields_are_absent():
    """configuration_gpt_oss.py: layer_types alternate from sliding, YaRN factor 32 with
    truncate false over 4096 positions, theta 150000, biases on."""
    cfg = GPT_OSS.from_hf(dict(model_type="gpt_oss", vocab_size=10, hidden_size=8,
                              intermediate_size=8, num_hidden_layers=3, num_attention_heads=2))
    assert cfg["layer_types"] == ["sliding_attention", "full_attention", "sliding_attention"]
    assert cfg["rope_base"] == 150000.0 and cfg["rope_scaling"] == dict(
        rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False,
        original_max_position_embeddings=4096)
    assert (cfg["window"], cfg["n_experts"], cfg["top_k"], cfg["head_dim"]) == (128, 128, 4, 64)
