"""Numba kernels of the selective scan (the pair that calls them is in scan.py; its NumPy twin
selective_scan_forward_ref / selective_scan_backward_ref is there too).

Parallel layout: every (b, c) lane is an independent recurrence. The Numba kernels give each
task W = 32 adjacent channels of one batch row, so the innermost loops run over channels with
a constant trip count and no reduction: LLVM turns them into SIMD code (with exp_lanes, a
vectorisable float32 exp of fused multiply-adds: vexp.py; d is zero-padded to a multiple of
W; the Numba cache tracks this file only: after editing vexp.py, touch this one). The
backward's tasks are (b, group of blocks): a task recomputes each block's states h_t and Ā_t
into task-local buffers (the cache holds only the inputs; the exp is paid once per step),
runs the adjoint scan, and sums its channels' dB, dC shares (float64: lanes added block after
block, then folded pairwise over W: _sum_lanes; float32: folded over each block's W lanes at
every t, then added block after block); those per-task partials and the per-b dA, dD are
then summed in a fixed order outside the kernel. Groups depend on d only, so the bits are the
same for any thread count. The kernels are serial over a span of tasks and release the GIL;
scan.py gives each thread a span (a prange kernel cost more to compile, and its workers kept
spinning after it returned). The float32 kernels (forward_blocks_lanes, backward_blocks_lanes)
are written on explicit 16-lane vectors (Lanes16, vexp.py): Numba disables LLVM's SLP
vectoriser, which left those loops scalar; scan.py picks them by dtype.
Compile cost (a cold cache compiles one kernel pair per dtype): every jitted callee is
optimised by LLVM again inside each caller, so the task loops hold the per-block code
directly (no per-dtype dispatch level between them), and rows are copied by loops (an
array-to-slice assignment compiles Numba's shape-mismatch error and its string formatting,
2 s of CPU): float64 forward + backward 9.0 -> 3.5 s of CPU, float32 5.0 -> 3.1 s (loaded).
Memory: O(B·T·(d + N·G)) plus O(threads·T·N·W), G = min(d/W, 2) groups.

Glossary: B batch (`batch` in code: B is the input-matrix array), T time, d channels (Mamba's
d_inner), dp = d padded to a multiple of W, N state size, W channels per task block,
G channel groups of the backward.
"""
import numpy as np
from numba import njit

from scratchllm.ssm.vexp import exp16, exp_lanes, fold16, load16, splat16, store16

W = 32  # channels per task block (two AVX-512 vectors of float32); d is zero-padded to it
GROUPS = 2  # block groups per batch row in the backward: fixes the reduction order


# ---------------------------------------------------------------------------- Numba kernels
# A task owns W adjacent channels of one batch row; the loops over those W channels have a
# constant trip count and no reduction, so LLVM turns them into SIMD code (exp_lanes: vexp.py).
# float32 kernels are written on explicit 16-lane vectors instead (vexp.Lanes16, exp16): the
# same operations per lane, the same bits, without per-(t, n) loop entries and views.
@njit(cache=True, nogil=True, fastmath=False)
def forward_blocks(x, delta, AT, B, C, D, y, lo, hi):
    """y for the tasks lo .. hi − 1 of batch · dp / W (b, block of W channels), float64 (and
    any dtype but float32): the recurrence over t, loops over the block's W channels; h (N, W)
    is task-local. A span of tasks per thread (scan.py)."""
    T, dp, N = x.shape[1], x.shape[2], AT.shape[0]
    h = np.empty((N, W), x.dtype)  # (N, W)
    acc = np.empty(W, x.dtype)  # (W,)
    for task in range(lo, hi):
        b, c0 = task // (dp // W), task % (dp // W) * W
        h[:] = 0
        for t in range(T):
            xt, dt, yt = x[b, t, c0:c0 + W], delta[b, t, c0:c0 + W], y[b, t, c0:c0 + W]
            for w in range(W):
                acc[w] = D[c0 + w] * xt[w]
            for n in range(N):
                An, Bn, Cn, hn = AT[n, c0:c0 + W], B[b, t, n], C[b, t, n], h[n]
                for w in range(W):  # h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t B_t; y_t += C_t h_t
                    hn[w] = exp_lanes(dt[w] * An[w]) * hn[w] + dt[w] * xt[w] * Bn
                    acc[w] += Cn * hn[w]
            for w in range(W):  # (a loop: an array-to-slice copy compiles a shape check)
                yt[w] = acc[w]


