"""Fused Numba twins of the training step's element-wise ops: RMSNorm, the SwiGLU gate and
softmax + cross-entropy (the optimizer's, AdamW and the clip's sum of squares, are in
core/fused_adamw.py). Each does in one pass over its arrays what the readable NumPy pair
(core/ops.py) does in several passes with a temporary each.

Naming: `fused_<op>_forward/backward` is the fast twin of the readable pair `<op>_forward/
backward` in ops.py, with the same signature and the same dict of gradients, and
`fused_<op>_forward_ref` / `fused_<op>_backward_ref` ARE those readable pairs (aliases: the
teaching text keeps its own name, used by drills, notebooks and grads cases).
tests/core/test_fused.py checks every twin against its `_ref` (float32 to 1e-6, float64 to
1e-12); grads/cases/core.py checks every fused backward by finite differences.
The Modules (core/nn.py) and the LM's loss run them through the Twin objects at the end of
this file (RMSNORM, SWIGLU, CROSS_ENTROPY: twins.py):
set SCRATCHLLM_READABLE=1 to run the readable pairs instead (to step through them, say); a
backward always runs the twin its forward chose, which the cache carries.

Math (the same as the readable pairs):
    rmsnorm:  y = x r g,  r = (mean(x^2) + eps)^-1/2;  dx = r (dy g - xhat mean(dy g xhat))
    swiglu:   a = x W1,  b = x W3,  m = silu(a) b (one pass),  y = m W2
    softmax + CE per row n: loss_n = logsumexp(z_n) - z_n[t_n];  dz_n = softmax(z_n) - onehot
Sums run in float64 registers (never a float64 array), in SIMD lanes (core/fused_sums.py:
a fixed reordering of the float64 additions); the outputs keep the input dtype; exp
is core/exp32.py's exp_lanes, which LLVM vectorises for float32 (np.exp for float64), called
as exp_linked (compiled once, inlined by LLVM: each kernel does not re-type its body).
Every kernel releases the GIL (nogil), so the data-parallel threads run them side by side.
A kernel that divides inside its inner loop uses error_model="numpy" (x / 0 gives inf, as in
NumPy, instead of Python's ZeroDivisionError check, whose branch stops the loop vectoriser:
the gate ran 4x slower with it).

Glossary: BT token rows, D features, F FFN hidden width, V vocabulary.
"""
from typing import NamedTuple

import numpy as np
from numba import njit

from scratchllm.core import ops
from scratchllm.core.exp32 import exp_linked
from scratchllm.core.fused_sums import dot64_exact, max_lanes, sum64
from scratchllm.core.twins import Twin
from scratchllm.core.validate import common_float, expect_dout, expect_finite, expect_gated_ffn


def _rows(a):
    """a as C-contiguous (BT, last axis) rows: a view when a is contiguous."""
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])  # (BT, D)


# ---------------------------------------------------------------------------- rmsnorm
class FusedRMSNormCache(NamedTuple):
    x: np.ndarray  # (BT, D)
    g: np.ndarray
    rstd: np.ndarray  # (BT,)
    shape: tuple


@njit(cache=True, nogil=True)
def _rmsnorm_rows(x, g, eps, y, rstd):
    BT, D = x.shape
    for i in range(BT):
        acc = dot64_exact(x[i], x[i])  # sum_j x_j^2 in float64 (fused_sums: vectorised)
        rstd[i] = 1.0 / np.sqrt(acc / D + eps)
        r = rstd[i]
        for j in range(D):
            y[i, j] = x[i, j] * r * g[j]


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _dxhat_dot_xhat(dy, g, x, r):
    """sum_j (dy_j g_j) (x_j r) in float64, reordered into lanes (core/fused_sums.py)."""
    acc = 0.0
    for j in range(x.shape[0]):
        acc += np.float64(dy[j] * g[j]) * (x[j] * r)
    return acc


@njit(cache=True, nogil=True)
def _rmsnorm_rows_backward(dy, x, g, rstd, dx, dg):
    BT, D = x.shape
    for i in range(BT):
        r = rstd[i]
        mean = _dxhat_dot_xhat(dy[i], g, x[i], r) / D  # mean(dxhat xhat)
        for j in range(D):
            dg[j] += np.float64(dy[i, j]) * (x[i, j] * r)  # dg += dy xhat
        for j in range(D):
            dx[i, j] = r * (dy[i, j] * g[j] - x[i, j] * r * mean)


