"""GLA's chunked form (gla.py) as one Numba kernel for both directions, one task per (batch,
head) lane: the fast twin of gla._chunked / gla._chunked_backward, the readable NumPy lines it
equals to round-off.

Why a kernel: the NumPy form runs a few dozen whole-array steps on (B, H, n, C, *) arrays of
megabytes each. Two threads over lane groups (lanes.py) then gain little: every step streams
its arrays through memory, each allocation faults in fresh pages, and np.where, cumsum and the
sums keep the GIL or the allocator busy, so the threads mostly take turns (perf: page faults,
PyArray_Where and memmove above the BLAS kernels). Here each lane walks its chunks in order
with (C, C) and (C, Dk) scratch arrays that stay in cache, the products are BLAS calls on
those tiles (core/tile_gemm.py, into preallocated tiles), and no step holds the GIL: the kernel
is serial over a span of lanes and releases the GIL (nogil), and lanes.run_spans gives each
thread a span, so a second thread takes half of them. Lanes share nothing, so the bits do not
depend on the thread count.

Compile cost (a first call compiles per dtype; CPU seconds on this 2-core VM): a parallel
(prange) kernel took ~20 s per dtype and direction (parfor lowering of the whole inlined body;
after it Numba's worker threads also kept spinning beside the NumPy steps). Two serial kernels
(forward, backward) took 6.6-7.4 s per dtype for both: every helper they called was compiled
on its own and again inside each caller, and np.dot compiled its checks and gemv / dot paths
at every call. Now: one kernel serves both directions (each chunk step builds the tiles both
need, then runs its forward lines or, chunks in reverse, its adjoint lines; the direction is
tested once per chunk, not in the inner loops, which stay vectorised), the products are
tile_gemm's bare gemm calls (accumulating with beta = 1 where a sum follows a product), and the
gate's layout is a compile-time switch: `per_channel` None (a gate per head, or none) or True
(a gate per key channel), Numba dropping the other branch, so each compiles only its own
scores; _lane_kernel's one source is compiled as a kernel per layout and dtype (KERNELS).
Cold compile CPU of a first fwd + bwd in one dtype, loaded (the same harness, base beside):
8.0-8.6 s before, now 4.3-4.8 s with a gate per channel and ~3 s with one per head. Helpers
inlined at Numba's level (inline='always') cost their share in every caller's front end: only
the small ones here are.

Per lane and chunk c entering with the state S (Dk, Dv), b the in-chunk cumulative log gate:
    P = scores(q, k, b)                      (C, C), s ≤ t
    o = P v + (q ⊙ exp(b)) S                 (C, Dv)
    S ← diag(exp(b_C)) S + (k ⊙ exp(b_C − b))^T v
The backward walks the chunks in reverse with λ = dL/dS_out, as gla._chunked_backward.
Scores: a gate per channel (G = Dk) uses gla_scores.chunk_scores_ (running products of the
gates); one gate per head or none (G = 1) is (q k^T) ⊙ E, E_ts = exp(b_t − b_s) built as
running products along t of α_t = exp(g_t) (C exps per chunk, no overflow for g ≤ 0).
Numba's cache tracks only this file: after editing gla_scores' chunk helpers, clear
__pycache__'s gla_chunks*.nbi/.nbc.

Glossary: L = B·H lanes, n chunks, C chunk length, Dk key dim, Dv value dim, G gate width.
"""
from types import FunctionType

import numba
import numpy as np

from scratchllm.core.heap import keep_freed_memory
from scratchllm.core.tile_gemm import gemm_, gemm_add_
from scratchllm.linear_attention.gla_scores import chunk_scores_, chunk_scores_backward_
from scratchllm.linear_attention.lanes import run_spans


