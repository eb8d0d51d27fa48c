"""The --quick runs of moe, experts and abf (slow tier), and the outcomes they are strong
enough to show. Thresholds from the quick runs at seed 0 (README's experiment table):
    experts  I(expert; class) 0.021 nats against I(expert; topic) 0.0002, and 0.007 before
             training: asserted > 3x the topic's and above the untrained router's
    abf      untouched RoPE: perplexity 15.2 at L0 -> 15.9 at 8 L0 (worse past the training
             length); every method's perplexity at 4 L0 falls when it continues there
    moe      at 120 steps dense_total is 0.067 below dense_active, the MoE between them by
             only 0.011 (not asserted: within a seed's spread); asserted: every loss falls,
             the total size helps a dense model, and the MoE's active parameters equal the
             dense_active model's within the router
"""
import json

import pytest

from scratchllm.experiments import run_experiment

pytestmark = pytest.mark.slow


def _quick(name, tmp_path):
    run_experiment(name, "quick", tmp_path, seed=0, log=lambda *a: None)
    return json.loads((tmp_path / "results.json").read_text())


def test_experts_route_by_class_more_than_by_topic(tmp_path):
    body = _quick("experts", tmp_path)
    assert body["mi_class"] > 3 * body["mi_topic"]
    assert body["mi_class"] > body["mi_class_init"]  # training sharpened it
    assert body["entropy"] < body["entropy_max"]


def test_abf_unscaled_rope_degrades_past_the_training_length(tmp_path):
    body = _quick("abf", tmp_path)
    L0 = body["config"]["train_len"]
    zero, ppl = body["ppl_zero_shot"], body["ppl"]
    assert zero["none"][str(8 * L0)] > zero["none"][str(L0)]
    for method in ("none", "pi", "yarn", "abf"):
        assert ppl[method][str(4 * L0)] < zero[method][str(4 * L0)], method


def test_moe_quick_run_trains_all_four(tmp_path):
    body = _quick("moe", tmp_path)
    for variant, curve in body["val_curve"].items():
        assert curve[-1][1] < curve[0][1], variant
    assert body["val_loss"]["dense_total"] < body["val_loss"]["dense_active"] - 0.02
    p = body["params"]
    assert abs(p["moe"]["active"] - p["dense_active"]["total"]) < 0.02 * p["moe"]["active"]
