"""Selective scan (Mamba's S6, Gu & Dao 2023): a NumPy reference and a Numba-parallel
forward/backward. The Mamba block built on it lives in mamba.py (re-exported here).

An LTI SSM is both a recurrence and a convolution; a *selective* SSM has Δ, B, C that change
with t, so it has no kernel: it is only a recurrence, and it needs a scan.

Math, per batch b, channel c (a "lane"), state n, time t (diagonal A, real):
    Ā_t = exp(Δ_t A)                 (ZOH for A)
    B̄_t = Δ_t B_t                    (Euler for B, as mamba's selective_scan_ref)
    h_t = Ā_t ⊙ h_{t-1} + B̄_t x_t    h_{-1} = 0
    y_t = <C_t, h_t> + D x_t
Backward (reverse-time adjoint scan; λ_t = dL/dh_t, Ā_T = 0):
    λ_t = C_t dy_t + Ā_{t+1} ⊙ λ_{t+1}
    dΔ_t = Σ_n λ_t (h_{t-1} Ā_t A + B_t x_t)      dA = Σ_{b,t} λ_t h_{t-1} Ā_t Δ_t
    dB_t = Σ_c λ_t Δ_t x_t                        dC_t = Σ_c dy_t h_t
    dx_t = D dy_t + Σ_n λ_t Δ_t B_t               dD = Σ_{b,t} dy_t x_t

Parallel layout: every (b, c) lane is an independent recurrence, so the Numba forward runs
lanes in `prange`. The backward runs tasks (b, channel group): a task recomputes each of its
lanes' states into a task-local (T, N) buffer (the cache holds only the inputs), runs the
adjoint scan, and adds its lanes' dB, dC into its own partial; the partials and the per-b dA,
dD are summed in a fixed order outside prange. Groups depend on d only, so the bits are the
same for any thread count. Memory: O(B·T·(d + N·G)) plus O(threads·T·N), G = min(d, 8).

Glossary: B batch (also the input matrix B_t, by context), T time, d channels (Mamba's
d_inner), N state size, G channel groups of the backward.
"""
from typing import NamedTuple

import numpy as np
from numba import njit, prange

from scratchllm.validate import expect_float, expect_ndim, expect_shape

GROUPS = 8  # channel groups per batch row in the backward: fixes the reduction order


class ScanCache(NamedTuple):
    x: np.ndarray
    delta: np.ndarray
    A: np.ndarray
    B: np.ndarray
    C: np.ndarray
    D: np.ndarray


def _check(fn, x, delta, A, B, C, D):
    """Validate shapes and a common float dtype; return C-contiguous arrays."""
    expect_float(fn, "x", x)
    expect_ndim(fn, "x", x, 3, "(B, T, d)")
    Bt, T, d = x.shape
    expect_shape(fn, "delta", delta, x.shape, "(B, T, d) like x")
    expect_ndim(fn, "A", A, 2, "(d, N)")
    expect_shape(fn, "A", A, (d, None), "(d, N) with d = x.shape[-1]")
    N = A.shape[1]
    expect_shape(fn, "B", B, (Bt, T, N), "(B, T, N)")
    expect_shape(fn, "C", C, (Bt, T, N), "(B, T, N)")
    expect_shape(fn, "D", D, (d,), "(d,)")
    arrays = (x, delta, A, B, C, D)
    for name, a in zip("x delta A B C D".split(), arrays):
        expect_float(fn, name, a)
        if a.dtype != x.dtype:
            raise TypeError(f"{fn}: {name} has dtype {a.dtype}, expected {x.dtype} like x")
    return ScanCache(*(np.ascontiguousarray(a) for a in arrays))


# ---------------------------------------------------------------------------- reference
def selective_scan_ref(x, delta, A, B, C, D):
    """The plain loop over time (vectorised over b, c, n): the twin of selective_scan_forward.

    Inputs:  x, delta (B, T, d); A (d, N); B, C (B, T, N); D (d,).
    Returns: y (B, T, d).  Cache: the inputs (ScanCache).
    """
    cache = _check("selective_scan_ref", x, delta, A, B, C, D)
    Bt, T, d = x.shape
    h = np.zeros((Bt, d, A.shape[1]), x.dtype)  # (B, d, N)
    y = np.empty_like(x)  # (B, T, d)
    for t in range(T):
        y[:, t], h = selective_scan_step(x[:, t], delta[:, t], A, B[:, t], C[:, t], D, h)
    return y, cache


