"""Core ops: gradient checks, independent references, dtype, stability, bad input."""
import numpy as np
import pytest

import grads
from grads.cases import CASES
from scratchllm.core import ops

FOUNDATION = ["linear", "embedding", "rmsnorm", "silu", "swiglu", "softmax", "log_softmax",
              "cross_entropy"]


@pytest.mark.parametrize("name", FOUNDATION)
def test_gradient_check_passes(name):
    result = CASES[name](np.random.default_rng(3))
    for report in result if isinstance(result, list) else [result]:
        assert report.ok, f"{name} {report.label}\n{report}"
        assert max(r.max_rel_err for r in report.rows) < 1e-7


def test_embedding_repeated_ids_accumulate():
    E = np.arange(12.0).reshape(4, 3)
    ids = np.array([2, 0, 2, 2])
    out, cache = ops.embedding_forward(ids, E)
    np.testing.assert_array_equal(out[0], E[2])
    dout = np.arange(12.0).reshape(4, 3)
    dE = ops.embedding_backward(dout, cache)["E"]
    np.testing.assert_array_equal(dE[2], dout[0] + dout[2] + dout[3])
    np.testing.assert_array_equal(dE[0], dout[1])
    np.testing.assert_array_equal(dE[[1, 3]], 0)


def test_rmsnorm_matches_formula():
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((2, 5)), rng.standard_normal(5)
    y, _ = ops.rmsnorm_forward(x, g, eps=1e-6)
    expected = np.stack([row / np.sqrt(np.sum(row ** 2) / 5 + 1e-6) * g for row in x])
    np.testing.assert_allclose(y, expected, rtol=1e-13)


def test_swiglu_matches_formula():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 4))
    W1, W3, W2 = rng.standard_normal((4, 6)), rng.standard_normal((4, 6)), rng.standard_normal((6, 4))
    a = x @ W1
    expected = (a / (1 + np.exp(-a)) * (x @ W3)) @ W2
    np.testing.assert_allclose(ops.swiglu_forward(x, W1, W3, W2)[0], expected, rtol=1e-12)


def test_softmax_fully_masked_row_gives_zeros_and_zero_gradient():
    x = np.array([[1.0, 2.0, 3.0], [-np.inf, -np.inf, -np.inf]])
    y, cache = ops.softmax_forward(x)
    np.testing.assert_allclose(y[0], np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum())
    np.testing.assert_array_equal(y[1], 0.0)
    dx = ops.softmax_backward(np.ones_like(x) * [[1, 2, 3]], cache)["x"]
    np.testing.assert_array_equal(dx[1], 0.0)
    assert np.isfinite(dx).all()


def test_log_softmax_fully_masked_row_is_minus_inf_with_zero_gradient():
    x = np.array([[0.5, -1.0], [-np.inf, -np.inf]])
    y, cache = ops.log_softmax_forward(x)
    assert np.all(y[1] == -np.inf) and not np.isnan(y).any()
    dx = ops.log_softmax_backward(np.array([[1.0, 2.0], [3.0, 4.0]]), cache)["x"]
    np.testing.assert_array_equal(dx[1], 0.0)


def test_cross_entropy_matches_explicit_nll():
    rng = np.random.default_rng(4)
    logits, targets = rng.standard_normal((6, 5)), rng.integers(0, 5, 6)
    loss, _ = ops.cross_entropy_forward(logits, targets)
    nll = [np.log(np.exp(row).sum()) - row[t] for row, t in zip(logits, targets)]
    assert float(loss) == pytest.approx(np.mean(nll), rel=1e-13)


def test_cross_entropy_ignore_index_excludes_positions():
    rng = np.random.default_rng(5)
    logits = rng.standard_normal((4, 7))
    targets = np.array([3, -100, 1, -100])
    loss, cache = ops.cross_entropy_forward(logits, targets)
    kept, _ = ops.cross_entropy_forward(logits[[0, 2]], targets[[0, 2]])
    assert float(loss) == pytest.approx(float(kept), rel=1e-14)
    dlogits = ops.cross_entropy_backward(np.array(1.0), cache)["logits"]
    np.testing.assert_array_equal(dlogits[[1, 3]], 0.0)


def test_cross_entropy_all_ignored_is_zero_not_nan():
    logits = np.random.default_rng(6).standard_normal((3, 4))
    loss, cache = ops.cross_entropy_forward(logits, np.full(3, -100))
    assert float(loss) == 0.0
    dlogits = ops.cross_entropy_backward(np.array(1.0), cache)["logits"]
    np.testing.assert_array_equal(dlogits, 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_is_finite_for_huge_logits(dtype):
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal((5, 9)) * 1000).astype(dtype)
    targets = rng.integers(0, 9, 5)
    loss, cache = ops.cross_entropy_forward(logits, targets)
    dlogits = ops.cross_entropy_backward(np.array(1.0, dtype), cache)["logits"]
    assert np.isfinite(loss) and np.isfinite(dlogits).all()
    row_max = logits.max(axis=1)
    expected = np.mean(row_max - logits[np.arange(5), targets])  # log-sum-exp ~ max at x1000
    assert float(loss) == pytest.approx(float(expected), rel=1e-3)