@njit(cache=True, nogil=True, fastmath=False)
def forward_blocks_lanes(x, delta, AT, B, C, D, y, lo, hi):
    """forward_blocks for float32 on two 16-lane vectors per block: the same operations per
    lane, so the same bits; y_t's sum over n stays in a register."""
    T, dp, N = x.shape[1], x.shape[2], AT.shape[0]
    h = np.empty((N, W), x.dtype)  # (N, W)
    for task in range(lo, hi):
        b, c0 = task // (dp // W), task % (dp // W) * W
        h[:] = 0
        for t in range(T):
            for v in range(0, W, 16):
                i = (b * T + t) * dp + c0 + v  # flat offset of [b, t, c0 + v]
                xt, dt = load16(x, i), load16(delta, i)
                dtx = dt * xt
                acc = load16(D, c0 + v) * xt  # y_t = D x_t + Σ_n C_t h_t
                for n in range(N):
                    k = n * W + v
                    hn = exp16(dt * load16(AT, n * dp + c0 + v)) * load16(h, k) + dtx * B[b, t, n]
                    store16(h, k, hn)  # h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t B_t
                    acc = acc + C[b, t, n] * hn
                store16(y, i, acc)


@njit(cache=True, fastmath=False, nogil=True)
def _recompute_block(x, delta, AT, B, b, c0, hs, ab):
    """fwd for one block: hs[t+1] = h_t (hs[0] = 0) and ab[t] = Ā_t = exp(Δ_t A), each (N, W).
    The exp is paid here once; the reverse scan only reads ab."""
    T, N = x.shape[1], AT.shape[0]
    hs[0] = 0
    for t in range(T):  # h_t = Ā_t h_{t-1} + Δ_t x_t B_t
        xt, dt = x[b, t, c0:c0 + W], delta[b, t, c0:c0 + W]
        for n in range(N):
            An, Bn, h0, h1, an = AT[n, c0:c0 + W], B[b, t, n], hs[t, n], hs[t + 1, n], ab[t, n]
            for w in range(W):  # (two loops, each writing one array: both vectorise)
                an[w] = exp_lanes(dt[w] * An[w])
            for w in range(W):
                h1[w] = an[w] * h0[w] + dt[w] * xt[w] * Bn


@njit(cache=True, fastmath=False, nogil=True)
def _adjoint_scalar(dy, x, delta, AT, B, C, D, b, c0, hs, ab, S, dA, acc, P, dx, ddelta, dAT_b,
                   dD_b):
    """Reverse-time adjoint scan of one block, reading hs and ab from _recompute_block (no exp).
    S (N, 2, W) holds λ_t and g_t = Ā_t λ_t (so λ_t = C_t dy_t + g_{t+1}); dA (N, W) sums
    g_t h_{t-1} Δ_t; P (T, N, 2, W) gathers per-channel shares of dB, dC (summed over channels
    later). Measured (LLVM remarks, assembly): most of these short loops stay scalar (Numba
    disables SLP vectorisation): float32 takes _adjoint_lanes instead."""
    T, N = x.shape[1], AT.shape[0]
    S[:] = 0  # λ_T = 0, Ā_T = 0
    dA[:] = 0
    for t in range(T - 1, -1, -1):
        xt, dt, dyt = x[b, t, c0:c0 + W], delta[b, t, c0:c0 + W], dy[b, t, c0:c0 + W]
        acc[:] = 0
        for n in range(N):
            Bn, Cn, An, h0, h1 = B[b, t, n], C[b, t, n], AT[n, c0:c0 + W], hs[t, n], hs[t + 1, n]
            an, Sn, Pn = ab[t, n], S[n], P[t, n]
            for w in range(W):
                lam = Cn * dyt[w] + Sn[1, w]  # λ_t = C_t dy_t + Ā_{t+1} λ_{t+1}
                Sn[0, w], Sn[1, w] = lam, an[w] * lam  # λ_t, Ā_t λ_t
            for w in range(W):
                dA[n, w] += Sn[1, w] * h0[w] * dt[w]  # dA += λ_t Ā_t h_{t-1} Δ_t
            for w in range(W):
                acc[0, w] += Sn[1, w] * h0[w] * An[w]  # Σ_n λ_t Ā_t h_{t-1} A
                acc[1, w] += Sn[0, w] * Bn  # Σ_n λ_t B_t
            for w in range(W):
                Pn[0, w] += Sn[0, w] * (dt[w] * xt[w])  # dB_t = Σ_c λ_t Δ_t x_t
                Pn[1, w] += dyt[w] * h1[w]  # fwd y_t = <C_t, h_t>: dC_t = Σ_c dy_t h_t
        for w in range(W):  # dΔ_t = Σ_n λ_t (h_{t-1} Ā_t A + B_t x_t); fwd y_t += D x_t:
            ddelta[b, t, c0 + w] = acc[0, w] + xt[w] * acc[1, w]
            dx[b, t, c0 + w] = D[c0 + w] * dyt[w] + dt[w] * acc[1, w]  # D dy_t + Δ_t Σ_n λ_t B_t
            dD_b[b, c0 + w] += dyt[w] * xt[w]
    for n in range(N):
        for w in range(W):  # (a loop: an array-to-slice copy compiles a shape check)
            dAT_b[b, n, c0 + w] = dA[n, w]


