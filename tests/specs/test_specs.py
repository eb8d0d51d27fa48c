"""The specs: validation beside each spec, flat names <-> specs both ways, config dicts."""
import dataclasses
import json

import pytest

from scratchllm.specs import (PRESETS, AttentionSpec, LayerSpec, Mask, ModelConfig, MoESpec,
                              RopeSpec, RouterSpec, from_dict, from_flat, preset, to_dict)
from scratchllm.specs.unflat import flat_view, to_flat

FLAT_CASES = [
    dict(), dict(window=8, n_sink=2),
    dict(layer_types=["sliding_attention", "full_attention"] * 2, window=8,
         rope_local_base=2e4, rope_scaling={"rope_type": "linear", "factor": 2.0}),
    dict(ffn="moe", first_k_dense=1, dense_d_ff=99, n_shared=2),
    dict(ffn="moe", moe_every=2, moe_offset=0),
    dict(positions="learned", norm="layernorm", ffn="gelu_mlp", qkv_bias=True, o_bias=True,
         tie_embeddings=True),
    dict(positions="alibi"), dict(positions="nope"), dict(positions="sinusoidal"),
    dict(block="sandwich", norm_offset=1.0, embed_scale=True, ffn="geglu", head_dim=48,
         qk_norm=True, attn_scale=0.1),
    dict(layer_pattern="MMMM", ffn="none", mamba_inner_norms=True, dt_rank=3),
    dict(ffn="moe", experts="clamped", router_bias=True, attn_sinks=True),
    dict(attn_output_gate=True, qk_norm=True, norm_offset=1.0, rope_partial=0.25),
    dict(layer_pattern="NNAN", attn_output_gate=True, gdn_k_heads=1, gdn_v_heads=2, d_conv=3,
         ffn="moe", shared_gate=True, n_shared=2, norm_eps=1e-6),
] + [dict(PRESETS[name]) for name in sorted(PRESETS)]


@pytest.mark.parametrize("flat", FLAT_CASES)
def test_flat_names_round_trip(flat):
    cfg = from_flat(**flat)
    assert from_flat(**to_flat(cfg)) == cfg


@pytest.mark.parametrize("flat", FLAT_CASES)
def test_config_dict_round_trips_through_json(flat):
    cfg = from_flat(**flat)
    assert from_dict(json.loads(json.dumps(to_dict(cfg)))) == cfg


def test_a_flat_dict_of_the_first_format_still_loads():
    written = dataclasses.asdict(flat_view(preset("swa")))  # every flat field, as it was saved
    assert from_dict(written) == preset("swa")


def test_a_config_saved_before_attention_scores_had_a_spec_still_loads():
    """AttentionSpec's impl, block and softcap moved into AttentionSpec.scores (a ScoresSpec);
    a config.json written before keeps them beside the other fields and loads the same."""
    cfg = preset("dense", attn_impl="flash")
    d = to_dict(cfg)
    for spec in d["specs"].values():
        scores = spec["mixer"].pop("scores")
        spec["mixer"].update({k: v for k, v in scores.items() if k != "spec"})
    assert "impl" in d["specs"]["0"]["mixer"]
    assert from_dict(json.loads(json.dumps(d))) == cfg
    d["specs"]["0"]["mixer"]["scores"] = {"spec": "ScoresSpec"}
    with pytest.raises(ValueError, match="AttentionSpec gives .*'impl'.* and 'scores'"):
        from_dict(d)


@pytest.mark.parametrize("d, missing", [
    ({}, "'vocab_size', 'd_model', 'n_layers', 'n_heads'"),
    ({"name": "swa", "window": 32}, "'vocab_size', 'd_model', 'n_layers', 'n_heads'"),
    ({"format": 2}, "'norm', 'specs', 'layers'"),
    ({"format": 2, "norm": {}, "specs": {}}, "'layers'")])
def test_a_config_dict_without_its_identity_is_an_error_not_a_default_model(d, missing):
    with pytest.raises(ValueError, match=rf"config: .* must give .*; missing \[{missing}\]"):
        from_dict(d)


