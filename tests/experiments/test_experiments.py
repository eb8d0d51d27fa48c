"""Every experiment's smoke run writes results.json with its metrics under the pinned keys
(nested objects with string keys), plus "config" and "seed", and its figure; the CLI lists
one name per line, first on the line."""
import json

import pytest

from scratchllm import cli
from scratchllm.experiments import EXPERIMENTS, run_experiment

RECALL_MODELS = ["attention", "deltanet", "hybrid", "linear", "mamba", "mamba2", "swa"]
KEYS = {  # experiment -> its metrics and the keys of each nested metric
    "collapse": {"load_before": None, "load_after": None},
    "scale": {"qk_std": ["16", "64", "256", "1024"], "max_prob": ["16", "64", "256", "1024"],
              "equivariance_err": None, "rmsnorm_s": None, "layernorm_s": None},
    "heads": {"val_loss": ["gqa2", "gqa4", "mha", "mqa"], "kv_bytes": ["gqa2", "gqa4", "mha",
                                                                       "mqa"]},
    "induction": {"induction_score": ["0", "1"], "loss_first_half": None,
                  "loss_second_half": None},
    "moe": {"val_loss": ["dense_active", "dense_total", "fine", "moe"]},
    "experts": {"share": [str(e) for e in range(8)], "entropy": None},
    "abf": {"ppl": ["abf", "none", "pi", "yarn"]},
    "recall": {"accuracy": RECALL_MODELS, "state_bytes": RECALL_MODELS,
               "copy_accuracy": RECALL_MODELS},
    "needle": {"accuracy": ["full", "local_global", "swa"], "reach": ["full", "local_global",
                                                                      "swa"],
               "lost_in_middle": ["end_heavy", "uniform"], "accuracy_end_heavy": None},
    "early_exit": {m: ["1.0", "0.95", "0.9", "0.8", "0.6", "0.4", "0.0"] for m in (
        "agreement", "blocks_fraction", "ms_per_token", "lens_agreement")},
    "sinks": {"ppl_with_sinks": ["16", "8"], "ppl_without_sinks": ["16", "8"],
              "ppl_full": None},
}


def test_every_experiment_has_its_keys_listed():
    assert sorted(EXPERIMENTS) == sorted(KEYS)


@pytest.mark.parametrize("name", sorted(KEYS))
def test_smoke_run_writes_the_metrics(name, tmp_path):
    run_experiment(name, "smoke", tmp_path, seed=3, log=lambda *a: None)
    body = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / f"{name}.png").stat().st_size > 1000
    assert body["seed"] == 3 and isinstance(body["config"], dict)
    for metric, keys in KEYS[name].items():
        assert metric in body, metric
        if keys is not None:
            assert sorted(body[metric]) == sorted(keys), metric
    extra = {"collapse": _collapse, "scale": _scale, "heads": _heads, "induction": _induction,
             "moe": _moe, "experts": _experts, "abf": _abf,
             "recall": _recall, "needle": _needle, "sinks": _sinks, "early_exit": _early_exit}
    extra[name](body)


def _collapse(body):
    for key in ("load_before", "load_after"):
        assert len(body[key]) == 8 and abs(sum(body[key]) - 1) < 1e-9
    assert abs(body["load_before"][0] - 0.25) < 0.02  # the imbalanced start


def _scale(body):
    for dh, std in body["qk_std"].items():
        assert abs(std / int(dh) ** 0.5 - 1) < 0.2  # std(q.k) = sqrt(Dh)
    assert sorted(body["max_prob"]["1024"]) == ["scaled", "unscaled"]
    assert body["max_prob"]["1024"]["unscaled"] > body["max_prob"]["16"]["unscaled"]
    assert body["equivariance_err"] < 1e-12
    assert body["rmsnorm_s"] > 0 and body["layernorm_s"] > 0


def _heads(body):
    kv = body["kv_bytes"]
    assert kv["mha"] == 2 * kv["gqa4"] == 4 * kv["gqa2"] == 8 * kv["mqa"]