@njit(cache=True, fastmath=False, nogil=True)
def _recompute_lanes(x, delta, AT, B, b, c0, hs, ab):
    """_recompute_block on explicit vectors (float32 only): the same operations per lane
    (exp16 is exp_lanes on 16 lanes), so the same hs[t+1] = h_t and ab[t] = Ā_t bits."""
    T, dp, N = x.shape[1], x.shape[2], AT.shape[0]
    hs[0] = 0
    for t in range(T):  # h_t = Ā_t h_{t-1} + Δ_t x_t B_t
        for v in range(0, W, 16):
            i = (b * T + t) * dp + c0 + v  # flat offset of [b, t, c0 + v]
            dt = load16(delta, i)
            dtx = dt * load16(x, i)
            for n in range(N):
                kt = (t * N + n) * W + v  # flat offset of [t, n, v]
                an = exp16(dt * load16(AT, n * dp + c0 + v))  # Ā_t = exp(Δ_t A)
                store16(ab, kt, an)
                store16(hs, kt + N * W, an * load16(hs, kt) + dtx * B[b, t, n])


@njit(cache=True, fastmath=False, nogil=True)
def _adjoint_lanes(dy, x, delta, AT, B, C, D, b, c0, hs, ab, g, dA, dx, ddelta, dAT_b, dBC,
                   dD_b):
    """_adjoint_scalar on explicit vectors (float32 only; Lanes16: vexp.py): the block's W = 32
    channels as two 16-lane halves (suffixes 0, 1), flat offsets into the C-contiguous arrays
    (no per-(t, n) views), the sums over n in registers. Per lane the same operations in the
    same order as _adjoint_scalar; dB_t, dC_t shares are summed over the block's channels at
    once (half 0 + half 1, then fold16) and added block after block.
    g (N, W) holds g_t = Ā_t λ_t (λ_t = C_t dy_t + g_{t+1})."""
    T, dp, N = x.shape[1], x.shape[2], AT.shape[0]
    g[:] = 0  # g_T = Ā_T λ_T = 0
    dA[:] = 0
    for t in range(T - 1, -1, -1):
        i = (b * T + t) * dp + c0  # flat offset of [b, t, c0]
        x0, d0, dy0 = load16(x, i), load16(delta, i), load16(dy, i)
        x1, d1, dy1 = load16(x, i + 16), load16(delta, i + 16), load16(dy, i + 16)
        dx0, dx1 = d0 * x0, d1 * x1  # Δ_t x_t
        zero = splat16(0.0)
        a0, b0, a1, b1 = zero, zero, zero, zero  # Σ_n λ_t Ā_t h_{t-1} A, Σ_n λ_t B_t per half
        for n in range(N):
            Cn, Bn, k, kt = C[b, t, n], B[b, t, n], n * W, (t * N + n) * W  # [n, 0], [t, n, 0]
            a0, b0, pB0, pC0 = _lanes_step(Cn, Bn, dy0, d0, dx0, AT, n * dp + c0, g, k, ab, hs,
                                           kt, N * W, dA, a0, b0)
            a1, b1, pB1, pC1 = _lanes_step(Cn, Bn, dy1, d1, dx1, AT, n * dp + c0 + 16, g, k + 16,
                                           ab, hs, kt + 16, N * W, dA, a1, b1)
            dBC[t, n, 0] += fold16(pB0 + pB1)  # dB_t = Σ_c λ_t Δ_t x_t
            dBC[t, n, 1] += fold16(pC0 + pC1)  # dC_t = Σ_c dy_t h_t
        for v, xt, dt, dyt, a, s in ((0, x0, d0, dy0, a0, b0), (16, x1, d1, dy1, a1, b1)):
            store16(ddelta, i + v, a + xt * s)  # dΔ_t = Σ_n λ_t (h_{t-1} Ā_t A + B_t x_t)
            store16(dx, i + v, load16(D, c0 + v) * dyt + dt * s)  # D dy_t + Δ_t Σ_n λ_t B_t
            store16(dD_b, b * dp + c0 + v, load16(dD_b, b * dp + c0 + v) + dyt * xt)
    for n in range(N):
        for w in range(W):  # (a loop: an array-to-slice copy compiles a shape check)
            dAT_b[b, n, c0 + w] = dA[n, w]