@numba.njit(nogil=True, inline='always')
def _head_scores_(q, k, b, alpha, E, QK, P):  # pragma: no cover (compiled)
    """One chunk with one gate per head (G = 1): q, k (C, Dk), b (C, 1) -> P (C, C) =
    (q k^T) ⊙ E, with E_ts = exp(b_t − b_s) = Π_(s, t] α (0 above the diagonal) and QK = q k^T
    kept for the backward; alpha (C,) scratch."""
    C = q.shape[0]
    for t in range(1, C):
        alpha[t] = np.exp(b[t, 0] - b[t - 1, 0])  # α_t = exp(g_t)
    for s in range(C):
        e = q.dtype.type(1)
        E[s, s] = e
        for t in range(s + 1, C):
            e *= alpha[t]
            E[t, s] = e
        for t in range(s):
            E[t, s] = 0
    gemm_(q, k.T, QK)  # (C, C)
    for t in range(C):
        for s in range(C):
            P[t, s] = QK[t, s] * E[t, s]


@numba.njit(nogil=True, inline='always')
def _head_scores_backward_(dP, q, k, E, QK, dq, dk, db):  # pragma: no cover (compiled)
    """Adds _head_scores_' (dq, dk (C, Dk), db (C, 1)) for dP (C, C) into dq, dk, db; dP is
    overwritten. fwd: P = (q k^T) ⊙ E  ->  dqk = dP ⊙ E, d(b_t − b_s) = dqk ⊙ q k^T,
    dq += dqk k, dk += dqk^T q."""
    C = dP.shape[0]
    for t in range(C):
        for s in range(C):
            dP[t, s] *= E[t, s]  # dqk, 0 above the diagonal
            w = dP[t, s] * QK[t, s]
            db[t, 0] += w
            db[s, 0] -= w
    gemm_add_(dP, k, dq)
    gemm_add_(dP.T, q, dk)


@numba.njit(nogil=True, inline='always')
def _gate_factors_(b, q, k, eb, ebl, qd, kd):  # pragma: no cover (compiled)
    """eb = exp(b), ebl = exp(b_C − b) (C, G); qd = q ⊙ eb, kd = k ⊙ ebl (C, Dk)."""
    C, G = b.shape
    for t in range(C):
        for g in range(G):
            eb[t, g] = np.exp(b[t, g])
            ebl[t, g] = np.exp(b[C - 1, g] - b[t, g])
        for i in range(q.shape[1]):
            g = i if G > 1 else 0
            qd[t, i] = q[t, i] * eb[t, g]
            kd[t, i] = k[t, i] * ebl[t, g]