def fused_rmsnorm_forward(x, g, eps=1e-5):
    """ops.rmsnorm_forward in one pass per row.  Inputs: x (..., D), g (D,).
    Returns: y (..., D).  Cache: (x rows, g, rstd (BT,), x.shape)."""
    x, g = common_float(x, g)
    ops.check_rmsnorm_inputs(x, g)
    eps = expect_finite("rmsnorm", "eps", eps, 0, open_low=True)
    xr = _rows(x)  # (BT, D)
    y = np.empty_like(xr)  # (BT, D)
    rstd = np.empty(xr.shape[0], x.dtype)  # (BT,)
    _rmsnorm_rows(xr, g, eps, y, rstd)
    odd = rstd == 0  # (BT,) the sum of squares overflowed float64, or the row holds inf:
    if odd.any():    # the readable pair's rescaling (or its NaN for an inf row) decides
        y[odd], c = ops.rmsnorm_forward(xr[odd], g, eps)
        rstd[odd] = c.rstd[:, 0]
    return y.reshape(x.shape), FusedRMSNormCache(xr, g, rstd, x.shape)


def fused_rmsnorm_backward(dy, cache):
    """Math (ops.rmsnorm_backward): xhat = x r, dxhat = dy g,
        dg = sum over rows of dy xhat,  dx = r (dxhat - xhat mean(dxhat xhat)).
    Reference: Zhang & Sennrich 2019 (arXiv 1910.07467)."""
    expect_dout("fused_rmsnorm_backward", dy, cache.shape, cache.x.dtype, name="dy")
    x, g, rstd, shape = cache
    dx = np.empty_like(x)  # (BT, D)
    dg = np.zeros(x.shape[1])  # (D,) float64 accumulator, returned in x's dtype
    _rmsnorm_rows_backward(_rows(dy), x, g, rstd, dx, dg)
    return {"x": dx.reshape(shape), "g": dg.astype(x.dtype)}


fused_rmsnorm_forward_ref = ops.rmsnorm_forward
fused_rmsnorm_backward_ref = ops.rmsnorm_backward


# ---------------------------------------------------------------------------- swiglu
class FusedSwiGLUCache(NamedTuple):
    gate: ops.LinearCache  # x @ W1
    up: ops.LinearCache  # x @ W3
    down: ops.LinearCache  # m @ W2
    a: np.ndarray  # (BT, F) = x @ W1
    b: np.ndarray  # (BT, F) = x @ W3
    shape: tuple  # x.shape


@njit(cache=True, nogil=True, error_model="numpy")
def _gate(a, b, m, one):
    """m = silu(a) * b, in a's dtype (`one` is 1 in it)."""
    BT, F = m.shape
    for i in range(BT):
        for j in range(F):
            m[i, j] = a[i, j] / (one + exp_linked(-a[i, j])) * b[i, j]


@njit(cache=True, nogil=True, error_model="numpy")
def _gate_backward(a, b, dm, da, db, one):
    """da = dm b s (1 + a (1 - s)), db = dm silu(a), s = sigmoid(a)."""
    BT, F = dm.shape
    for i in range(BT):
        for j in range(F):
            x, d = a[i, j], dm[i, j]
            s = one / (one + exp_linked(-x))
            da[i, j] = d * b[i, j] * s * (one + x * (one - s))
            db[i, j] = d * x * s


def fused_swiglu_forward(x, W1, W3, W2):
    """ops.swiglu_forward with the gate in one pass. The two up-projections are two GEMMs that
    read W1 and W3 where they are (concatenating them into one (D, 2F) GEMM would copy both
    weights on every call: at batch-1 decoding that copy costs more than the GEMVs).
    Inputs: x (..., D), W1, W3 (D, F), W2 (F, D).  Returns: y (..., D).
    Cache: the three linear caches, a, b (BT, F) and x.shape."""
    expect_gated_ffn("swiglu", x, W1, W3, W2)
    x2 = _rows(x)  # (BT, D)
    a, gate = ops.linear_forward(x2, W1)  # (BT, F)
    b, up = ops.linear_forward(x2, W3)  # (BT, F)
    m = np.empty_like(a)  # (BT, F)
    _gate(a, b, m, a.dtype.type(1))
    y, down = ops.linear_forward(m, W2)  # (BT, D)
    return y.reshape(x.shape), FusedSwiGLUCache(gate, up, down, a, b, x.shape)


def fused_swiglu_backward(dy, cache):
    """Math: fwd y = m W2 -> dm = dy W2^T, dW2 = m^T dy; fwd m = silu(a) b -> da, db (_gate);
    fwd a = x W1, b = x W3 -> dx = da W1^T + db W3^T, dW1 = x^T da, dW3 = x^T db.
    Reference: Shazeer 2020 (arXiv 2002.05202)."""
    expect_dout("fused_swiglu_backward", dy, cache.shape, ops.linear_out(cache.down)[1],
                name="dy")
    gate, up, down, a, b, _ = cache
    g_down = ops.linear_backward(_rows(dy), down)  # fwd: y = m @ W2
    da, db = np.empty_like(a), np.empty_like(b)  # (BT, F)
    _gate_backward(a, b, g_down["x"], da, db, a.dtype.type(1))  # fwd: m = silu(a) * b
    g_gate = ops.linear_backward(da, gate)  # fwd: a = x @ W1
    g_up = ops.linear_backward(db, up)  # fwd: b = x @ W3
    return {"x": (g_gate["x"] + g_up["x"]).reshape(dy.shape), "W1": g_gate["W"],
            "W3": g_up["W"], "W2": g_down["W"]}


