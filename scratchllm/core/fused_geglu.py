"""The fused Numba twin of GeGLU with the tanh GELU (Gemma's MLP, core/gelu.py geglu_forward /
geglu_backward with approximate="tanh"): the gate m = gelu(a) * b in one pass over a and b
instead of the readable pair's ten NumPy passes with a temporary each (the two
up-projections and the down-projection stay GEMMs).

Math (the readable pair's, core/gelu.py):
    a = x W1,  b = x W3,  u = c (a + k a^3),  t = tanh(u),  c = sqrt(2 / pi), k = 0.044715
    m = 0.5 a (1 + t) b,   y = m W2
    gelu'(a) = 0.5 (1 + t) + 0.5 a (1 - t^2) c (1 + 3 k a^2)
    da = dm b gelu'(a),   db = dm gelu(a)
tanh inside the kernels is 1 - 2 / (e^{2u} + 1) with core/exp32.py's exp_lanes, so the loop
vectorises for float32 (libm's tanh would be a scalar call per element); its absolute error
is a few float32 ulps of 1, and GELU only ever uses 1 + t and 1 - t^2, where that is what
counts. e^{2u} overflowing to inf gives t = 1 exactly, underflowing to 0 gives t = -1.
tests/test_twin_agreement.py and tests/core/test_fused.py hold it to the readable pair;
grads/cases/core.py checks its backward by finite differences.

Glossary: BT token rows, D model width, F hidden width.
"""
import math

import numpy as np
from numba import njit

from scratchllm.core import gelu, ops
from scratchllm.core.exp32 import exp_lanes
from scratchllm.core.fused import FusedSwiGLUCache  # (gate, up, down, a, b, x.shape)
from scratchllm.core.twins import Twin
from scratchllm.core.validate import expect_dout, expect_gated_ffn

_C = math.sqrt(2.0 / math.pi)
_K = 0.044715


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _tanh_lanes(u, one, two):
    """tanh(u) = 1 - 2 / (e^{2u} + 1), vectorisable (exp_lanes); one, two in u's dtype."""
    return one - two / (exp_lanes(two * u) + one)


@njit(cache=True, nogil=True, error_model="numpy")
def _geglu_gate(a, b, m, c, k, half, one, two):
    """m = 0.5 a (1 + tanh(c (a + k a^3))) b, row by row over 1-D slices (vectorised)."""
    for i in range(m.shape[0]):
        ai, bi, mi = a[i], b[i], m[i]
        for j in range(mi.shape[0]):
            x = ai[j]
            t = _tanh_lanes(c * (x + k * (x * x * x)), one, two)
            mi[j] = half * x * (one + t) * bi[j]


@njit(cache=True, nogil=True, error_model="numpy")
def _geglu_gate_backward(a, b, dm, da, db, c, k, half, one, two):
    """da = dm b gelu'(a), db = dm gelu(a), with t = tanh(c (a + k a^3))."""
    three_k = 3 * k
    for i in range(dm.shape[0]):
        ai, bi, dmi, dai, dbi = a[i], b[i], dm[i], da[i], db[i]
        for j in range(dmi.shape[0]):
            x, d = ai[j], dmi[j]
            t = _tanh_lanes(c * (x + k * (x * x * x)), one, two)
            g = half * x * (one + t)  # gelu(a)
            dg = half * (one + t) + half * x * (one - t * t) * c * (one + three_k * x * x)
            dai[j] = d * bi[j] * dg
            dbi[j] = d * g


def _constants(dtype):
    """(c, k, 0.5, 1, 2) in the arrays' dtype: the kernels then run in it."""
    return tuple(dtype.type(v) for v in (_C, _K, 0.5, 1, 2))


def fused_geglu_forward(x, W1, W3, W2):
    """gelu.geglu_forward(x, W1, W3, W2, approximate="tanh") with the gate in one pass.
    Inputs: x (..., D), W1, W3 (D, F), W2 (F, D).  Returns: y (..., D).
    Cache: the three linear caches, a, b (BT, F) and x.shape."""
    expect_gated_ffn("geglu", x, W1, W3, W2)
    x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])  # (BT, D)
    a, gate = ops.linear_forward(x2, W1)  # (BT, F)
    b, up = ops.linear_forward(x2, W3)  # (BT, F)
    m = np.empty_like(a)  # (BT, F)
    _geglu_gate(a, b, m, *_constants(a.dtype))
    y, down = ops.linear_forward(m, W2)  # (BT, D)
    return y.reshape(x.shape[:-1] + y.shape[-1:]), FusedSwiGLUCache(gate, up, down, a, b,
                                                                    x.shape)


def fused_geglu_backward(dy, cache):
    """Math: fwd y = m W2 -> dm = dy W2^T, dW2 = m^T dy; fwd m = gelu(a) b -> da = dm b
    gelu'(a), db = dm gelu(a) (one pass); fwd a = x W1, b = x W3 -> dx = da W1^T + db W3^T,
    dW1 = x^T da, dW3 = x^T db.
    Reference: Shazeer 2020 (arXiv 2002.05202); Hendrycks & Gimpel 2016 (arXiv 1606.08415)."""
    gate, up, down, a, b, shape = cache
    expect_dout("fused_geglu_backward", dy, shape[:-1] + down.W.shape[1:],
                ops.linear_out(down)[1], name="dy")
    g_down = ops.linear_backward(dy.reshape(-1, dy.shape[-1]), down)  # fwd: y = m @ W2
    da, db = np.empty_like(a), np.empty_like(b)  # (BT, F)
    _geglu_gate_backward(a, b, g_down["x"], da, db, *_constants(a.dtype))
    g_gate = ops.linear_backward(da, gate)  # fwd: a = x @ W1
    g_up = ops.linear_backward(db, up)  # fwd: b = x @ W3
    return {"x": (g_gate["x"] + g_up["x"]).reshape(shape), "W1": g_gate["W"],
            "W3": g_up["W"], "W2": g_down["W"]}


def geglu_tanh_forward(x, W1, W3, W2):
    """The readable twin: gelu.geglu_forward with approximate="tanh"."""
    return gelu.geglu_forward(x, W1, W3, W2, approximate="tanh")


GEGLU_TANH = Twin((fused_geglu_forward, fused_geglu_backward),
                  (geglu_tanh_forward, gelu.geglu_backward))
