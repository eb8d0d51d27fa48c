"""GLA's chunked form (gla.py) as two Numba kernels, one task per (batch, head) lane: the fast
twin of gla._chunked / gla._chunked_backward, the readable NumPy lines it equals to round-off.

Why a kernel: the NumPy form runs a few dozen whole-array steps on (B, H, n, C, *) arrays of
megabytes each. Two threads over lane groups (lanes.py) then gain little: every step streams
its arrays through memory, each allocation faults in fresh pages, and np.where, cumsum and the
sums keep the GIL or the allocator busy, so the threads mostly take turns (perf: page faults,
PyArray_Where and memmove above the BLAS kernels). Here each lane walks its chunks in order
with (C, C) and (C, Dk) scratch arrays that stay in cache, the products are BLAS calls on
those tiles (np.dot into preallocated tiles), and no step holds the GIL: each kernel is serial
over a span of lanes and releases the GIL (nogil), and lanes.run_spans gives each thread a span,
so a second thread takes half of them. Lanes share nothing, so the bits do not depend on the
thread count.

Compile cost: a parallel (prange) kernel compiled in ~20 s of CPU per dtype and direction on
this machine (parfor lowering of the whole inlined body), the serial kernel in ~2-3 s; and
`out[:] = array` between 2-D arrays costs seconds of compilation by itself, so the tiles are
written by np.dot(a, b, out) and plain loops. After a prange kernel Numba's worker threads
also keep spinning for a while and compete with the NumPy steps around it; Python threads
blocked on a queue do not.

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
import numba
import numpy as np

from scratchllm.core.heap import keep_freed_memory
from scratchllm.linear_attention.gla_scores import chunk_scores_, chunk_scores_backward_
from scratchllm.linear_attention.lanes import run_spans


@numba.njit(cache=True, nogil=True)
def _decay_(b, E):  # pragma: no cover (compiled)
    """E (C, C) = exp(b_t − b_s) on and below the diagonal, 0 above, for b (C, 1)."""
    C = b.shape[0]
    alpha = np.empty(C, b.dtype)  # α_t = exp(g_t), t ≥ 1
    for t in range(1, C):
        alpha[t] = np.exp(b[t, 0] - b[t - 1, 0])
    for s in range(C):
        e = b.dtype.type(1)
        E[s, s] = e
        for t in range(s + 1, C):
            e *= alpha[t]
            E[t, s] = e
        for t in range(s):
            E[t, s] = 0


@numba.njit(cache=True, nogil=True)
def _gate_factors_(b, qc, kc, qd, kd, eb, ebl):  # pragma: no cover (compiled)
    """eb = exp(b), ebl = exp(b_C − b) (C, G); qd = q ⊙ eb, kd = k ⊙ ebl (C, Dk)."""
    C, G = b.shape
    for t in range(C):
        for g in range(G):
            eb[t, g] = np.exp(b[t, g])
            ebl[t, g] = np.exp(b[C - 1, g] - b[t, g])
    for t in range(C):
        for i in range(qc.shape[1]):
            g = i if G > 1 else 0
            qd[t, i] = qc[t, i] * eb[t, g]
            kd[t, i] = kc[t, i] * ebl[t, g]


@numba.njit(cache=True, nogil=True)
def _scores_(qc, kc, b, P, E):  # pragma: no cover (compiled)
    """P (C, C) = the chunk's scores (0 above the diagonal); E the (C, C) decay (G = 1)."""
    if b.shape[1] > 1:
        P[:] = 0
        chunk_scores_(qc, kc, b, P)
    else:
        _decay_(b, E)
        np.dot(qc, kc.T, P)  # (C, C) = q k^T
        for t in range(P.shape[0]):
            for s in range(P.shape[1]):
                P[t, s] *= E[t, s]


