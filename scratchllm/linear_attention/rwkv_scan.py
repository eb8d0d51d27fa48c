"""RWKV-4's WKV as a training pair in the recurrent form: the stabilised forward scan and its
reverse-time adjoint, in O(B·T·D) memory (the parallel form in rwkv.py holds a (B, D, T, T)
softmax: 1 GiB of float32 at B 4, T 1024, D 256). The NumPy pair (`_ref`, a loop over T
vectorised over batch and channels) and its Numba twin (one task per batch row and block of
channels, in parallel) compute the same numbers.

Per channel (w > 0 the decay, u the bonus), with the unnormalised sums over the past
    A_t = Σ_{i<t} e^{k_i − (t−1−i) w} v_i,   B_t = Σ_{i<t} e^{k_i − (t−1−i) w}   (A_0 = B_0 = 0)
    A_{t+1} = e^{−w} A_t + e^{k_t} v_t,      B_{t+1} = e^{−w} B_t + e^{k_t}
    y_t = (A_t + e^{u+k_t} v_t) / Z_t,       Z_t = B_t + e^{u+k_t}
The forward keeps a_t = A_t e^{−p_t}, b_t = B_t e^{−p_t} with p_t the running max exponent
(rwkv.py), and stores (a_t, b_t, p_t), the state *before* step t, for the backward.

Backward. y_t reads A_t with weight 1/Z_t and B_t with −y_t/Z_t; with g_t = dy_t / Z_t the
adjoints λ_t = ∂L/∂A_t, μ_t = ∂L/∂B_t run backwards in time (λ_T = μ_T = 0):
    λ_t = g_t + e^{−w} λ_{t+1},              μ_t = −g_t y_t + e^{−w} μ_{t+1}
and each input's gradient is its direct use in y_t plus its write into A_{t+1}, B_{t+1}:
    dv_t = g_t e^{u+k_t} + e^{k_t} λ_{t+1}
    dk_t = g_t e^{u+k_t} (v_t − y_t) + e^{k_t} (v_t λ_{t+1} + μ_{t+1})
    du   = Σ_t g_t e^{u+k_t} (v_t − y_t)
    dw   = −Σ_t e^{−w} (λ_{t+1} A_t + μ_{t+1} B_t)          (∂A_{t+1}/∂w = −e^{−w} A_t)
Stabilised: Z_t = e^{q_t} z_t with q_t = max(p_t, u + k_t), z_t = e^{p_t−q_t} b_t + e^{u+k_t−q_t},
so g_t = γ_t e^{−q_t} with γ_t = dy_t / z_t, and g_t e^{u+k_t} = γ_t e^{u+k_t−q_t}. The adjoints
are kept as (λ_t, μ_t) = e^{s_t} (l_t, m_t), s_t the running max of their exponents:
    s_t = max(s_{t+1} − w, −q_t)
    l_t = e^{s_{t+1}−w−s_t} l_{t+1} + e^{−q_t−s_t} γ_t,   m_t = e^{s_{t+1}−w−s_t} m_{t+1} − e^{−q_t−s_t} γ_t y_t
Every exponent is ≤ 0: s_{t+1} is the max over τ > t of −q_τ − (τ−t−1) w, and
q_τ ≥ p_τ ≥ p_{t+1} − (τ−t−1) w with p_{t+1} = max(p_t − w, k_t), so s_{t+1} ≤ −p_{t+1} and
    e^{k_t} λ_{t+1} = e^{k_t + s_{t+1}} l_{t+1},   e^{−w} λ_{t+1} A_t = e^{p_t − w + s_{t+1}} l_{t+1} a_t
have factors e^{k_t + s_{t+1}} ≤ 1 and e^{p_t − w + s_{t+1}} ≤ 1: nothing overflows in float32.
(Upstream's CUDA kernel sums dw forward in time instead; this is the same adjoint.)

Glossary: B batch, T time, D channels; a, b, p (B, T, D) the stored states; l, m, s the
scaled adjoints (B, D); NEG the running max's start (−1e38, as upstream).
"""
from typing import NamedTuple

import numba
import numpy as np

from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_ndim,
                                      expect_shape)
from scratchllm.linear_attention.lanes import run_spans

NEG = -1e38
BLOCK = 32  # channels per Numba task


class WKVScanCache(NamedTuple):
    w: np.ndarray
    u: np.ndarray
    k: np.ndarray
    v: np.ndarray
    y: np.ndarray
    a: np.ndarray  # (B, T, D) numerator before step t, divided by e^p
    b: np.ndarray  # (B, T, D) denominator before step t, divided by e^p
    p: np.ndarray  # (B, T, D) the running max exponent before step t


