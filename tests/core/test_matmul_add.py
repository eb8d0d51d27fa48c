"""core/gemm.py matmul_add (out += a @ b by one gemm with beta = 1) and linear_backward's
into= (x^T dy added straight into a Param's grad), against the readable forms."""
import numpy as np
import pytest

from scratchllm.core import ops
from scratchllm.core.gemm import matmul_add
from scratchllm.core.nn import Linear


def _arrays(dtype, M=7, K=5, N=3, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((M, N)).astype(dtype), rng.standard_normal((M, K)).astype(dtype),
            rng.standard_normal((K, N)).astype(dtype))


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 1e-5)])
@pytest.mark.parametrize("a_order, b_order", [("C", "C"), ("F", "C"), ("C", "F"), ("F", "F")])
def test_matmul_add_accumulates_in_place(dtype, tol, a_order, b_order):
    out, a, b = _arrays(dtype)
    a, b = np.asarray(a, order=a_order), np.asarray(b, order=b_order)
    want = out + a @ b
    before = out.ctypes.data
    res = matmul_add(out, a, b)
    assert res is out and out.ctypes.data == before and out.dtype == dtype
    np.testing.assert_allclose(out, want, rtol=0, atol=tol)


def test_matmul_add_takes_strided_views_and_other_dtypes():
    out, a, b = _arrays(np.float64, M=6, K=8, N=4)
    want = out + a[:, ::2] @ b[::2]
    matmul_add(out, a[:, ::2], b[::2])  # neither C- nor F-contiguous: the readable form
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-13)
    o16, a16, b16 = (x.astype(np.float16) for x in _arrays(np.float64))
    want16 = o16 + a16 @ b16
    matmul_add(o16, a16, b16)
    np.testing.assert_array_equal(o16, want16)
    empty = np.ones((3, 2))
    matmul_add(empty, np.ones((3, 0)), np.ones((0, 2)))  # K = 0: adds nothing
    np.testing.assert_array_equal(empty, np.ones((3, 2)))


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 1e-5)])
def test_linear_backward_into_equals_the_fresh_dW(dtype, tol):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 7)).astype(dtype)  # (B, T, Din)
    W, b = rng.standard_normal((7, 3)).astype(dtype), rng.standard_normal(3).astype(dtype)
    y, cache = ops.linear_forward(x, W, b)
    dy = rng.standard_normal(y.shape).astype(dtype)
    fresh = ops.linear_backward(dy, cache)
    start = rng.standard_normal((7, 3)).astype(dtype)
    into = start.copy()
    g = ops.linear_backward(dy, cache, into=into)
    assert g["W"] is into
    np.testing.assert_allclose(into, start + fresh["W"], rtol=0, atol=tol)
    np.testing.assert_array_equal(g["x"], fresh["x"])
    np.testing.assert_array_equal(g["b"], fresh["b"])
    np.testing.assert_allclose(fresh["W"], np.einsum("btd,bto->do", x, dy), rtol=0, atol=tol)
    with pytest.raises(ValueError, match=r"linear_backward: into has shape \(3, 7\)"):
        ops.linear_backward(dy, cache, into=np.zeros((3, 7), dtype))


def test_linear_module_accumulates_like_add_grads():
    rng = np.random.default_rng(2)
    lin = Linear(6, 4, bias=True, rng=rng, dtype=np.float64)
    x = rng.standard_normal((3, 6))
    dy = rng.standard_normal((3, 4))
    for _ in range(2):  # two backwards accumulate
        y, cache = lin.forward(x)
        dx = lin.backward(dy, cache)
    np.testing.assert_allclose(lin.W.grad, 2 * x.T @ dy, rtol=0, atol=1e-13)
    np.testing.assert_allclose(lin.b.grad, 2 * dy.sum(0), rtol=0, atol=1e-13)
    np.testing.assert_allclose(dx, dy @ lin.W.data.T, rtol=0, atol=1e-13)