@numba.njit(cache=True, nogil=True)
def chunked_forward_kernel(q, k, v, b, o, states, lo, hi):  # pragma: no cover (compiled)
    """q, k (L, n, C, Dk); v (L, n, C, Dv); b (L, n, C, G) -> o (L, n, C, Dv) and
    states (L, n, Dk, Dv), the state entering each chunk, written in place for the lanes
    lo .. hi − 1."""
    n, C, Dk = q.shape[1:]
    Dv, G = v.shape[3], b.shape[3]
    S, X = np.empty((Dk, Dv), q.dtype), np.empty((Dk, Dv), q.dtype)  # (Dk, Dv)
    P, E = np.empty((C, C), q.dtype), np.empty((C, C), q.dtype)
    qd, kd = np.empty((C, Dk), q.dtype), np.empty((C, Dk), q.dtype)
    eb, ebl = np.empty((C, G), q.dtype), np.empty((C, G), q.dtype)
    Y = np.empty((C, Dv), q.dtype)  # (C, Dv)
    for lane in range(lo, hi):
        S[:] = 0
        for c in range(n):
            qc, kc, vc, bc, oc = q[lane, c], k[lane, c], v[lane, c], b[lane, c], o[lane, c]
            Sc = states[lane, c]
            for i in range(Dk):
                for j in range(Dv):
                    Sc[i, j] = S[i, j]
            _scores_(qc, kc, bc, P, E)
            _gate_factors_(bc, qc, kc, qd, kd, eb, ebl)
            np.dot(P, vc, oc)  # intra-chunk
            np.dot(qd, S, Y)  # inter-chunk
            for t in range(C):
                for j in range(Dv):
                    oc[t, j] += Y[t, j]
            np.dot(kd.T, vc, X)  # (Dk, Dv)
            for i in range(Dk):
                decay = np.exp(bc[C - 1, i if G > 1 else 0])
                for j in range(Dv):
                    S[i, j] = decay * S[i, j] + X[i, j]


@numba.njit(cache=True, nogil=True)
def chunked_backward_kernel(do, q, k, v, b, states, dq, dk, dv, dg, lo, hi):  # pragma: no cover
    """do (L, n, C, Dv) and the forward's arrays -> dq, dk (L, n, C, Dk), dv (L, n, C, Dv),
    dg (L, n, C, G) (the log gate per chunk step), written in place for the lanes lo .. hi − 1."""
    n, C, Dk = q.shape[1:]
    Dv, G = v.shape[3], b.shape[3]
    dt = q.dtype
    lam, dS_in = np.empty((Dk, Dv), dt), np.empty((Dk, Dv), dt)  # λ = dL/dS leaving the chunk
    P, E, dP = np.empty((C, C), dt), np.empty((C, C), dt), np.empty((C, C), dt)
    QK, Y = np.empty((C, C), dt), np.empty((C, Dv), dt)
    qd, kd, dqd, dkd = (np.empty((C, Dk), dt), np.empty((C, Dk), dt), np.empty((C, Dk), dt),
                        np.empty((C, Dk), dt))
    dqs, dks, dbs = np.empty((C, Dk), dt), np.empty((C, Dk), dt), np.empty((C, Dk), dt)
    eb, ebl, db = np.empty((C, G), dt), np.empty((C, G), dt), np.empty((C, G), dt)
    dlast = np.empty(G, dt)
    for lane in range(lo, hi):
        lam[:] = 0
        for c in range(n - 1, -1, -1):
            qc, kc, vc, bc, S, doc = (q[lane, c], k[lane, c], v[lane, c], b[lane, c],
                                      states[lane, c], do[lane, c])
            dvc = dv[lane, c]
            _scores_(qc, kc, bc, P, E)
            _gate_factors_(bc, qc, kc, qd, kd, eb, ebl)
            # fwd: o += qd S  ->  dqd = do S^T, dS_in = qd^T do
            np.dot(doc, S.T, dqd)  # (C, Dk)
            np.dot(qd.T, doc, dS_in)  # (Dk, Dv)
            # fwd: S_out = diag(exp b_C) S + kd^T v  ->  dkd = v λ^T, dv = kd λ, d(b_C)
            np.dot(vc, lam.T, dkd)  # (C, Dk)
            np.dot(kd, lam, dvc)  # (C, Dv)
            dlast[:] = 0
            for i in range(Dk):
                g = i if G > 1 else 0
                acc = q.dtype.type(0)
                for j in range(Dv):
                    acc += lam[i, j] * S[i, j]
                dlast[g] += acc * np.exp(bc[C - 1, g])
            db[:] = 0
            for t in range(C):
                for i in range(Dk):
                    g = i if G > 1 else 0
                    wk = dkd[t, i] * kd[t, i]  # fwd: kd = k exp(b_C − b)
                    db[t, g] += dqd[t, i] * qd[t, i] - wk  # fwd: qd = q exp(b)
                    dlast[g] += wk
            # fwd: o = P v  ->  dP = do v^T (read s ≤ t), dv += P^T do
            np.dot(doc, vc.T, dP)  # (C, C)
            np.dot(P.T, doc, Y)  # (C, Dv)
            for t in range(C):
                for j in range(Dv):
                    dvc[t, j] += Y[t, j]
            if G > 1:
                dqs[:] = 0
                dks[:] = 0
                dbs[:] = 0
                chunk_scores_backward_(dP, qc, kc, bc, dqs, dks, dbs)
                for t in range(C):
                    for i in range(Dk):
                        db[t, i] += dbs[t, i]
            else:
                # fwd: P = (q k^T) ⊙ E  ->  dqk = dP ⊙ E; d(b_t − b_s) = dqk ⊙ q k^T
                np.dot(qc, kc.T, QK)  # (C, C)
                for t in range(C):
                    for s in range(C):
                        dP[t, s] *= E[t, s]  # dqk, 0 above the diagonal
                    for s in range(t + 1):
                        w = dP[t, s] * QK[t, s]
                        db[t, 0] += w
                        db[s, 0] -= w
                np.dot(dP, kc, dqs)
                np.dot(dP.T, qc, dks)
            for t in range(C):
                for i in range(Dk):
                    g = i if G > 1 else 0
                    dq[lane, c, t, i] = dqs[t, i] + dqd[t, i] * eb[t, g]
                    dk[lane, c, t, i] = dks[t, i] + dkd[t, i] * ebl[t, g]
            for g in range(G):
                db[C - 1, g] += dlast[g]  # fwd: b_C = b[-1]
                acc = q.dtype.type(0)  # fwd: b = cumsum(g)  ->  dg = reverse cumsum of db
                for t in range(C - 1, -1, -1):
                    acc += db[t, g]
                    dg[lane, c, t, g] = acc
            # λ entering this chunk: dS_in + diag(exp b_C) λ
            for i in range(Dk):
                decay = np.exp(bc[C - 1, i if G > 1 else 0])
                for j in range(Dv):
                    lam[i, j] = dS_in[i, j] + decay * lam[i, j]


