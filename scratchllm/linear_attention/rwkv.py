"""RWKV-4's WKV operator (Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer Era",
arXiv 2305.13048, equations 14-19; upstream `BlinkDL/RWKV-LM RWKV-v4/cuda/wkv_cuda.cu` and
`RWKV-v4/src/model.py`, where the kernel's w is −exp(time_decay)).

Per channel, with decay rate w > 0 and the bonus u of the current token:
    wkv_t = (Σ_{i<t} e^{−(t−1−i) w + k_i} v_i + e^{u + k_t} v_t)
          / (Σ_{i<t} e^{−(t−1−i) w + k_i}     + e^{u + k_t})
Parallel: a softmax over i ≤ t of the logits L_ti = k_i − (t−1−i) w (i < t), u + k_t (i = t),
    wkv_t = Σ_i softmax_i(L_t·) v_i                      (the core softmax pair, max-shifted)
Recurrent (constant memory), the sums a (numerator), b (denominator) kept divided by e^p,
p the running max of the exponents, so nothing overflows:
    q = max(p, u + k_t);  wkv_t = (e^{p−q} a + e^{u+k_t−q} v_t) / (e^{p−q} b + e^{u+k_t−q})
    q' = max(p − w, k_t); a ← e^{p−w−q'} a + e^{k_t−q'} v_t; b ← e^{p−w−q'} b + e^{k_t−q'}; p ← q'
Backward: of the parallel form, the softmax backward (dk_i = Σ_t dL_ti,
dw = −Σ_{i<t} (t−1−i) dL_ti, du = Σ_t dL_tt); of the recurrent form, the reverse-time adjoint
of the stabilised scan (rwkv_scan.py, derived there), in O(B·T·D) memory instead of the
softmax's O(B·D·T²): the default, and what RWKV4TimeMix trains with.

Glossary: B batch, T time, D channels (RWKV's C); w, u (D,) decay and bonus; a, b, p the
state (B, D) each.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.ops import softmax_backward, softmax_forward
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_ndim,
                                      expect_shape)
from scratchllm.linear_attention.rwkv_scan import (WKVScanCache, check_wkv,
                                                   rwkv4_wkv_scan_backward,
                                                   rwkv4_wkv_scan_forward)


class WKVCache(NamedTuple):
    v: np.ndarray
    softmax: tuple  # the softmax pair's cache over (B, D, T, T)


def _lags(T, dtype):
    """(t − 1 − i) for i < t, 0 elsewhere (in dtype), and the masks i < t, i == t: (T, T)."""
    t, i = np.arange(T)[:, None], np.arange(T)[None, :]
    return np.where(i < t, t - 1 - i, 0).astype(dtype), i < t, i == t


def rwkv4_wkv_forward(w, u, k, v, *, form="recurrent"):
    """WKV in the recurrent form (the Numba scan, O(B·T·D) memory) or the parallel (softmax)
    form. Inputs: w, u (D,); k, v (B, T, D). Returns: wkv (B, T, D).
    Cache: the scan's states (B, T, D), or v and the softmax cache (B, D, T, T)."""
    w, u, k, v = common_float(w, u, k, v)
    if form not in ("recurrent", "parallel"):
        raise ValueError(f"rwkv4_wkv: form must be 'recurrent' or 'parallel', got {form!r}")
    if form == "recurrent":
        return rwkv4_wkv_scan_forward(w, u, k, v)
    check_wkv("rwkv4_wkv", w, u, k, v)
    T = k.shape[1]
    lag, past, now = _lags(T, k.dtype)  # (T, T)
    kt = np.swapaxes(k, 1, 2)[:, :, None, :]  # (B, D, 1, T) k_i along the last axis
    L = np.where(past, kt - lag * w[:, None, None], -np.inf)  # (B, D, T, T)
    L = np.where(now, kt + u[:, None, None], L)  # (B, D, T, T)
    P, sm = softmax_forward(L)  # (B, D, T, T)
    y = P @ np.swapaxes(v, 1, 2)[..., None]  # (B, D, T, 1)
    return np.swapaxes(y[..., 0], 1, 2), WKVCache(v, sm)  # (B, T, D)


