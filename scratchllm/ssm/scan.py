"""Selective scan (Mamba's S6, Gu & Dao 2023, arXiv 2312.00752): the NumPy reference pair and
the Numba-parallel pair (its kernels are in scan_kernels.py). The Mamba block built on it is
in mamba.py.

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

Glossary: B batch (the input matrix B_t is an array; the code calls the batch size `batch`), T time, d channels (Mamba's
d_inner), dp = d padded to a multiple of W, N state size, W channels per task block,
G channel groups of the backward.
"""
from typing import NamedTuple

import numba
import numpy as np

from scratchllm.core.blas import run_tasks
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_ndim,
                                      expect_shape)
from scratchllm.ssm.scan_kernels import (GROUPS, W, backward_blocks, backward_blocks_lanes,
                                         forward_blocks, forward_blocks_lanes)

_MIN_WORK = 1 << 16  # elements of output below which one thread is faster than handing off


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
    batch, T, d = x.shape
    expect_shape(fn, "delta", delta, x.shape, "(B, T, d) like x")
    expect_ndim(fn, "A", A, 2, "(d, N)")
    expect_shape(fn, "A", A, (d, None), "(d, N) with d = x.shape[-1]")
    N = A.shape[1]
    expect_shape(fn, "B", B, (batch, T, N), "(B, T, N)")
    expect_shape(fn, "C", C, (batch, T, N), "(B, T, N)")
    expect_shape(fn, "D", D, (d,), "(d,)")
    arrays = (x, delta, A, B, C, D)
    for name, a in zip("x delta A B C D".split(), arrays):
        expect_float(fn, name, a)
    return ScanCache(*(np.ascontiguousarray(a) for a in arrays))


# ---------------------------------------------------------------------------- reference
def selective_scan_forward_ref(x, delta, A, B, C, D):
    """The plain loop over time (vectorised over b, c, n): the twin of selective_scan_forward.

    Inputs:  x, delta (B, T, d); A (d, N); B, C (B, T, N); D (d,).
    Returns: y (B, T, d).  Cache: the inputs (ScanCache).
    """
    x, delta, A, B, C, D = common_float(x, delta, A, B, C, D)
    cache = _check("selective_scan_forward_ref", x, delta, A, B, C, D)
    batch, T, d = x.shape
    h = np.zeros((batch, d, A.shape[1]), x.dtype)  # (B, d, N)
    y = np.empty_like(x)  # (B, T, d)
    for t in range(T):
        y[:, t], h = selective_scan_step(x[:, t], delta[:, t], A, B[:, t], C[:, t], D, h)
    return y, cache


def check_step(fn, x_t, delta_t, A, BCD, h):
    """The shapes of one scan step: x_t, delta_t (B, d); A (d, N); B_t, C_t (B, N); D (d,);
    the state h exactly (B, d, N)."""
    expect_float(fn, "x_t", x_t)
    expect_ndim(fn, "x_t", x_t, 2, "(B, d)")
    batch, d = x_t.shape
    expect_shape(fn, "delta_t", delta_t, (batch, d), "(B, d) like x_t")
    expect_shape(fn, "A", A, (d, None), "(d, N), d = x_t.shape[1]")
    N = A.shape[1]
    B_t, C_t, D = BCD
    expect_shape(fn, "B_t", B_t, (batch, N), "(B, N)")
    expect_shape(fn, "C_t", C_t, (batch, N), "(B, N)")
    expect_shape(fn, "D", D, (d,), "(d,)")
    expect_shape(fn, "h", h, (batch, d, N), "(B, d, N): the state of every row")


def selective_scan_step(x_t, delta_t, A, B_t, C_t, D, h):
    """One step of the recurrence (the reference's loop body, and Mamba's decoding step).

    Inputs:  x_t, delta_t (B, d); A (d, N); B_t, C_t (B, N); D (d,); h (B, d, N) = h_{t-1}.
    Returns: (y_t (B, d), h_t (B, d, N)). A state of another shape (no batch axis, batch 1
    for a batch of 2) is an error, never broadcast.
    """
    check_step("selective_scan_step", x_t, delta_t, A, (B_t, C_t, D), h)
    dt = delta_t[..., None]  # (B, d, 1)
    h = np.exp(dt * A) * h + dt * B_t[:, None, :] * x_t[..., None]  # (B, d, N)
    return np.sum(h * C_t[:, None, :], axis=-1) + D * x_t, h  # (B, d), (B, d, N)


def selective_scan_backward_ref(dy, cache):
    """The adjoint scan with every state stored (B, T, d, N): the twin of the Numba backward.

    Math: the module docstring.  Reference: Gu & Dao 2023 (arXiv 2312.00752) §3.3;
    state-spaces/mamba mamba_ssm/ops/selective_scan_interface.py selective_scan_ref.
    Returns {x, delta, A, B, C, D}.
    """
    x, delta, A, B, C, D = cache
    expect_dout("selective_scan_backward_ref", dy, x.shape, x.dtype, name="dy")
    batch, T, d = x.shape
    Abar = np.exp(delta[..., None] * A)  # (B, T, d, N)
    hs = np.zeros((batch, T + 1, d, A.shape[1]), x.dtype)  # (B, T+1, d, N); hs[:, t+1] = h_t
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