def _induction(body):
    for layer in ("0", "1"):
        scores = body["induction_score"][layer]
        assert sorted(scores) == ["0", "1", "2", "3"]
        assert all(0 <= s <= 1 for s in scores.values())
    assert body["loss_first_half"] > 0 and body["loss_second_half"] > 0


def _moe(body):
    assert all(isinstance(v, float) and v > 0 for v in body["val_loss"].values())
    params = body["params"]  # equal active FFN: moe = dense_active; total: moe ~ dense_total
    assert params["moe"]["total"] > params["moe"]["active"]
    assert abs(params["moe"]["active"] - params["dense_active"]["total"]) < 0.03 * \
        params["dense_active"]["total"]
    assert params["fine"]["active"] - params["moe"]["active"] < 200  # router columns only


def _experts(body):
    for shares in body["share"].values():
        assert sorted(shares) == ["digit", "ident", "punct", "word"]
        assert abs(sum(shares.values()) - 1) < 1e-9
    assert 0 < body["entropy"] <= body["entropy_max"] + 1e-9
    assert body["mi_class"] >= 0 and body["mi_topic"] >= 0


def _abf(body):
    L0 = body["config"]["train_len"]
    for key in ("ppl", "ppl_zero_shot"):
        for method in ("none", "pi", "yarn", "abf"):
            assert sorted(body[key][method], key=int) == [str(L0 * f) for f in (1, 2, 4, 8)]
            assert all(v > 1 for v in body[key][method].values())
def _recall(body):
    for model in RECALL_MODELS:
        for table in (body["accuracy"], body["copy_accuracy"]):
            assert sorted(table[model]) == ["16", "32"]  # the smoke run's lengths
            assert all(0 <= a <= 1 for a in table[model].values())
        assert isinstance(body["state_bytes"][model], int) and body["state_bytes"][model] > 0
    state = body["state_bytes"]
    assert state["attention"] == 2 * state["swa"]  # T = 32 tokens kept against a window of 16
    assert state["linear"] < state["attention"] and state["mamba"] < state["attention"]


def _needle(body):
    depths = body["config"]["depths"]
    for model in ("full", "swa", "local_global"):
        assert sorted(body["accuracy"][model], key=int) == [str(d) for d in depths]
    assert max(depths) > body["reach"]["swa"]  # the deepest needle is out of the window's reach
    assert body["reach"]["full"] == body["reach"]["local_global"] == max(depths)
    assert sorted(body["accuracy_end_heavy"], key=int) == [str(d) for d in depths]
    for curve in body["lost_in_middle"].values():  # a probe every twentieth of training
        assert int(max(curve, key=int)) == body["config"]["steps"]
        assert all(sorted(c) == ["ends", "middle"] for c in curve.values())


def _early_exit(body):
    assert body["agreement"]["1.0"] == 1.0 and body["blocks_fraction"]["1.0"] == 1.0
    assert body["blocks_fraction"]["0.0"] == pytest.approx(1 / body["config"]["n_layers"])
    assert all(0 <= a <= 1 for a in body["lens_agreement"].values())


def _sinks(body):
    for key in ("ppl_with_sinks", "ppl_without_sinks"):
        assert all(1 < p < 1e4 for p in body[key].values())
    assert all(int(w) < body["config"]["seq_len"] for w in body["ppl_with_sinks"])


def test_cli_lists_one_name_per_line(capsys):
    assert cli.main(["experiment", "list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(EXPERIMENTS)


def test_cli_run_writes_results(tmp_path, capsys):
    assert cli.main(["experiment", "run", "collapse", "--smoke", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "claim:" in out and "measured:" in out
    assert "load_after" in json.loads((tmp_path / "results.json").read_text())


def test_the_recall_curriculum_adds_one_length_a_stage():
    from scratchllm.experiments.recall import length_at
    seen = [length_at(step, 9, (16, 32, 64)) for step in range(1, 10)]
    assert seen == [16, 16, 16, 16, 32, 16, 32, 64, 16]  # stages of 3 steps: 16 | 16 32 | all
