"""The --quick runs of the memory experiments (recall, needle, sinks) and of early exit show what
the chapters predict, where the quick run is strong enough to show it (slow tier: about a minute
each on 2 cores)."""
import json

import pytest

from scratchllm.experiments import run_experiment

pytestmark = pytest.mark.slow


def _quick(name, tmp_path):
    run_experiment(name, "quick", tmp_path, seed=0, log=lambda *a: None)
    return json.loads((tmp_path / "results.json").read_text())


def test_attention_beats_mamba_and_linear_attention_on_recall_at_the_longest_length(tmp_path):
    body = _quick("recall", tmp_path)
    acc = body["accuracy"]
    T = max(acc["attention"], key=int)
    assert acc["attention"][T] > 0.6, acc["attention"]  # attention has learned to recall
    for model in ("mamba", "linear"):
        assert acc["attention"][T] > acc[model][T] + 0.2, (model, acc[model])
    state = body["state_bytes"]
    assert state["attention"] > state["mamba"] and state["attention"] > state["linear"]


@pytest.fixture(scope="module")
def needle(tmp_path_factory):
    return _quick("needle", tmp_path_factory.mktemp("needle"))


def test_the_needle_beyond_the_window_is_lost_and_found_by_a_global_layer(needle):
    body = needle
    acc, reach = body["accuracy"], body["reach"]["swa"]
    beyond = [d for d in acc["swa"] if int(d) > reach]
    chance = 1 / body["config"]["needles"]
    for d in beyond:
        assert acc["swa"][d] < chance + 0.15, (d, acc["swa"])  # out of reach: a guess
        assert acc["local_global"][d] > 0.8 and acc["full"][d] > 0.8, (d, acc)


def test_trained_on_end_heavy_depths_the_middle_lags_while_it_learns(needle):
    curves = needle["lost_in_middle"]
    lead = {k: max(c["ends"] - c["middle"] for c in curve.values())
            for k, curve in curves.items()}
    assert lead["end_heavy"] > lead["uniform"] + 0.05, lead  # seed 0: 0.20 against 0.04


def test_early_exit_decode_is_the_model_at_threshold_one_and_block_one_at_zero(tmp_path):
    run_experiment("early_exit", "quick", tmp_path, seed=0, log=lambda *a: None)
    body = json.loads((tmp_path / "results.json").read_text())
    assert body["agreement"]["1.0"] == 1.0 and body["blocks_fraction"]["1.0"] == 1.0
    assert body["blocks_fraction"]["0.0"] == pytest.approx(1 / body["config"]["n_layers"])
    assert body["blocks_fraction"]["0.6"] < 1.0  # a trained model's early lens is confident
    assert body["lens_agreement"]["0.9"] > 0.9  # ... and then mostly right (teacher-forced)


def test_the_sinkless_window_is_worse_than_the_window_with_sinks(tmp_path):
    body = _quick("sinks", tmp_path)
    with_sinks, without = body["ppl_with_sinks"], body["ppl_without_sinks"]
    smallest = min(with_sinks, key=int)
    assert without[smallest] > with_sinks[smallest], (with_sinks, without)