def _lane_kernel(q, k, v, b, per_channel, states, o, grads, backward, lo, hi):  # pragma: no cover
    """Forward (backward False): q, k (L, n, C, Dk); v (L, n, C, Dv); b (L, n, C, G) -> o
    (L, n, C, Dv) and states (L, n, Dk, Dv), the state entering each chunk. Backward: o holds
    do and is read, states is read, and grads = (dq, dk (L, n, C, Dk), dv (L, n, C, Dv),
    dg (L, n, C, G)) is written (dg: the log gate per chunk step). per_channel: None for
    G = 1, True for G = Dk (a compile-time switch: Numba drops the other branch). The lanes
    lo .. hi − 1, written in place."""
    n, C, Dk = q.shape[1:]
    Dv, G = v.shape[3], b.shape[3]
    dq, dk, dv, dg = grads
    dt = q.dtype
    R = np.empty((Dk, Dv), dt)  # the state S (forward) or λ = dL/dS leaving the chunk
    P = np.zeros((C, C), dt)  # the scores; 0 above the diagonal, never written there
    E, QK, dP = np.empty((C, C), dt), np.empty((C, C), dt), np.empty((C, C), dt)  # (C, C)
    qd, kd = np.empty((C, Dk), dt), np.empty((C, Dk), dt)  # (C, Dk)
    dqd, dkd = np.empty((C, Dk), dt), np.empty((C, Dk), dt)
    eb, ebl, db = np.empty((C, G), dt), np.empty((C, G), dt), np.empty((C, G), dt)  # (C, G)
    alpha, dlast = np.empty(C, dt), np.empty(G, dt)
    for lane in range(lo, hi):
        for i in range(Dk):
            for j in range(Dv):
                R[i, j] = 0
        for step in range(n):
            c = n - 1 - step if backward else step
            qc, kc, vc, bc, oc = q[lane, c], k[lane, c], v[lane, c], b[lane, c], o[lane, c]
            Sc = states[lane, c]  # (Dk, Dv)
            # P = the chunk's scores
            if per_channel is None:
                _head_scores_(qc, kc, bc, alpha, E, QK, P)
            else:
                chunk_scores_(qc, kc, bc, P)
            _gate_factors_(bc, qc, kc, eb, ebl, qd, kd)
            if backward:  # oc is do; R is λ leaving the chunk
                dqc, dkc, dvc, dgc = dq[lane, c], dk[lane, c], dv[lane, c], dg[lane, c]
                # fwd: o += qd S  ->  dqd = do S^T (dS_in = qd^T do joins λ below)
                gemm_(oc, Sc.T, dqd)  # (C, Dk)
                # fwd: S_out = diag(exp b_C) S + kd^T v  ->  dkd = v λ^T, dv = kd λ,
                # d(b_C) = rowsum(λ ⊙ S) exp(b_C)
                gemm_(vc, R.T, dkd)  # (C, Dk)
                gemm_(kd, R, dvc)  # (C, Dv)
                # fwd: o = P v  ->  dP = do v^T (read s ≤ t), dv += P^T do
                gemm_add_(P.T, oc, dvc)
                gemm_(oc, vc.T, dP)  # (C, C)
                for g in range(G):
                    dlast[g] = 0
                    for t in range(C):
                        db[t, g] = 0
                for i in range(Dk):
                    g = 0 if per_channel is None else i
                    acc = dt.type(0)
                    for j in range(Dv):
                        acc += R[i, j] * Sc[i, j]
                    dlast[g] += acc * np.exp(bc[C - 1, g])
                for t in range(C):
                    for i in range(Dk):
                        g = 0 if per_channel is None else i
                        wk = dkd[t, i] * kd[t, i]  # fwd: kd = k exp(b_C − b)
                        db[t, g] += dqd[t, i] * qd[t, i] - wk  # fwd: qd = q exp(b)
                        dlast[g] += wk
                        dqc[t, i] = dqd[t, i] * eb[t, g]
                        dkc[t, i] = dkd[t, i] * ebl[t, g]
                # the scores' (dq, dk, db), added in
                if per_channel is None:
                    _head_scores_backward_(dP, qc, kc, E, QK, dqc, dkc, db)
                else:
                    chunk_scores_backward_(dP, qc, kc, bc, dqc, dkc, db)
                for g in range(G):
                    db[C - 1, g] += dlast[g]  # fwd: b_C = b[-1]
                    acc = dt.type(0)  # fwd: b = cumsum(g)  ->  dg = reverse cumsum of db
                    for t in range(C - 1, -1, -1):
                        acc += db[t, g]
                        dgc[t, g] = acc
            else:
                for i in range(Dk):
                    for j in range(Dv):
                        Sc[i, j] = R[i, j]
                gemm_(P, vc, oc)  # o = P v, intra-chunk
                gemm_add_(qd, R, oc)  # o += qd S, inter-chunk
            # forward: S_out = diag(exp b_C) S + kd^T v; backward: λ entering this chunk =
            # diag(exp b_C) λ + qd^T do (fwd: o += qd S_in)
            for i in range(Dk):
                decay = np.exp(bc[C - 1, 0 if per_channel is None else i])
                for j in range(Dv):
                    R[i, j] *= decay
            if backward:
                gemm_add_(qd.T, oc, R)
            else:
                gemm_add_(kd.T, vc, R)