def _pad(a, axis, dp):
    """Zero-pad `axis` to length dp (a multiple of W); padded channels stay exactly zero."""
    if a.shape[axis] == dp:
        return a
    width = [(0, 0)] * a.ndim
    width[axis] = (0, dp - a.shape[axis])
    return np.pad(a, width)


def _unpad(a, d):
    """The first d channels of a (..., dp) kernel output, contiguous (a itself if dp == d)."""
    return a if a.shape[-1] == d else np.ascontiguousarray(a[..., :d])


def _in_spans(kernel, tasks, work):
    """kernel(lo, hi) over `tasks` cut into one span per Numba thread (one span below _MIN_WORK
    elements of output): the kernels are serial and release the GIL, so Python threads run
    the spans side by side (a parallel Numba loop costs far more to compile, and its workers
    keep spinning after it returns); each task writes its own rows, so the bits do not depend
    on the thread count."""
    n = min(tasks, numba.get_num_threads() if work >= _MIN_WORK else 1)
    run_tasks(lambda i: kernel(tasks * i // n, tasks * (i + 1) // n), n, n)


def selective_scan_forward(x, delta, A, B, C, D):
    """Selective scan, Numba-parallel over (batch, block of W channels) tasks.

    Inputs:  x, delta (B, T, d) (delta is Δ > 0, already softplus-ed); A (d, N);
             B, C (B, T, N); D (d,); one float dtype.
    Returns: y (B, T, d).  Cache: the inputs only (ScanCache): no (B, T, d, N) states.
    """
    x, delta, A, B, C, D = common_float(x, delta, A, B, C, D)
    cache = _check("selective_scan_forward", x, delta, A, B, C, D)
    d = x.shape[-1]
    dp = -(-d // W) * W
    y = np.empty(x.shape[:2] + (dp,), x.dtype)  # (B, T, dp)
    args = (_pad(cache.x, 2, dp), _pad(cache.delta, 2, dp), _pad(cache.A.T, 1, dp).copy(),
            cache.B, cache.C, _pad(cache.D, 0, dp), y)
    kernel = forward_blocks_lanes if x.dtype == np.float32 else forward_blocks  # (Lanes16)
    _in_spans(lambda lo, hi: kernel(*args, lo, hi), x.shape[0] * (dp // W), y.size)
    return _unpad(y, d), cache


def selective_scan_backward(dy, cache):
    """Reverse-time adjoint scan, recomputing states per block; deterministic reductions.

    Math: the module docstring (λ_t = C_t dy_t + Ā_{t+1} λ_{t+1}, ...).
    Reference: state-spaces/mamba csrc/selective_scan/selective_scan_bwd_kernel.cuh (the
    backward recomputes the states instead of storing them).
    Returns {x, delta, A, B, C, D}.
    """
    x, delta, A, B, C, D = cache
    expect_dout("selective_scan_backward", dy, x.shape, x.dtype, name="dy")
    batch, T, d = x.shape
    N, dp = A.shape[1], -(-d // W) * W
    G = min(dp // W, GROUPS)
    dx, ddelta = np.empty((batch, T, dp), x.dtype), np.empty((batch, T, dp), x.dtype)  # (B, T, dp)
    dAT_b = np.empty((batch, N, dp), x.dtype)  # (B, N, dp)
    dBC_g = np.empty((batch, G, T, N, 2), x.dtype)  # (B, G, T, N, 2)
    dD_b = np.zeros((batch, dp), x.dtype)  # (B, dp)
    dyp = _pad(np.ascontiguousarray(dy, dtype=x.dtype), 2, dp)  # (B, T, dp)
    args = (dyp, _pad(x, 2, dp), _pad(delta, 2, dp), _pad(A.T, 1, dp).copy(), B, C,
            _pad(D, 0, dp), G, dx, ddelta, dAT_b, dBC_g, dD_b)
    kernel = backward_blocks_lanes if x.dtype == np.float32 else backward_blocks  # (Lanes16)
    _in_spans(lambda lo, hi: kernel(*args, lo, hi), batch * G, dx.size)
    dBC = _fixed_sum(dBC_g, 1)  # (B, T, N, 2)
    return {"x": _unpad(dx, d), "delta": _unpad(ddelta, d),
            "A": _fixed_sum(dAT_b)[:, :d].T.copy(), "B": dBC[..., 0].copy(),
            "C": dBC[..., 1].copy(), "D": _fixed_sum(dD_b)[:d].copy()}


def _fixed_sum(parts, axis=0):
    """Sum partials along `axis` one slice after another: a fixed order, so fixed bits."""
    parts = np.moveaxis(parts, axis, 0)
    total = parts[0].copy()
    for p in parts[1:]:
        total += p
    return total
