"""Limits that used to break the "never NaN, never a lie" promise: overflow and underflow at
the extremes, a validation split too short for --seq-len, and the commands' bad flags, broken
drill files and undecodable corpora, each a right answer or a clear one-line error."""
import math

import numpy as np
import pytest

from scratchllm import cli
from scratchllm.core import cross_entropy_forward, log_softmax_forward, rmsnorm_backward
from scratchllm.core import rmsnorm_forward, softmax_forward
from scratchllm.lm.sampling import sample_next
from scratchllm.ssm import zoh_backward, zoh_forward
from scratchllm.tokenizer import train_bpe
from scratchllm.train import corpus


@pytest.mark.parametrize("dtype, big", [(np.float32, 1e20), (np.float32, 3e38),
                                        (np.float16, 300.0), (np.float16, 60000.0),
                                        (np.float64, 1e200)])
def test_rmsnorm_of_huge_values_is_the_direction_not_zero(dtype, big):
    x = np.array([[big, -big, big, big]], dtype=dtype)
    y, cache = rmsnorm_forward(x, np.ones(4, dtype))
    np.testing.assert_allclose(y.astype(np.float64), [[1, -1, 1, 1]], rtol=2e-3)
    assert y.dtype == dtype
    dx = rmsnorm_backward(np.ones_like(y), cache)["x"]
    assert np.isfinite(dx).all()


def test_float16_softmax_and_cross_entropy_over_a_large_vocabulary():
    y, _ = softmax_forward(np.zeros((1, 128_256), np.float16))
    assert y.dtype == np.float16 and y.astype(np.float64).sum() == pytest.approx(1, rel=1e-2)
    logp, _ = log_softmax_forward(np.zeros((1, 65_536), np.float16))
    assert np.isfinite(logp).all()
    loss, _ = cross_entropy_forward(np.zeros((3, 65_536), np.float16), np.array([0, 5, 9]))
    assert float(loss) == pytest.approx(math.log(65_536), rel=1e-3)


def test_zoh_with_a_huge_step_gives_minus_b_over_a():
    A, B = np.array([-1e200, -2.0, -3.0]), np.array([1.0, 4.0, 6.0])
    for delta in (1e200, 1e300, 1e308):
        out, cache = zoh_forward(A, B, np.array(delta))
        np.testing.assert_allclose(out.B_bar, -B / A, rtol=1e-12)
        grads = zoh_backward((np.ones(3), np.ones(3)), cache)
        assert all(np.isfinite(g).all() for g in grads.values())


def test_a_tiny_temperature_is_greedy():
    rng = np.random.default_rng(0)
    logits = np.array([0.0, 3.0, 1.0, -np.inf])
    assert {sample_next(logits, rng, temperature=1e-310) for _ in range(5)} == {1}
    with pytest.raises(ValueError, match=r"^sample: the logits hold NaN"):
        sample_next(np.array([0.0, np.nan]), rng)


def test_a_validation_split_shorter_than_seq_len_is_an_error_not_loss_zero():
    with pytest.raises(ValueError, match=r"^eval_batches: the validation split has 50 tokens, "
                                         r"fewer than seq_len \+ 1 = 129"):
        corpus.eval_batches(np.arange(50), 2, 128, 1000)


@pytest.mark.parametrize("argv, flag", [(["compare", "--steps", "0"], "--steps"),
                                        (["sample", "--checkpoint", "x", "--max-tokens", "-5"],
                                         "--max-tokens"),
                                        (["sample", "--checkpoint", "x", "--top-p", "0"],
                                         "--top-p"),
                                        (["train", "--batch-size", "two"], "--batch-size")])
def test_bad_flags_exit_2_with_one_line(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith(f"scratchllm {argv[0]}: argument {flag}: ")


def test_a_drill_file_with_a_syntax_error_is_one_line(tmp_path, capsys):
    (tmp_path / "zoh.py").write_text("def zoh(:\n    pass\n")
    assert cli.main(["drill", "check", "zoh", "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("scratchllm drill: ")
    assert "zoh.py line 1: syntax error" in err[0]


def test_a_corpus_that_is_not_utf8_is_named(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"hello \xff world")
    with pytest.raises(ValueError, match=rf"{bad}: not valid UTF-8 text"):
        train_bpe(str(bad), 260, workers=1)


def test_the_sigmoid_router_normalises_underflowing_scores_without_nan():
    """sigmoid(-800) underflows to 0 in float64: gates were 0/0. The ratio of two such scores
    is exp(s_i - s_j) (sigmoid(s) ~ e^s there), which the rescaled scores keep."""
    from scratchllm.moe import RouterOut, router_backward, router_forward
    from scratchllm.specs import RouterSpec
    x = np.array([[-800.0, -820.0], [1.0, 2.0]])
    out, cache = router_forward(x, np.eye(2), spec=RouterSpec(2, 2, "sigmoid"))
    e = np.exp(-20.0)
    np.testing.assert_allclose(out.gates[0], [1 / (1 + e), e / (1 + e)], rtol=1e-12)
    q = 1 / (1 + np.exp(-x[1]))
    np.testing.assert_allclose(out.gates[1], q[::-1] / q.sum(), rtol=1e-12)
    np.testing.assert_allclose(out.probs.sum(axis=1), 1, rtol=1e-12)
    grads = router_backward(RouterOut(np.ones((2, 2)), None, np.ones((2, 2)), None), cache)
    assert all(np.isfinite(g).all() for g in grads.values())


@pytest.mark.parametrize("fn", ["sdpa", "flash_sdpa"])
@pytest.mark.parametrize("T", [1, 3])
def test_a_head_dim_of_zero_is_an_error_naming_it(fn, T):
    from scratchllm.attention import flash_sdpa_forward, sdpa_forward
    forward = {"sdpa": sdpa_forward, "flash_sdpa": flash_sdpa_forward}[fn]
    q = np.zeros((1, 2, T, 0))
    with pytest.raises(ValueError, match=rf"^{fn}: q has shape .*a head dim Dh of 0"):
        forward(q, q, q)