fused_swiglu_forward_ref = ops.swiglu_forward
fused_swiglu_backward_ref = ops.swiglu_backward


# ---------------------------------------------------------------------------- cross-entropy
class FusedCrossEntropyCache(NamedTuple):
    dlogits: np.ndarray  # (BT, V): softmax - onehot on counted rows, 0 on ignored ones
    logits_shape: tuple
    n_valid: int


@njit(cache=True, nogil=True)
def _softmax_xent_rows(z, targets, ignore_index, dz, zero, minus_inf):
    """Sum over counted rows of logsumexp(z_n) - z_n[t_n]; dz = softmax - onehot."""
    BT, V = z.shape
    total = 0.0
    for i in range(BT):
        t = targets[i]
        if t == ignore_index:
            dz[i, :] = 0
            continue
        m = max_lanes(z[i], minus_inf)  # NaN logits skipped: their exp below is NaN
        if m == np.inf and _count_inf(z[i]) == 1:  # the limit: softmax one-hot on the
            total += _one_inf_row(z[i], t, dz[i])  # +inf logit, loss 0 or inf
            continue
        if not np.isfinite(m):  # a fully masked row: shift by 0 (several +inf: NaN)
            m = zero
        for j in range(V):  # vectorised: exp_linked in z's dtype
            dz[i, j] = exp_linked(z[i, j] - m)
        s = sum64(dz[i])  # float64, vectorised (fused_sums)
        total += m + np.log(s) - z[i, t]
        inv = 1.0 / s
        for j in range(V):
            dz[i, j] = dz[i, j] * inv
        dz[i, t] -= 1
    return total


@njit(cache=True, nogil=True)
def _count_inf(z):
    n = 0
    for j in range(z.shape[0]):
        n += z[j] == np.inf
    return n


@njit(cache=True, nogil=True)
def _one_inf_row(z, t, dz):
    """A row with exactly one +inf logit at its limit: dz = onehot(inf) - onehot(t); the loss
    is 0 when t is that logit, else inf (ops.log_softmax_forward's limit)."""
    for j in range(z.shape[0]):
        dz[j] = 1.0 if z[j] == np.inf else 0.0
    dz[t] -= 1
    return 0.0 if z[t] == np.inf else np.inf


def fused_cross_entropy_forward(logits, targets, ignore_index=-100):
    """ops.cross_entropy_forward in one pass over each row of logits, which also leaves the
    (unscaled) gradient softmax - onehot in the cache: no log-probabilities are stored.
    Inputs: logits (..., V), targets (...) in [0, V) or ignore_index.
    Returns: loss, a 0-d array of logits' dtype.  Cache: (dlogits (BT, V), shape, n_valid)."""
    flat_t, keep = ops.checked_targets(logits, targets, ignore_index)  # (BT,)
    z = _rows(logits)  # (BT, V)
    dz = np.empty_like(z)  # (BT, V)
    n_valid = int(keep.sum())
    # int64 targets and ignore_index whatever the caller's int type: one specialisation
    # per float dtype (the run's int32 ids and the tests' int64 compile the same kernel)
    total = _softmax_xent_rows(z, flat_t.astype(np.int64, copy=False), np.int64(ignore_index),
                               dz, z.dtype.type(0), z.dtype.type(-np.inf))
    loss = np.asarray(total / max(n_valid, 1), dtype=logits.dtype)
    return loss, FusedCrossEntropyCache(dz, logits.shape, n_valid)


def fused_cross_entropy_backward(dloss, cache):
    """Math: dlogits = dloss / n_valid * (softmax - onehot(t)) on counted rows, 0 on ignored
    ones (the forward stored softmax - onehot).
    Reference: scratchllm/core/ops.py cross_entropy_backward."""
    expect_dout("fused_cross_entropy_backward", dloss, (), cache.dlogits.dtype, name="dloss")
    dz, shape, n_valid = cache
    scale = np.asarray(dloss, dz.dtype) / dz.dtype.type(max(n_valid, 1))
    return {"logits": (dz * scale).reshape(shape)}  # (..., V)


fused_cross_entropy_forward_ref = ops.cross_entropy_forward
fused_cross_entropy_backward_ref = ops.cross_entropy_backward


# The pairs with both twins, for the Modules and the LM: each forward chooses once (use_fused)
# and its cache carries the chosen backward (twins.py).
RMSNORM = Twin((fused_rmsnorm_forward, fused_rmsnorm_backward),
               (ops.rmsnorm_forward, ops.rmsnorm_backward))
SWIGLU = Twin((fused_swiglu_forward, fused_swiglu_backward),
              (ops.swiglu_forward, ops.swiglu_backward))
CROSS_ENTROPY = Twin((fused_cross_entropy_forward, fused_cross_entropy_backward),
                     (ops.cross_entropy_forward, ops.cross_entropy_backward))