def selective_scan_step(x_t, delta_t, A, B_t, C_t, D, h):
    """One step of the recurrence (the reference's loop body, and Mamba's decoding step).

    Inputs:  x_t, delta_t (B, d); A (d, N); B_t, C_t (B, N); D (d,); h (B, d, N) = h_{t-1}.
    Returns: (y_t (B, d), h_t (B, d, N)).
    """
    dt = delta_t[..., None]  # (B, d, 1)
    h = np.exp(dt * A) * h + dt * B_t[:, None, :] * x_t[..., None]  # (B, d, N)
    return np.sum(h * C_t[:, None, :], axis=-1) + D * x_t, h  # (B, d), (B, d, N)


def selective_scan_ref_backward(dy, cache):
    """The adjoint scan with every state stored (B, T, d, N): the twin of the Numba backward.

    Math: the module docstring.  Reference: REFERENCE §5 (selective-scan backward).
    Returns {x, delta, A, B, C, D}.
    """
    x, delta, A, B, C, D = cache
    Bt, T, d = x.shape
    Abar = np.exp(delta[..., None] * A)  # (B, T, d, N)
    hs = np.zeros((Bt, T + 1, d, A.shape[1]), x.dtype)  # (B, T+1, d, N); hs[:, t+1] = h_t
    for t in range(T):  # fwd: h_t = Ā_t h_{t-1} + Δ_t B_t x_t
        hs[:, t + 1] = Abar[:, t] * hs[:, t] + (delta[:, t, :, None] * B[:, t, None, :]
                                                 * x[:, t, :, None])
    lams = np.empty_like(Abar)  # (B, T, d, N)
    lam = np.zeros_like(hs[:, 0])  # (B, d, N)
    for t in reversed(range(T)):  # λ_t = C_t dy_t + Ā_{t+1} λ_{t+1}
        carry = Abar[:, t + 1] * lam if t + 1 < T else 0
        lam = C[:, t, None, :] * dy[:, t, :, None] + carry  # (B, d, N)
        lams[:, t] = lam
    hprev_a = hs[:, :-1] * Abar  # (B, T, d, N): h_{t-1} Ā_t
    return {
        "x": dy * D + delta * np.einsum("btdn,btn->btd", lams, B),
        "delta": np.sum(lams * (hprev_a * A + B[:, :, None, :] * x[..., None]), axis=-1),
        "A": np.einsum("btdn,btd->dn", lams * hprev_a, delta),
        "B": np.einsum("btdn,btd->btn", lams, delta * x),
        "C": np.einsum("btd,btdn->btn", dy, hs[:, 1:]),
        "D": np.sum(dy * x, axis=(0, 1)),
    }


# ---------------------------------------------------------------------------- Numba kernels
@njit(parallel=True, cache=True, fastmath=False)
def _forward_lanes(x, delta, A, B, C, D, y):
    """y[b, :, c] for every lane (b, c) in parallel; the state h (N,) is lane-local."""
    Bt, T, d = x.shape
    N = A.shape[1]
    for lane in prange(Bt * d):
        b, c = lane // d, lane % d
        h = np.zeros(N, x.dtype)  # (N,)
        for t in range(T):
            dt, xt = delta[b, t, c], x[b, t, c]
            dtx = dt * xt
            acc = D[c] * xt
            for n in range(N):
                h[n] = np.exp(dt * A[c, n]) * h[n] + dtx * B[b, t, n]
                acc += C[b, t, n] * h[n]
            y[b, t, c] = acc


