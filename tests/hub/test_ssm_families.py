"""The Mamba and Jamba families beyond the shared fixture tests of test_pretrained.py: their
config.json fields, the hybrid preset saved as a Jamba checkpoint (checked against
transformers by tools/make_hf_fixtures_ssm.py), and the errors naming what cannot be read or
written. No torch here."""
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from scratchllm.hub import (config_from_flat, family_named, flat_of, load_pretrained,
                            save_pretrained, state_dict)
from scratchllm.lm import LM, preset
from scratchllm.specs import MoESpec
from hub_fixtures import HF, rel_err

HYBRID = dict(d_model=16, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=24, n_experts=4, top_k=2,
              d_state=4, dt_rank=3)  # tools/make_hf_fixtures_ssm.py's HYBRID sizes
JAMBA_OPTIONS = dict(positions="nope", mamba_inner_norms=True, norm_topk_prob=False)


def test_jamba_layer_periods_and_offsets():
    """Attention at i % 2 == 0, MoE at i % 3 == 1 (the jamba fixture's config.json)."""
    jamba = family_named("jamba")
    f = flat_of(config_from_flat(jamba.from_hf(json.loads((HF / "jamba" / "config.json")
                                                          .read_text()))))
    assert f.layer_pattern == "AMAMA"
    assert (f.ffn, f.moe_every, f.moe_offset, f.first_k_dense) == ("moe", 3, 1, 0)
    assert (f.positions, f.norm_topk_prob, f.mamba_inner_norms) == ("nope", False, True)
    hf = jamba.to_hf(f, "float32")
    assert (hf["attn_layer_period"], hf["attn_layer_offset"]) == (2, 0)
    assert (hf["expert_layer_period"], hf["expert_layer_offset"]) == (3, 1)


def test_mamba_defaults_and_fields_without_effect():
    """time_step_rank "auto" is ceil(D / 16); residual_in_fp32 and the time_step_* init fields
    change nothing in float32/float64 and are accepted."""
    fields = family_named("mamba").from_hf(dict(model_type="mamba", vocab_size=50, hidden_size=40,
                                 num_hidden_layers=3, time_step_rank="auto",
                                 residual_in_fp32=False, time_step_min=0.01))
    assert (fields["dt_rank"], fields["layer_pattern"], fields["ffn"]) == (3, "MMM", "none")
    assert (fields["d_state"], fields["d_conv"], fields["norm_eps"]) == (16, 4, 1e-5)
    assert fields["tie_embeddings"] is True


@pytest.mark.parametrize("family, field, value", [
    ("mamba", "use_bias", True), ("mamba", "use_conv_bias", False),
    ("mamba", "hidden_act", "gelu"), ("jamba", "mamba_proj_bias", True),
    ("jamba", "mamba_conv_bias", False), ("jamba", "attn_layer_offset", 2)])
def test_unsupported_fields_are_named(family, field, value, tmp_path):
    d = tmp_path / family
    shutil.copytree(HF / family, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, field: value}))
    with pytest.raises(ValueError, match=f"config.json: {field} = {value!r}"):
        load_pretrained(d)


def test_hybrid_preset_saved_loads_in_transformers():
    """tests/fixtures/hf/hybrid_jamba was written by save_pretrained of the tiny hybrid preset
    with JAMBA_OPTIONS (seed 0), and its logits computed by transformers after
    from_pretrained (no missing or unexpected tensors); the preset saved now, as it is (those
    options are its own), gives the same bytes, and load_pretrained of it gives transformers'
    logits."""
    ref = dict(np.load(HF / "hybrid_jamba" / "expected.npz"))
    assert ref["from_pretrained_float32_rel_err"] < 1e-5
    model = load_pretrained(HF / "hybrid_jamba", dtype=np.float64)
    f = flat_of(model.cfg)
    assert (f.name, f.layer_pattern) == ("jamba", "MAMA")
    assert rel_err(model.forward(ref["ids"])[0], ref["logits"]) < 1e-9
    V = f.vocab_size
    assert preset("hybrid", **HYBRID) == preset("hybrid", **HYBRID, **JAMBA_OPTIONS)
    fresh = LM(preset("hybrid", vocab_size=V, **HYBRID), rng=np.random.default_rng(0))
    committed = load_file(HF / "hybrid_jamba" / "model.safetensors")
    saved = state_dict(fresh)
    assert sorted(saved) == sorted(committed)
    for name, array in saved.items():
        assert np.array_equal(committed[name], array), name


def test_hybrid_with_what_jamba_lacks_names_it(tmp_path):
    """RoPE, a Mamba without inner norms and renormalised gates have no Jamba field: the
    error names all three, and nothing is written."""
    lacks = dict(positions="rope", mamba_inner_norms=False, norm_topk_prob=True)
    model = LM(preset("hybrid", vocab_size=11, **HYBRID, **lacks), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="jamba checkpoint only with positions='nope', "
                                         "mamba_inner_norms=True.*norm_topk_prob=False"):
        save_pretrained(model, tmp_path)
    assert not (tmp_path / "model.safetensors").exists()


@pytest.mark.parametrize("overrides, match", [
    (dict(layer_pattern="AAMM"), "layers \\[0, 1\\] of 4 are attention"),
    (dict(layer_pattern="MSMA"), "layer_pattern 'MSMA'"),
    (dict(bias_gamma=1e-3), "bias_gamma=0.0"),
    (dict(layer_pattern="MMMM", ffn="none", mamba_inner_norms=True), "mamba checkpoint only "
                                                                      "with mamba_inner_norms")])
def test_save_refuses_what_the_families_cannot_express(overrides, match, tmp_path):
    model = LM(preset("hybrid", vocab_size=11, **{**HYBRID, **JAMBA_OPTIONS, **overrides}),
               rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=match):
        save_pretrained(model, tmp_path)


def test_moe_offset_is_validated():
    assert [isinstance(layer.ffn, MoESpec)
            for layer in preset("moe", moe_every=3, moe_offset=0).layers] == [
        True, False, False, True]
    with pytest.raises(ValueError, match="moe_offset must be None or an integer in \\[0, "
                                         "moe_every=2\\)"):
        preset("moe", moe_every=2, moe_offset=2)
