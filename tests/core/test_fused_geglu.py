"""core/fused_geglu.py: the fused GeGLU-tanh twin against the readable pair (core/gelu.py) to
1e-6 (float32) / 1e-12 (float64), at large |a| where tanh saturates too, and the GeGLU Module
choosing it (tanh gate) or the readable pair (erf gate, SCRATCHLLM_READABLE)."""
import numpy as np
import pytest

from scratchllm.core import GeGLU, geglu_backward, geglu_forward
from scratchllm.core.fused_geglu import fused_geglu_backward, fused_geglu_forward

TOL = {np.float32: 1e-6, np.float64: 1e-12}


def _inputs(dtype, rng):
    D, F = 13, 11
    x = (2 * rng.standard_normal((2, 5, D))).astype(dtype)
    W1, W3 = (rng.standard_normal((2, D, F)) * 0.6).astype(dtype)
    W2 = (rng.standard_normal((F, D)) * 0.4).astype(dtype)
    W1[:, 0] = 40.0 / D  # a gate column with |a| large: tanh saturates at +-1
    return x, W1, W3, W2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_geglu_equals_the_readable_pair(dtype):
    rng = np.random.default_rng(2)
    args = _inputs(dtype, rng)
    y, cache = fused_geglu_forward(*args)
    y_ref, cache_ref = geglu_forward(*args, approximate="tanh")
    assert y.dtype == dtype and y.shape == y_ref.shape == args[0].shape
    assert np.max(np.abs(y - y_ref)) <= TOL[dtype] * np.max(np.abs(y_ref))
    dy = rng.standard_normal(y.shape).astype(dtype)
    g, g_ref = fused_geglu_backward(dy, cache), geglu_backward(dy, cache_ref)
    assert sorted(g) == sorted(g_ref) == ["W1", "W2", "W3", "x"]
    for k in g:
        assert g[k].dtype == dtype
        assert np.max(np.abs(g[k] - g_ref[k])) <= TOL[dtype] * np.max(np.abs(g_ref[k])), k


@pytest.mark.parametrize("approximate, readable", [("tanh", False), ("tanh", True),
                                                   ("none", False)])
def test_the_geglu_module_runs_the_twin_its_gate_allows(approximate, readable, monkeypatch):
    monkeypatch.setenv("SCRATCHLLM_READABLE", "1" if readable else "0")
    rng = np.random.default_rng(3)
    ffn = GeGLU(13, 11, rng=rng, approximate=approximate, dtype=np.float64)
    x = rng.standard_normal((2, 5, 13))
    y, cache = ffn.forward(x)
    assert (cache.backward is fused_geglu_backward) == (approximate == "tanh" and not readable)
    dy = rng.standard_normal(y.shape)
    dx = ffn.backward(dy, cache)
    W = (ffn.W1.data, ffn.W3.data, ffn.W2.data)
    y_ref, c_ref = geglu_forward(x, *W, approximate=approximate)
    g_ref = geglu_backward(dy, c_ref)
    np.testing.assert_allclose(y, y_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dx, g_ref["x"], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ffn.W1.grad, g_ref["W1"], rtol=1e-12, atol=1e-12)