def test_a_newer_format_is_refused_by_name():
    with pytest.raises(ValueError, match="format 3 is not one this version reads"):
        from_dict(dict(to_dict(preset("dense")), format=3))


def test_identical_layers_are_written_once():
    d = to_dict(preset("hybrid"))
    assert len(d["specs"]) == 2 and d["layers"] == ["0", "1", "0", "1"]


def test_preset_maps_flat_overrides_into_the_specs():
    cfg = preset("swa", d_model=64, n_heads=8, n_kv_heads=4, attn_sinks=True)
    a = cfg.layers[0].mixer
    assert (cfg.d_model, a.n_heads, a.n_kv_heads, a.sinks) == (64, 8, 4, True)
    assert a.mask == Mask(window=32, n_sink=4)


def test_layer_types_pick_window_and_local_rope_per_layer():
    cfg = from_flat(layer_types=["sliding_attention", "full_attention"] * 2, window=8,
                    rope_local_base=2e4, rope_scaling={"rope_type": "linear", "factor": 2.0})
    local, full = cfg.layers[0].mixer, cfg.layers[1].mixer
    assert local.mask.window == 8 and local.rope == RopeSpec(2e4)
    assert full.mask.window is None and full.rope.scaling == {"rope_type": "linear",
                                                              "factor": 2.0}


def test_moe_layers_follow_first_k_dense_and_moe_every():
    cfg = from_flat(ffn="moe", n_layers=6, first_k_dense=1, moe_every=2, dense_d_ff=50)
    kinds = [type(layer.ffn).__name__ for layer in cfg.layers]
    assert kinds == ["FFNSpec", "MoESpec", "FFNSpec", "MoESpec", "FFNSpec", "MoESpec"]
    assert cfg.layers[0].ffn.d_ff == 50


def test_a_config_without_a_flat_form_is_refused():
    odd = dataclasses.replace(preset("dense"), layers=(
        LayerSpec(AttentionSpec(n_heads=4)), LayerSpec(AttentionSpec(n_heads=8, n_kv_heads=4))))
    with pytest.raises(ValueError, match="has no flat form"):
        to_flat(odd)


@pytest.mark.parametrize("make, message", [
    (lambda: from_flat(bogus=1), r"unknown field\(s\) \['bogus'\]"),
    (lambda: from_flat(n_heads=0), "AttentionSpec: n_heads must be an integer >= 1, got 0"),
    (lambda: from_flat(vocab_size=True), "vocab_size must be an integer >= 1, got True"),
    (lambda: from_flat(n_heads=4, n_kv_heads=3), "must be a multiple of n_kv_heads=3"),
    (lambda: from_flat(d_model=130), "d_model=130 must be divisible by n_heads=4"),
    (lambda: from_flat(layer_pattern="AXAA"), "layer_pattern must be 4 letters"),
    (lambda: from_flat(window=0), "window must be None or an integer >= 1, got 0"),
    (lambda: from_flat(n_sink=2), "n_sink=2 needs a window"),
    (lambda: from_flat(ffn="moe", top_k=9), "top_k=9 must be <= n_experts=8"),
    (lambda: from_flat(ffn="moe", capacity_factor=0), "capacity_factor must be > 0"),
    (lambda: from_flat(norm_eps=float("nan")), "eps must be a finite number"),
    (lambda: from_flat(attention="mla", window=4), "attention='mla' supports"),
    (lambda: from_flat(positions="alibi", rope_style="interleaved"), "act only through RoPE"),
    (lambda: RopeSpec(style="left"), "style must be one of"),
    (lambda: Mask(window=4, causal=False), "window=4 needs causal=True"),
    (lambda: RouterSpec(n_experts=6, n_group=4), "n_group=4 must divide n_experts=6"),
    (lambda: MoESpec(router="softmax"), "router must be a RouterSpec"),
    (lambda: ModelConfig(layers=[LayerSpec()]), "layers must be a non-empty tuple"),
])
def test_bad_values_are_refused_naming_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_specs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset("dense").layers[0].mixer.n_heads = 8
