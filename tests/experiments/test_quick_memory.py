"""The --quick runs of the memory experiments (recall, needle, sinks) show what the chapters
predict, where the quick run is strong enough to show it (slow tier: about a minute each on
2 cores)."""
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


def test_the_needle_beyond_the_window_is_lost_and_found_by_a_global_layer(tmp_path):
    body = _quick("needle", tmp_path)
    acc, reach = body["accuracy"], body["reach"]["swa"]
    beyond = [d for d in acc["swa"] if int(d) > reach]
    chance = 1 / body["config"]["needles"]
    for d in beyond:
        assert acc["swa"][d] < chance + 0.15, (d, acc["swa"])  # out of reach: a guess
        assert acc["local_global"][d] > 0.8 and acc["full"][d] > 0.8, (d, acc)


def test_the_sinkless_window_is_worse_than_the_window_with_sinks(tmp_path):
    body = _quick("sinks", tmp_path)
    with_sinks, without = body["ppl_with_sinks"], body["ppl_without_sinks"]
    smallest = min(with_sinks, key=int)
    assert without[smallest] > with_sinks[smallest], (with_sinks, without)