def _float32_calls(rng):
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    W = rng.standard_normal((4, 5)).astype(np.float32)
    W1, W3 = (rng.standard_normal((4, 6)).astype(np.float32) for _ in range(2))
    W2 = rng.standard_normal((6, 4)).astype(np.float32)
    return {
        "linear": (ops.linear_forward, ops.linear_backward, (x, W, np.zeros(5, np.float32))),
        "embedding": (ops.embedding_forward, ops.embedding_backward, (np.array([1, 0]), W)),
        "rmsnorm": (ops.rmsnorm_forward, ops.rmsnorm_backward, (x, np.ones(4, np.float32))),
        "silu": (ops.silu_forward, ops.silu_backward, (x,)),
        "swiglu": (ops.swiglu_forward, ops.swiglu_backward, (x, W1, W3, W2)),
        "softmax": (ops.softmax_forward, ops.softmax_backward, (x,)),
        "log_softmax": (ops.log_softmax_forward, ops.log_softmax_backward, (x,)),
        "cross_entropy": (ops.cross_entropy_forward, ops.cross_entropy_backward,
                          (x, np.zeros((2, 3), int))),
    }


@pytest.mark.parametrize("name", FOUNDATION)
def test_float32_in_gives_float32_out(name):
    forward, backward, args = _float32_calls(np.random.default_rng(8))[name]
    out, cache = forward(*args)
    assert out.dtype == np.float32, name
    grads_ = backward(np.ones_like(out), cache)
    assert {k: v.dtype for k, v in grads_.items()} == {k: np.float32 for k in grads_}, name


@pytest.mark.parametrize("call, message", [
    (lambda: ops.linear_forward(np.ones((2, 3)), np.ones((4, 5))),
     r"linear: W has shape \(4, 5\), expected \(3, \*\)"),
    (lambda: ops.linear_forward(np.ones((2, 3)), np.ones((3, 5)), np.ones(4)),
     r"linear: b has shape \(4,\), expected \(5,\)"),
    (lambda: ops.rmsnorm_forward(np.ones((2, 3)), np.ones(4)),
     r"rmsnorm: g has shape \(4,\), expected \(3,\)"),
    (lambda: ops.swiglu_forward(np.ones((2, 3)), np.ones((3, 4)), np.ones((3, 5)), np.ones((4, 3))),
     r"swiglu: W3 has shape \(3, 5\), expected \(3, 4\)"),
    (lambda: ops.swiglu_forward(np.ones((2, 3)), np.ones((3, 4)), np.ones((3, 4)), np.ones((3, 3))),
     r"swiglu: W2 has shape \(3, 3\), expected \(4, 3\)"),
    (lambda: ops.embedding_forward(np.array([0, 9]), np.ones((5, 2))),
     r"embedding: ids must lie in \[0, 5\)"),
    (lambda: ops.cross_entropy_forward(np.ones((2, 3)), np.array([0, 1, 2])),
     r"cross_entropy: targets has shape \(3,\), expected \(2,\)"),
    (lambda: ops.cross_entropy_forward(np.ones((2, 3)), np.array([0, 3])),
     r"cross_entropy: targets must lie in \[0, 3\)"),
])
def test_bad_shapes_raise_value_error_naming_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_integer_where_float_expected_is_a_type_error():
    with pytest.raises(TypeError, match="rmsnorm: x must be a float array"):
        ops.rmsnorm_forward(np.ones((2, 3), dtype=int), np.ones(3))


def test_pairs_do_not_mutate_inputs():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 4))
    x_copy = x.copy()
    y, cache = ops.softmax_forward(x)
    dy = rng.standard_normal(y.shape)
    dy_copy = dy.copy()
    ops.softmax_backward(dy, cache)
    np.testing.assert_array_equal(x, x_copy)
    np.testing.assert_array_equal(dy, dy_copy)
    assert grads.check(ops.softmax_forward, ops.softmax_backward, x=x).ok


def test_matmul_rows_is_matmul_over_the_flattened_rows():
    """ops.matmul_rows(a, M) == a @ M for contiguous batches (one GEMM over all rows), for
    strided ones (NumPy's matmul) and for 1-D and 2-D a; float64 to round-off."""
    rng = np.random.default_rng(3)
    M = rng.standard_normal((7, 5))
    a = rng.standard_normal((3, 4, 7))  # (B, T, K) contiguous
    for x in (a, a.transpose(1, 0, 2), a[0], a[0, 0], a[None]):
        got = ops.matmul_rows(x, M)
        assert got.shape == x.shape[:-1] + (5,)
        np.testing.assert_allclose(got, np.einsum("...k,kn->...n", x, M), rtol=1e-13)
    assert np.array_equal(ops.matmul_rows(a, M.T.T), (a.reshape(12, 7) @ M).reshape(3, 4, 5))