def check_wkv(fn, w, u, k, v):
    """Shapes and dtypes of the WKV inputs: k, v (B, T, D); w, u (D,)."""
    expect_ndim(fn, "k", k, 3, "(B, T, D)")
    for name, a in (("w", w), ("u", u), ("k", k), ("v", v)):
        expect_float(fn, name, a)
    expect_shape(fn, "v", v, k.shape, "the shape of k")
    for name, a in (("w", w), ("u", u)):
        expect_shape(fn, name, a, (k.shape[2],), "(D,): one per channel")


# ---------------------------------------------------------------------------- reference
def rwkv4_wkv_scan_forward_ref(w, u, k, v):
    """The stabilised scan, a loop over T on (B, D) arrays, storing each step's state.
    Returns y (B, T, D) and a WKVScanCache."""
    w, u, k, v = common_float(w, u, k, v)
    check_wkv("rwkv4_wkv_scan", w, u, k, v)
    y, a, b, p = (np.empty_like(k) for _ in range(4))  # (B, T, D) each
    at, bt, pt = np.zeros_like(k[:, 0]), np.zeros_like(k[:, 0]), np.full_like(k[:, 0], NEG)
    for t in range(k.shape[1]):
        a[:, t], b[:, t], p[:, t] = at, bt, pt
        q = np.maximum(pt, u + k[:, t])  # (B, D)
        e1, e2 = np.exp(pt - q), np.exp(u + k[:, t] - q)
        y[:, t] = (e1 * at + e2 * v[:, t]) / (e1 * bt + e2)
        q = np.maximum(pt - w, k[:, t])
        e1, e2 = np.exp(pt - w - q), np.exp(k[:, t] - q)
        at, bt, pt = e1 * at + e2 * v[:, t], e1 * bt + e2, q
    return y, WKVScanCache(w, u, k, v, y, a, b, p)


def rwkv4_wkv_scan_backward_ref(dy, cache):
    """Math: the reverse-time adjoint of the module docstring, a loop over T on (B, D).
    Reference: Peng et al. 2023, arXiv 2305.13048 (derived in this module's docstring);
    upstream `BlinkDL/RWKV-LM RWKV-v4/cuda/wkv_cuda.cu` (kernel_backward sums dw forward)."""
    w, u, k, v, y, a, b, p = cache
    expect_dout("rwkv4_wkv_scan_backward_ref", dy, y.shape, y.dtype, "dy")
    dk, dv = np.empty_like(k), np.empty_like(v)  # (B, T, D)
    dw, du = np.zeros_like(k[:, 0]), np.zeros_like(k[:, 0])  # (B, D), summed over B at the end
    l, m, s = np.zeros_like(dw), np.zeros_like(dw), np.full_like(dw, NEG)  # λ_{t+1}, μ_{t+1}
    for t in reversed(range(k.shape[1])):
        kt, vt, yt = k[:, t], v[:, t], y[:, t]  # (B, D)
        q = np.maximum(p[:, t], u + kt)
        e1, e2 = np.exp(p[:, t] - q), np.exp(u + kt - q)
        gamma = dy[:, t] / (e1 * b[:, t] + e2)  # g_t = γ_t e^{−q_t}
        ek, ep = np.exp(kt + s), np.exp(p[:, t] - w + s)  # both <= 1
        dv[:, t] = gamma * e2 + ek * l
        dk[:, t] = gamma * e2 * (vt - yt) + ek * (vt * l + m)
        du += gamma * e2 * (vt - yt)
        dw -= ep * (l * a[:, t] + m * b[:, t])
        s_new = np.maximum(s - w, -q)  # λ_t = g_t + e^{−w} λ_{t+1}, rescaled to e^{s_t}
        r, g = np.exp(s - w - s_new), np.exp(-q - s_new) * gamma
        l, m, s = r * l + g, r * m - g * yt, s_new
    return {"w": dw.sum(0), "u": du.sum(0), "k": dk, "v": dv}


