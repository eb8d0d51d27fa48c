"""core/tile_gemm.py inside a Numba kernel: gemm_ overwrites out with a @ b and gemm_add_ adds
a @ b to it, for C-contiguous tiles and transposed views, float32 and float64, against
NumPy; a zero-size product leaves zeros (gemm_) or out unchanged (gemm_add_)."""
import numba
import numpy as np
import pytest

from scratchllm.core.tile_gemm import gemm_, gemm_add_


@numba.njit
def _products(a, b, out, acc):
    """a (m, k), b (k, n): out = a @ b; acc += a @ b."""
    gemm_(a, b, out)
    gemm_add_(a, b, acc)


@numba.njit
def _transposed(at, bt, out, acc):
    """at (k, m), bt (n, k): out = at^T @ bt^T; acc += at^T @ bt^T."""
    gemm_(at.T, bt.T, out)
    gemm_add_(at.T, bt.T, acc)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-13), (np.float32, 1e-5)])
@pytest.mark.parametrize("m,k,n", [(5, 3, 7), (1, 4, 6), (6, 4, 1), (3, 0, 2)])
def test_products_equal_numpy(dtype, tol, m, k, n):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    acc0 = rng.standard_normal((m, n)).astype(dtype)
    out, acc = np.full((m, n), np.nan, dtype), acc0.copy()
    _products(a, b, out, acc)
    want = a.astype(np.float64) @ b
    assert out.dtype == dtype and np.allclose(out, want, rtol=tol, atol=tol)
    assert np.allclose(acc, acc0 + want, rtol=tol, atol=tol)
    out, acc = np.full((m, n), np.nan, dtype), acc0.copy()
    _transposed(np.ascontiguousarray(a.T), np.ascontiguousarray(b.T), out, acc)
    assert np.allclose(out, want, rtol=tol, atol=tol)
    assert np.allclose(acc, acc0 + want, rtol=tol, atol=tol)


def test_bits_equal_np_dot_for_matrices():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((9, 13)), rng.standard_normal((13, 11))
    out, acc = np.empty((9, 11)), np.zeros((9, 11))
    _products(a, b, out, acc)
    np.testing.assert_array_equal(out, np.dot(a, b))


def test_a_wrong_layout_or_dtype_is_a_typing_error():
    @numba.njit
    def mixed(a, b, out):
        gemm_(a, b, out)
    a = np.ones((2, 2))
    with pytest.raises(numba.TypingError, match="gemm_: a, b, out must share"):
        mixed(a, a.astype(np.float32), a)
    with pytest.raises(numba.TypingError, match="gemm_: a, b must be 'C' or 'F'"):
        mixed(np.ones((4, 4))[::2, ::2], a, a)