def _lanes(a, dtype):
    """(B, H, n, C, X) -> (B·H, n, C, X) of dtype, C-contiguous."""
    return np.ascontiguousarray(a.reshape((-1,) + a.shape[2:]), dtype)


def _dtypes(*arrays):
    """(the result's dtype, the kernel's: float32 or float64, at least the result's)."""
    out = np.result_type(*arrays)
    return out, np.result_type(out, np.float32)


def chunked_kernel(qc, kc, vc, b):
    """The twin of gla._chunked's core on chunked arrays: qc, kc (B, H, n, C, Dk), vc
    (B, H, n, C, Dv), b (B, H, n, C, G) -> o (B, H, n, C, Dv), states (B, H, n, Dk, Dv)."""
    B, H, n, C, Dk = qc.shape
    Dv = vc.shape[-1]
    keep_freed_memory()  # for the NumPy steps around the kernel (lanes.py)
    dtype, work = _dtypes(qc, kc, vc, b)
    o = np.empty((B, H, n, C, Dv), work)  # (B, H, n, C, Dv)
    states = np.empty((B, H, n, Dk, Dv), work)  # (B, H, n, Dk, Dv)
    args = (*(_lanes(a, work) for a in (qc, kc, vc, b)), o.reshape((-1, n, C, Dv)),
            states.reshape((-1, n, Dk, Dv)))
    run_spans(lambda lo, hi: chunked_forward_kernel(*args, lo, hi), B * H, o.size)
    return o.astype(dtype, copy=False), states.astype(dtype, copy=False)


def chunked_backward_kernel_call(doc, qc, kc, vc, b, states):
    """The twin of gla._chunked_backward's core: doc (B, H, n, C, Dv) -> (dq, dk, dv, dg) in
    the chunked layout (dg (B, H, n, C, G) for the log gate)."""
    dtype, work = _dtypes(doc, qc, kc, vc, b, states)
    dq, dk = np.empty(qc.shape, work), np.empty(qc.shape, work)  # (B, H, n, C, Dk)
    dv, dg = np.empty(vc.shape, work), np.empty(b.shape, work)  # (.., Dv), (.., G)
    L = qc.shape[0] * qc.shape[1]
    args = (*(_lanes(a, work) for a in (doc, qc, kc, vc, b, states)),
            *(a.reshape((L,) + a.shape[2:]) for a in (dq, dk, dv, dg)))
    run_spans(lambda lo, hi: chunked_backward_kernel(*args, lo, hi), L, dq.size)
    return tuple(a.astype(dtype, copy=False) for a in (dq, dk, dv, dg))