def rwkv4_wkv_backward(dy, cache):
    """Math (parallel form; the recurrent form's adjoint is rwkv4_wkv_scan_backward):
    wkv_t = Σ_i P_ti v_i, P = softmax(L): dv_i = Σ_t P_ti dy_t, dP_ti = dy_t v_i,
    dL = softmax backward; L_ti = k_i − (t−1−i) w (i < t), u + k_t (i = t):
    dk_i = Σ_t dL_ti, dw = −Σ_{b, i<t} (t−1−i) dL_ti, du = Σ_{b,t} dL_tt.
    Reference: Peng et al. 2023, arXiv 2305.13048, appendix (the WKV gradients, derived
    here).
    """
    y = cache.y if isinstance(cache, WKVScanCache) else cache.v  # the output's shape, dtype
    expect_dout("rwkv4_wkv_backward", dy, y.shape, y.dtype, "dy")
    if isinstance(cache, WKVScanCache):
        return rwkv4_wkv_scan_backward(dy, cache)
    v, sm = cache
    P = sm.y  # (B, D, T, T)
    dyt, vt = np.swapaxes(dy, 1, 2), np.swapaxes(v, 1, 2)  # (B, D, T)
    # fwd: y_t = sum_i P_ti v_i  ->  dv_i = sum_t P_ti dy_t, dP_ti = dy_t v_i
    dv = np.swapaxes(np.einsum("bdti,bdt->bdi", P, dyt), 1, 2)  # (B, T, D)
    dL = softmax_backward(dyt[..., :, None] * vt[..., None, :], sm)["x"]  # (B, D, T, T)
    lag, past, now = _lags(dy.shape[1], dy.dtype)
    return {"w": -(dL * (lag * past)).sum(axis=(0, 2, 3)), "u": (dL * now).sum(axis=(0, 2, 3)),
            "k": np.swapaxes(dL.sum(axis=2), 1, 2), "v": dv}


class WKVState(NamedTuple):
    """The recurrent state: numerator a and denominator b, both divided by e^p."""
    a: np.ndarray  # (B, D)
    b: np.ndarray  # (B, D)
    p: np.ndarray  # (B, D) the running max exponent (−1e38 at the start, as upstream)


def check_wkv_state(fn, name, state, shape):
    """A decoding state of the WKV: None, or (a, b, p) each exactly `shape` (B, D), never
    broadcast."""
    if state is None:
        return
    if not (isinstance(state, tuple) and len(state) == 3):
        raise TypeError(f"{fn}: {name} must be a WKVState (a, b, p) or None, got "
                        f"{type(state).__name__}")
    for field, a in zip(WKVState._fields, state):
        expect_shape(fn, f"{name}.{field}", a, shape, "(B, D) of this step's rows")


def rwkv4_wkv_step(w, u, k_t, v_t, state):
    """One stabilised step. k_t, v_t (B, D); state a WKVState or None. Returns (wkv_t, state)."""
    fn = "rwkv4_wkv_step"
    expect_ndim(fn, "k_t", k_t, 2, "(B, D)")
    for name, a in (("w", w), ("u", u), ("k_t", k_t), ("v_t", v_t)):
        expect_float(fn, name, a)
    expect_shape(fn, "v_t", v_t, k_t.shape, "(B, D) like k_t")
    for name, a in (("w", w), ("u", u)):
        expect_shape(fn, name, a, k_t.shape[1:], "(D,): one per channel")
    check_wkv_state(fn, "state", state, k_t.shape)
    if state is None:
        zeros = np.zeros_like(k_t)  # (B, D)
        state = WKVState(zeros, zeros, np.full_like(k_t, -1e38))
    a, b, p = state
    q = np.maximum(p, u + k_t)  # (B, D)
    e1, e2 = np.exp(p - q), np.exp(u + k_t - q)  # (B, D)
    y = (e1 * a + e2 * v_t) / (e1 * b + e2)  # (B, D)
    q = np.maximum(p - w, k_t)  # (B, D)
    e1, e2 = np.exp(p - w - q), np.exp(k_t - q)  # (B, D)
    return y, WKVState(e1 * a + e2 * v_t, e1 * b + e2, q)


def rwkv4_wkv_recurrent(w, u, k, v):
    """The stabilised recurrence over a sequence (T steps). Returns (wkv (B, T, D), state)."""
    check_wkv("rwkv4_wkv_recurrent", w, u, k, v)
    state, outs = None, []
    for t in range(k.shape[1]):
        y, state = rwkv4_wkv_step(w, u, k[:, t], v[:, t], state)
        outs.append(y)
    return np.stack(outs, axis=1), state  # (B, T, D)


def rwkv4_wkv_recurrent_ref(w, u, k, v):
    """The plain loop of upstream's CUDA kernel, one (batch, channel) lane at a time."""
    check_wkv("rwkv4_wkv_recurrent_ref", w, u, k, v)
    batch, T, D = k.shape
    y = np.zeros(k.shape, k.dtype)  # (B, T, D)
    final = [np.zeros((batch, D), k.dtype) for _ in range(3)]  # a, b, p (B, D) each
    for bi in range(batch):
        for c in range(D):
            a, b, p = 0.0, 0.0, -1e38
            for t in range(T):
                kk, vv = k[bi, t, c], v[bi, t, c]
                q = max(p, u[c] + kk)
                e1, e2 = np.exp(p - q), np.exp(u[c] + kk - q)
                y[bi, t, c] = (e1 * a + e2 * vv) / (e1 * b + e2)
                q = max(p - w[c], kk)
                e1, e2 = np.exp(p - w[c] - q), np.exp(kk - q)
                a, b, p = e1 * a + e2 * vv, e1 * b + e2, q
            for arr, val in zip(final, (a, b, p)):
                arr[bi, c] = val
    return y, WKVState(*final)