@njit(parallel=True, cache=True, fastmath=False)
def _backward_tasks(dy, x, delta, A, B, C, D, G, dx, ddelta, dA_b, dB_g, dC_g, dD_b):
    """Adjoint scan per task (b, group g); each lane's states recomputed in task buffers.

    Writes dx, ddelta (B, T, d) and the partials dA_b (B, d, N), dD_b (B, d) per lane, and
    dB_g, dC_g (B, G, T, N) per task (lanes of a group add in channel order)."""
    Bt, T, d = x.shape
    N = A.shape[1]
    for task in prange(Bt * G):
        b, g = task // G, task % G
        hs = np.zeros((T + 1, N), x.dtype)  # (T+1, N): hs[t+1] = h_t, hs[0] = 0
        ab = np.zeros((T + 1, N), x.dtype)  # (T+1, N): ab[t] = Ā_t, ab[T] = 0
        lam = np.empty(N, x.dtype)  # (N,)
        zero = x.dtype.type(0)
        for c in range(g * d // G, (g + 1) * d // G):
            for t in range(T):  # fwd: h_t = Ā_t h_{t-1} + Δ_t x_t B_t
                dt = delta[b, t, c]
                dtx = dt * x[b, t, c]
                for n in range(N):
                    ab[t, n] = np.exp(dt * A[c, n])
                    hs[t + 1, n] = ab[t, n] * hs[t, n] + dtx * B[b, t, n]
            lam[:] = 0
            gD = zero
            for t in range(T - 1, -1, -1):
                dyt, dt, xt = dy[b, t, c], delta[b, t, c], x[b, t, c]
                dtx = dt * xt
                gdt = zero
                gx = dyt * D[c]  # fwd: y_t += D x_t
                for n in range(N):
                    lam[n] = C[b, t, n] * dyt + ab[t + 1, n] * lam[n]  # λ_t
                    hpa = hs[t, n] * ab[t, n]  # h_{t-1} Ā_t
                    gdt += lam[n] * (hpa * A[c, n] + B[b, t, n] * xt)
                    gx += lam[n] * dt * B[b, t, n]
                    dA_b[b, c, n] += lam[n] * hpa * dt
                    dB_g[b, g, t, n] += lam[n] * dtx
                    dC_g[b, g, t, n] += dyt * hs[t + 1, n]  # fwd: y_t = <C_t, h_t>
                ddelta[b, t, c] = gdt
                dx[b, t, c] = gx
                gD += dyt * xt  # fwd: y_t += D x_t
            dD_b[b, c] = gD


def selective_scan_forward(x, delta, A, B, C, D):
    """Selective scan, Numba-parallel over (batch, channel) lanes.

    Inputs:  x, delta (B, T, d) (delta is Δ > 0, already softplus-ed); A (d, N);
             B, C (B, T, N); D (d,); one float dtype.
    Returns: y (B, T, d).  Cache: the inputs only (ScanCache): no (B, T, d, N) states.
    """
    cache = _check("selective_scan_forward", x, delta, A, B, C, D)
    y = np.empty_like(cache.x)  # (B, T, d)
    _forward_lanes(*cache, y)
    return y, cache


def selective_scan_backward(dy, cache):
    """Reverse-time adjoint scan, recomputing states per lane; deterministic reductions.

    Math: the module docstring (λ_t = C_t dy_t + Ā_{t+1} λ_{t+1}, ...).
    Reference: REFERENCE §5; mamba's selective_scan backward (recompute, not store).
    Returns {x, delta, A, B, C, D}.
    """
    x = cache.x
    Bt, T, d = x.shape
    N = cache.A.shape[1]
    G = min(d, GROUPS)
    dx, ddelta = np.empty_like(x), np.empty_like(x)  # (B, T, d)
    dA_b = np.zeros((Bt, d, N), x.dtype)  # (B, d, N)
    dB_g = np.zeros((Bt, G, T, N), x.dtype)  # (B, G, T, N)
    dC_g = np.zeros((Bt, G, T, N), x.dtype)  # (B, G, T, N)
    dD_b = np.empty((Bt, d), x.dtype)  # (B, d)
    dy = np.ascontiguousarray(dy, dtype=x.dtype)  # (B, T, d)
    _backward_tasks(dy, *cache, G, dx, ddelta, dA_b, dB_g, dC_g, dD_b)
    return {"x": dx, "delta": ddelta, "A": _fixed_sum(dA_b), "B": _fixed_sum(dB_g, 1),
            "C": _fixed_sum(dC_g, 1), "D": _fixed_sum(dD_b)}


def _fixed_sum(parts, axis=0):
    """Sum partials along `axis` one slice after another: a fixed order, so fixed bits."""
    parts = np.moveaxis(parts, axis, 0)
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    return total


def __getattr__(name):
    """`from scratchllm.scan import Mamba` (and the block's pairs) without an import cycle:
    the Mamba block lives in mamba.py, which imports this module."""
    if name in ("Mamba", "mamba_forward", "mamba_backward", "mamba_step"):
        from scratchllm import mamba
        return getattr(mamba, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