# ---------------------------------------------------------------------------- Numba twins
@numba.njit(cache=True, nogil=True)
def _forward_kernel(w, u, k, v, y, a, b, p, lo, hi):  # pragma: no cover (compiled)
    """The scan of rwkv4_wkv_scan_forward_ref; one task per (batch row, block of channels),
    the tasks lo .. hi − 1 (a span per thread: lanes.run_spans)."""
    T, D = k.shape[1:]
    blocks = (D + BLOCK - 1) // BLOCK
    for task in range(lo, hi):
        bi, c0 = task // blocks, (task % blocks) * BLOCK
        c1 = min(c0 + BLOCK, D)
        at, bt = np.zeros(c1 - c0, k.dtype), np.zeros(c1 - c0, k.dtype)  # in k's dtype, as
        pt = np.full(c1 - c0, NEG, k.dtype)  # the _ref (float64 state: exps 1.7x slower)
        for t in range(T):
            for c in range(c0, c1):
                j = c - c0
                a[bi, t, c], b[bi, t, c], p[bi, t, c] = at[j], bt[j], pt[j]
                kk, vv = k[bi, t, c], v[bi, t, c]
                q = max(pt[j], u[c] + kk)
                e1, e2 = np.exp(pt[j] - q), np.exp(u[c] + kk - q)
                y[bi, t, c] = (e1 * at[j] + e2 * vv) / (e1 * bt[j] + e2)
                q = max(pt[j] - w[c], kk)
                e1, e2 = np.exp(pt[j] - w[c] - q), np.exp(kk - q)
                at[j], bt[j], pt[j] = e1 * at[j] + e2 * vv, e1 * bt[j] + e2, q


@numba.njit(cache=True, nogil=True)
def _backward_kernel(w, u, k, v, y, a, b, p, dy, dk, dv, dw, du, lo, hi):  # pragma: no cover
    """The adjoint of rwkv4_wkv_scan_backward_ref for the tasks lo .. hi − 1; dw, du (B, D)
    summed over B by the caller."""
    T, D = k.shape[1:]
    blocks = (D + BLOCK - 1) // BLOCK
    for task in range(lo, hi):
        bi, c0 = task // blocks, (task % blocks) * BLOCK
        for c in range(c0, min(c0 + BLOCK, D)):
            zero = k.dtype.type(0)  # the adjoints in k's dtype, as the _ref
            l, m, s, gw, gu = zero, zero, k.dtype.type(NEG), zero, zero
            for t in range(T - 1, -1, -1):
                kk, vv, yy, pp = k[bi, t, c], v[bi, t, c], y[bi, t, c], p[bi, t, c]
                q = max(pp, u[c] + kk)
                e1, e2 = np.exp(pp - q), np.exp(u[c] + kk - q)
                gamma = dy[bi, t, c] / (e1 * b[bi, t, c] + e2)
                ek, ep = np.exp(kk + s), np.exp(pp - w[c] + s)
                dv[bi, t, c] = gamma * e2 + ek * l
                dk[bi, t, c] = gamma * e2 * (vv - yy) + ek * (vv * l + m)
                gu += gamma * e2 * (vv - yy)
                gw -= ep * (l * a[bi, t, c] + m * b[bi, t, c])
                s_new = max(s - w[c], -q)
                r, g = np.exp(s - w[c] - s_new), np.exp(-q - s_new) * gamma
                l, m, s = r * l + g, r * m - g * yy, s_new
            dw[bi, c], du[bi, c] = gw, gu


def _tasks(k):
    """The kernels' task count for k (B, T, D): batch rows × blocks of BLOCK channels."""
    return k.shape[0] * -(-k.shape[2] // BLOCK)


def _contiguous(*arrays):
    return [np.ascontiguousarray(x) for x in arrays]


def rwkv4_wkv_scan_forward(w, u, k, v):
    """The Numba twin of rwkv4_wkv_scan_forward_ref (same inputs, same cache)."""
    w, u, k, v = common_float(w, u, k, v)
    check_wkv("rwkv4_wkv_scan", w, u, k, v)
    w, u, k, v = _contiguous(w, u, k, v)
    y, a, b, p = (np.empty_like(k) for _ in range(4))  # (B, T, D) each
    run_spans(lambda lo, hi: _forward_kernel(w, u, k, v, y, a, b, p, lo, hi), _tasks(k), y.size)
    return y, WKVScanCache(w, u, k, v, y, a, b, p)


def rwkv4_wkv_scan_backward(dy, cache):
    """The Numba twin of rwkv4_wkv_scan_backward_ref.
    Reference: Peng et al. 2023, arXiv 2305.13048 (the derivation in the module docstring)."""
    expect_dout("rwkv4_wkv_scan_backward", dy, cache.y.shape, cache.y.dtype, "dy")
    dk, dv = np.empty_like(cache.k), np.empty_like(cache.v)  # (B, T, D)
    dw, du = (np.empty_like(cache.k[:, 0]) for _ in range(2))  # (B, D)
    args = (*cache, np.ascontiguousarray(dy), dk, dv, dw, du)
    run_spans(lambda lo, hi: _backward_kernel(*args, lo, hi), _tasks(dk), dk.size)
    return {"w": dw.sum(0), "u": du.sum(0), "k": dk, "v": dv}
