"""The chapters' exercises: each check passes with the solution and fails with a planted
error; the command lists, shows and checks them (also a learner's file)."""
import numpy as np
import pytest

from scratchllm.cli import exercise as exercise_cli
from scratchllm.teach.exercises import EXERCISES, check


def test_the_chapters_exercises_exist():
    assert sorted(EXERCISES) == [1, 2, 3, 4, 5]
    for ex in EXERCISES.values():
        assert ex.statement and ex.hint and ex.proof and f"def {ex.function}(" in ex.template


@pytest.mark.parametrize("number", sorted(EXERCISES))
def test_the_solution_passes_every_check(number):
    results = check(number)
    assert len(results) >= 2 and all(r.passed for r in results), results


def _gap_without_half(f, P):  # the identity with 1/E instead of 1/(2E)
    return 2 * EXERCISES[2].solution(f, P)


def _gap_always_nonnegative(f, P):  # "the bound holds for every router"
    return abs(EXERCISES[2].solution(f, P))


def _ec_per_token_fraction(token_idx, probs):  # f_i = load_i / BT, as if tokens chose
    load, _ = EXERCISES[3].solution(token_idx, probs)
    return load, float(probs.shape[1] * np.dot(load / probs.shape[0], probs.mean(axis=0)))


def _ec_loads_from_tokens(token_idx, probs):  # counts tokens, not the experts' slots
    load = np.bincount(token_idx.ravel(), minlength=probs.shape[1])[:probs.shape[1]]
    return load, EXERCISES[3].solution(token_idx, probs)[1]


def _kv_without_v(context, **sizes):  # caches K only
    kv, chapter, full = EXERCISES[4].solution(context, **sizes)
    return kv // 2, chapter, full


def _state_without_conv(context, *, mamba, **sizes):
    kv, chapter, _ = EXERCISES[4].solution(context, mamba=mamba, **sizes)
    Di = mamba.expand * sizes["d_model"]
    return kv, chapter, sizes["n_layers"] * Di * mamba.d_state * sizes["itemsize"]


def _pool_tile_order(w, n_heads, n_kv_heads):  # heads j, j + Hkv, ... pooled together
    D, HDh = w.shape
    Dh, G = HDh // n_heads, n_heads // n_kv_heads
    return w.reshape(D, G, n_kv_heads, Dh).mean(axis=1).reshape(D, n_kv_heads * Dh)


def _pool_sum(w, n_heads, n_kv_heads):
    return EXERCISES[5].solution(w, n_heads, n_kv_heads) * (n_heads // n_kv_heads)


def _kv_k_only(**sizes):  # caches K only
    gqa, mha = EXERCISES[1].solution(**sizes)
    return gqa // 2, mha // 2


def _kv_query_heads(*, n_heads, n_kv_heads, head_dim, itemsize):  # counts the query heads
    return EXERCISES[1].solution(n_heads=n_heads, n_kv_heads=n_heads, head_dim=head_dim,
                                 itemsize=itemsize)


PLANTED = [  # (exercise, wrong answer, the checks it must fail)
    (1, _kv_k_only, {0, 1}),
    (1, _kv_query_heads, {0, 1}),
    (2, _gap_without_half, {0, 1, 2}),
    (2, _gap_always_nonnegative, {0, 2}),
    (3, _ec_per_token_fraction, {0, 1}),
    (3, _ec_loads_from_tokens, {0, 1}),
    (4, _kv_without_v, {0, 1}),
    (4, _state_without_conv, {0, 1}),
    (5, _pool_tile_order, {0, 1, 2}),
    (5, _pool_sum, {0, 1, 2}),
]


@pytest.mark.parametrize("number, wrong, failing", PLANTED, ids=[w.__name__ for _, w, _ in PLANTED])
def test_a_planted_error_fails_its_checks(number, wrong, failing):
    results = check(number, wrong)
    assert {i for i, r in enumerate(results) if not r.passed} == failing, results


def test_ex2_runs_10000_routers_and_reports_the_ones_below_the_bound():
    detail = check(2)[0].detail
    assert "10,000 routers" in detail and "649 fall below 1/E" in detail


def test_cli_list_show_and_check(capsys):
    assert exercise_cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(f"Ex. {n}" in out for n in EXERCISES) and "05_moe_balance_loss" in out
    assert exercise_cli.main(["show", "3"]) == 0
    out = capsys.readouterr().out
    assert "Hint:" in out and "def expert_choice_balance(" in out and "Solution" not in out
    assert exercise_cli.main(["show", "3", "--solution"]) == 0
    assert "f_i = C / (E·C) = 1/E" in capsys.readouterr().out
    assert exercise_cli.main(["check", "5"]) == 0
    assert "3/3 checks pass" in capsys.readouterr().out


def test_cli_checks_a_learners_file(tmp_path, capsys):
    path = tmp_path / "answer.py"
    path.write_text("def mha_to_gqa(w, n_heads, n_kv_heads):\n    return w[:, :w.shape[1] * "
                    "n_kv_heads // n_heads]\n")
    assert exercise_cli.main(["check", "5", "--file", str(path)]) == 1
    assert "FAIL  equals the mean" in capsys.readouterr().out
    path.write_text("def mha_to_gqa(w, n_heads, n_kv_heads):\n    D = w.shape[0]\n"
                    "    G = n_heads // n_kv_heads\n"
                    "    return w.reshape(D, n_kv_heads, G, -1).mean(2).reshape(D, -1)\n")
    assert exercise_cli.main(["check", "5", "--file", str(path)]) == 0


@pytest.mark.parametrize("argv, message", [
    (["show"], "needs an exercise number"), (["check", "9"], "one of: 1, 2, 3, 4, 5; got 9"),
    (["show", "2", "--file", "x.py"], "--file is for check"),
    (["check", "2", "--solution"], "--solution is for show")])
def test_cli_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        exercise_cli.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
