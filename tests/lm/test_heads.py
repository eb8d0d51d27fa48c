"""lm/heads.py backprop_tied_head: the tied head's backward accumulating dE in place equals
the readable one (Embedding.attend_backward: the linear pair, its dW added transposed)."""
import numpy as np
import pytest

from scratchllm.core.nn import Embedding
from scratchllm.lm.heads import backprop_tied_head


def _pair(dtype, seed=0):
    rng = np.random.default_rng(seed)
    a, b = (Embedding(11, 7, rng=rng, dtype=dtype) for _ in range(2))
    b.E.data[...] = a.E.data
    start = rng.standard_normal((11, 7)).astype(dtype)  # a gradient already accumulated
    a.E.grad[...] = b.E.grad[...] = start
    h = rng.standard_normal((2, 3, 7)).astype(dtype)  # (B, T, D)
    dlogits = rng.standard_normal((2, 3, 11)).astype(dtype)  # (B, T, V)
    return a, b, h, dlogits, start


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 1e-5)])
def test_backprop_tied_head_equals_the_linear_pair(dtype, tol):
    a, b, h, dlogits, start = _pair(dtype)
    _, cache = a.attend(h)  # logits (2, 3, 11)
    dh = backprop_tied_head(dlogits, cache, a)
    dh_ref = b.attend_backward(dlogits, b.attend(h)[1])
    assert dh.dtype == dtype and a.E.grad.dtype == dtype
    np.testing.assert_allclose(dh, dh_ref, rtol=0, atol=tol)
    np.testing.assert_allclose(a.E.grad, b.E.grad, rtol=0, atol=tol)
    # and the closed form: dE = start + dlogits^T h, dh = dlogits E
    np.testing.assert_allclose(a.E.grad, start + np.einsum("btv,btd->vd", dlogits, h),
                               rtol=0, atol=10 * tol)
    np.testing.assert_allclose(dh, dlogits @ a.E.data, rtol=0, atol=tol)


def test_backprop_tied_head_checks_dlogits():
    a, _, h, dlogits, _ = _pair(np.float64)
    with pytest.raises(ValueError, match="backprop_tied_head"):
        backprop_tied_head(dlogits[:, :2], a.attend(h)[1], a)



def test_an_fp8_cache_takes_the_readable_pair():
    from scratchllm.core.fp8 import fp8_matmuls
    a, b, h, dlogits, _ = _pair(np.float64, seed=1)
    with fp8_matmuls():
        _, cache = a.attend(h)  # the FP8 pair's cache
        _, cache_b = b.attend(h)
    np.testing.assert_array_equal(backprop_tied_head(dlogits, cache, a),
                                  b.attend_backward(dlogits, cache_b))
    np.testing.assert_array_equal(a.E.grad, b.E.grad)