def _lanes(a, dtype):
    """(B, H, n, C, X) -> (B·H, n, C, X) of dtype, C-contiguous and writable (a read-only
    array would be another type to Numba: a second compilation)."""
    out = np.ascontiguousarray(a.reshape((-1,) + a.shape[2:]), dtype)
    return out if out.flags.writeable else out.copy()


def _dtypes(*arrays):
    """(the result's dtype, the kernel's: float32 or float64, at least the result's)."""
    out = np.result_type(*arrays)
    return out, np.result_type(out, np.float32)


def _dispatcher(name):
    """_lane_kernel compiled as the kernel `name`: its own Numba dispatcher and cache files.
    One per gate layout and dtype (KERNELS), each with one signature: the tests' conftest lets
    one process at a time compile a kernel, so two workers needing two of them compile side
    by side instead of one waiting for the other."""
    fn = FunctionType(_lane_kernel.__code__, _lane_kernel.__globals__, name)
    fn.__qualname__, fn.__doc__ = name, _lane_kernel.__doc__
    return numba.njit(cache=True, nogil=True)(fn)


KERNELS = {(layout, dtype): _dispatcher(f"lane_kernel_{layout}_{dtype}")
           for layout in ("per_head", "per_channel") for dtype in ("float32", "float64")}


def _kernel(b, work):
    """(the lane kernel, its per_channel switch) for gates b (..., G), G = 1 or G = Dk, in the
    work dtype (float32 or float64)."""
    channel = b.shape[-1] > 1
    layout = "per_channel" if channel else "per_head"
    return KERNELS[layout, np.dtype(work).name], (True if channel else None)


def chunked_kernel(qc, kc, vc, b):
    """The twin of gla._chunked's core on chunked arrays: qc, kc (B, H, n, C, Dk), vc
    (B, H, n, C, Dv), b (B, H, n, C, G) -> o (B, H, n, C, Dv), states (B, H, n, Dk, Dv)."""
    B, H, n, C, Dk = qc.shape
    Dv = vc.shape[-1]
    keep_freed_memory()  # for the NumPy steps around the kernel (lanes.py)
    dtype, work = _dtypes(qc, kc, vc, b)
    o = np.empty((B, H, n, C, Dv), work)  # (B, H, n, C, Dv)
    states = np.empty((B, H, n, Dk, Dv), work)  # (B, H, n, Dk, Dv)
    none = (np.empty((0, 0, 0, 0), work),) * 4  # no gradients in the forward
    kernel, per_channel = _kernel(b, work)
    args = (*(_lanes(a, work) for a in (qc, kc, vc, b)), per_channel,
            states.reshape((-1, n, Dk, Dv)), o.reshape((-1, n, C, Dv)), none, False)
    run_spans(lambda lo, hi: kernel(*args, lo, hi), B * H, o.size)
    return o.astype(dtype, copy=False), states.astype(dtype, copy=False)


def chunked_backward_kernel_call(doc, qc, kc, vc, b, states):
    """The twin of gla._chunked_backward's core: doc (B, H, n, C, Dv) -> (dq, dk, dv, dg) in
    the chunked layout (dg (B, H, n, C, G) for the log gate)."""
    dtype, work = _dtypes(doc, qc, kc, vc, b, states)
    dq, dk = np.empty(qc.shape, work), np.empty(qc.shape, work)  # (B, H, n, C, Dk)
    dv, dg = np.empty(vc.shape, work), np.empty(b.shape, work)  # (.., Dv), (.., G)
    L = qc.shape[0] * qc.shape[1]
    q_, k_, v_, b_, states_, do_ = (_lanes(a, work) for a in (qc, kc, vc, b, states, doc))
    grads = tuple(a.reshape((L,) + a.shape[2:]) for a in (dq, dk, dv, dg))
    kernel, per_channel = _kernel(b, work)
    args = (q_, k_, v_, b_, per_channel, states_, do_, grads, True)
    run_spans(lambda lo, hi: kernel(*args, lo, hi), L, dq.size)
    return tuple(a.astype(dtype, copy=False) for a in (dq, dk, dv, dg))