@njit(cache=True, fastmath=False, nogil=True)
def _lanes_step(Cn, Bn, dyt, dt, dtx, AT, ia, g, k, ab, hs, kt, NW, dA, a, s):
    """One (t, n) step on 16 channels (offsets: ia of A, k of g and dA, kt of Ā_t and h_{t-1},
    kt + NW of h_t). Returns the sums a + λ_t Ā_t h_{t-1} A, s + λ_t B_t and this step's
    per-channel shares λ_t Δ_t x_t (of dB_t), dy_t h_t (of dC_t)."""
    lam = Cn * dyt + load16(g, k)  # λ_t = C_t dy_t + g_{t+1}
    gt = load16(ab, kt) * lam  # g_t = Ā_t λ_t
    store16(g, k, gt)
    gh = gt * load16(hs, kt)  # λ_t Ā_t h_{t-1}
    store16(dA, k, load16(dA, k) + gh * dt)  # dA += λ_t Ā_t h_{t-1} Δ_t
    return a + gh * load16(AT, ia), s + lam * Bn, lam * dtx, dyt * load16(hs, kt + NW)


@njit(cache=True, fastmath=False, nogil=True)
def _sum_lanes(P, out):
    """out[t, n, k] = Σ_w P[t, n, k, w] by pairwise folding (a fixed order; P is overwritten)."""
    T, N = P.shape[0], P.shape[1]
    for t in range(T):
        for n in range(N):
            for k in range(2):
                p = P[t, n, k]
                for w in range(W // 2):  # (W = 32)
                    p[w] += p[w + W // 2]
                for w in range(W // 4):
                    p[w] += p[w + W // 4]
                for w in range(W // 8):
                    p[w] += p[w + W // 8]
                out[t, n, k] = (p[0] + p[2]) + (p[1] + p[3])


@njit(cache=True, nogil=True, fastmath=False)
def backward_blocks(dy, x, delta, AT, B, C, D, G, dx, ddelta, dAT_b, dBC_g, dD_b, lo, hi):
    """Adjoint scan per task (b, group g of blocks), float64 (and any dtype but float32): each
    block's states and Ā are recomputed into span buffers, then scanned in reverse; the
    per-channel dB, dC shares gather in P and are summed over channels once per task
    (_sum_lanes). Writes dx, ddelta (B, T, dp), dAT_b (B, N, dp), dD_b (B, dp) and
    dBC_g (B, G, T, N, 2) = the task's (dB, dC); for the tasks lo .. hi − 1 of batch · G."""
    T, dp, N = x.shape[1], x.shape[2], AT.shape[0]
    nblk = dp // W
    hs = np.empty((T + 1, N, W), x.dtype)  # (T+1, N, W): hs[t+1] = h_t
    ab = np.empty((T, N, W), x.dtype)  # (T, N, W): Ā_t
    S = np.empty((N, 2, W), x.dtype)  # (N, 2, W): λ_t, Ā_t λ_t
    dA = np.empty((N, W), x.dtype)  # (N, W)
    acc = np.empty((2, W), x.dtype)  # (2, W): Σ_n λ_t h_{t-1} Ā_t A, Σ_n λ_t B_t
    P = np.empty((T, N, 2, W), x.dtype)  # (T, N, 2, W): per-channel shares of dB, dC
    for task in range(lo, hi):
        b, grp = task // G, task % G
        P[:] = 0
        for c0 in range(grp * nblk // G * W, (grp + 1) * nblk // G * W, W):
            _recompute_block(x, delta, AT, B, b, c0, hs, ab)
            _adjoint_scalar(dy, x, delta, AT, B, C, D, b, c0, hs, ab, S, dA, acc, P, dx,
                            ddelta, dAT_b, dD_b)
        _sum_lanes(P, dBC_g[b, grp])


@njit(cache=True, nogil=True, fastmath=False)
def backward_blocks_lanes(dy, x, delta, AT, B, C, D, G, dx, ddelta, dAT_b, dBC_g, dD_b, lo, hi):
    """backward_blocks for float32 on Lanes16 vectors; each block's dB, dC shares are summed
    over its W channels at every t (no (T, N, 2, W) buffer to stream through)."""
    T, dp, N = x.shape[1], x.shape[2], AT.shape[0]
    nblk = dp // W
    hs = np.empty((T + 1, N, W), x.dtype)  # (T+1, N, W): hs[t+1] = h_t
    ab = np.empty((T, N, W), x.dtype)  # (T, N, W): Ā_t
    g = np.empty((N, W), x.dtype)  # (N, W): g_t = Ā_t λ_t
    dA = np.empty((N, W), x.dtype)  # (N, W)
    for task in range(lo, hi):
        b, grp = task // G, task % G
        dBC = dBC_g[b, grp]
        dBC[:] = 0
        for c0 in range(grp * nblk // G * W, (grp + 1) * nblk // G * W, W):
            _recompute_lanes(x, delta, AT, B, b, c0, hs, ab)
            _adjoint_lanes(dy, x, delta, AT, B, C, D, b, c0, hs, ab, g, dA, dx, ddelta, dAT_b,
                           dBC, dD_b)
