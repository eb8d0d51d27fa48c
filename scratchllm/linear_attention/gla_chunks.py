"""GLA's chunked form (gla.py) as two Numba kernels, one task per (batch, head) lane: the fast
twin of gla._chunked / gla._chunked_backward, the readable NumPy lines it equals to round-off.

Why a kernel: the NumPy form runs a few dozen whole-array steps on (B, H, n, C, *) arrays of
megabytes each. Two threads over lane groups (lanes.py) then gain little: every step streams
its arrays through memory, each allocation faults in fresh pages, and np.where, cumsum and the
sums keep the GIL or the allocator busy, so the threads mostly take turns (perf: page faults,
PyArray_Where and memmove above the BLAS kernels). Here each lane walks its chunks in order
with (C, C) and (C, Dk) scratch arrays that stay in cache, the products are BLAS calls on
those tiles (np.dot), and no step holds the GIL: the lanes are a prange, so a second thread
takes half of them. Lanes share nothing, so the bits do not depend on the thread count.

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


@numba.njit(cache=True, nogil=True)
def _decay_(b, E):  # pragma: no cover (compiled)
    """E (C, C) = exp(b_t − b_s) on and below the diagonal, 0 above, for b (C, 1)."""
    C = b.shape[0]
    alpha = np.exp(b[1:, 0] - b[:-1, 0])  # (C − 1,): α_t = exp(g_t), t ≥ 1
    for s in range(C):
        e = b.dtype.type(1)
        E[s, s] = e
        for t in range(s + 1, C):
            e *= alpha[t - 1]
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
        P[:] = np.dot(qc, kc.T) * E


@numba.njit(parallel=True, cache=True, nogil=True)
def chunked_forward_kernel(q, k, v, b, o, states):  # pragma: no cover (compiled)
    """q, k (L, n, C, Dk); v (L, n, C, Dv); b (L, n, C, G) -> o (L, n, C, Dv) and
    states (L, n, Dk, Dv), the state entering each chunk, written in place."""
    L, n, C, Dk = q.shape
    G = b.shape[3]
    for lane in numba.prange(L):
        S = np.zeros((Dk, v.shape[3]), q.dtype)  # (Dk, Dv)
        P, E = np.empty((C, C), q.dtype), np.empty((C, C), q.dtype)
        qd, kd = np.empty((C, Dk), q.dtype), np.empty((C, Dk), q.dtype)
        eb, ebl = np.empty((C, G), q.dtype), np.empty((C, G), q.dtype)
        for c in range(n):
            qc, kc, vc, bc = q[lane, c], k[lane, c], v[lane, c], b[lane, c]
            states[lane, c] = S
            _scores_(qc, kc, bc, P, E)
            _gate_factors_(bc, qc, kc, qd, kd, eb, ebl)
            o[lane, c] = np.dot(P, vc) + np.dot(qd, S)  # intra + inter-chunk
            X = np.dot(kd.T, vc)  # (Dk, Dv)
            for i in range(Dk):
                S[i] = np.exp(bc[C - 1, i if G > 1 else 0]) * S[i] + X[i]


@numba.njit(parallel=True, cache=True, nogil=True)
def chunked_backward_kernel(do, q, k, v, b, states, dq, dk, dv, dg):  # pragma: no cover
    """do (L, n, C, Dv) and the forward's arrays -> dq, dk (L, n, C, Dk), dv (L, n, C, Dv),
    dg (L, n, C, G) (the log gate per chunk step), written in place."""
    L, n, C, Dk = q.shape
    Dv, G = v.shape[3], b.shape[3]
    for lane in numba.prange(L):
        lam = np.zeros((Dk, Dv), q.dtype)  # dL/dS leaving the chunk
        P, E = np.empty((C, C), q.dtype), np.empty((C, C), q.dtype)
        qd, kd = np.empty((C, Dk), q.dtype), np.empty((C, Dk), q.dtype)
        eb, ebl = np.empty((C, G), q.dtype), np.empty((C, G), q.dtype)
        dqs, dks = np.empty((C, Dk), q.dtype), np.empty((C, Dk), q.dtype)
        db, dbs = np.empty((C, G), q.dtype), np.empty((C, Dk), q.dtype)
        dlast = np.empty(G, q.dtype)
        for c in range(n - 1, -1, -1):
            qc, kc, vc, bc, S, doc = (q[lane, c], k[lane, c], v[lane, c], b[lane, c],
                                      states[lane, c], do[lane, c])
            _scores_(qc, kc, bc, P, E)
            _gate_factors_(bc, qc, kc, qd, kd, eb, ebl)
            # fwd: o += qd S  ->  dqd = do S^T, dS_in = qd^T do
            dqd = np.dot(doc, S.T)  # (C, Dk)
            dS_in = np.dot(qd.T, doc)  # (Dk, Dv)
            # fwd: S_out = diag(exp b_C) S + kd^T v  ->  dkd = v λ^T, dv = kd λ, d(b_C)
            dkd = np.dot(vc, lam.T)  # (C, Dk)
            dvc = np.dot(kd, lam)  # (C, Dv)
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
            dP = np.dot(doc, vc.T)  # (C, C)
            dvc += np.dot(P.T, doc)
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
                dqk = dP * E  # (C, C), 0 above the diagonal
                W = dqk * np.dot(qc, kc.T)  # (C, C)
                for t in range(C):
                    for s in range(t + 1):
                        db[t, 0] += W[t, s]
                        db[s, 0] -= W[t, s]
                dqs[:] = np.dot(dqk, kc)
                dks[:] = np.dot(dqk.T, qc)
            for t in range(C):
                for i in range(Dk):
                    g = i if G > 1 else 0
                    dq[lane, c, t, i] = dqs[t, i] + dqd[t, i] * eb[t, g]
                    dk[lane, c, t, i] = dks[t, i] + dkd[t, i] * ebl[t, g]
            dv[lane, c] = dvc
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
    chunked_forward_kernel(*(_lanes(a, work) for a in (qc, kc, vc, b)),
                           o.reshape((-1, n, C, Dv)), states.reshape((-1, n, Dk, Dv)))
    return o.astype(dtype, copy=False), states.astype(dtype, copy=False)


def chunked_backward_kernel_call(doc, qc, kc, vc, b, states):
    """The twin of gla._chunked_backward's core: doc (B, H, n, C, Dv) -> (dq, dk, dv, dg) in
    the chunked layout (dg (B, H, n, C, G) for the log gate)."""
    dtype, work = _dtypes(doc, qc, kc, vc, b, states)
    dq, dk = np.empty(qc.shape, work), np.empty(qc.shape, work)  # (B, H, n, C, Dk)
    dv, dg = np.empty(vc.shape, work), np.empty(b.shape, work)  # (.., Dv), (.., G)
    L = qc.shape[0] * qc.shape[1]
    chunked_backward_kernel(*(_lanes(a, work) for a in (doc, qc, kc, vc, b, states)),
                            *(a.reshape((L,) + a.shape[2:]) for a in (dq, dk, dv, dg)))
    return tuple(a.astype(dtype, copy=False) for a in (dq, dk, dv, dg))
