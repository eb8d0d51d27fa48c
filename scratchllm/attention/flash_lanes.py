"""Flash attention's fused twin: flash.py's tiled loops run per lane (one batch row and KV
head, b and hkv, with its G query heads), each tile's elementwise work in one Numba loop
(flash_kernels.py) between BLAS products written into buffers made once per lane, and the
lanes on threads, one BLAS thread each.

Why tasks on threads: a (256, 64) x (64, 256) product is too small for OpenBLAS's own
threads, which spin-wait for each other (on a busy machine a small product then takes many
times longer), and the Numba loops and Python between the products run on one core. The
forward's tasks are (lane, query block) pairs, the longest rows first; the backward's are
lanes (dk and dv sum over a lane's query blocks). Tasks share nothing but the read-only
inputs and write disjoint slices of out, L, dq, dk and dv, so W worker threads pulling tasks
(W = the BLAS thread count when the call starts, OpenBLAS set to one thread meanwhile) give
the same bits as one, and a thread the machine pauses holds up only its own task. Without
an OpenBLAS to set, the tasks run in turn.

The math is flash.py's (its docstring derives it); each line below restates the readable
twin's line it replaces. Glossary: B batch, H query heads, Hkv KV heads, G = H / Hkv, Tq/Tk
query/key lengths, Dh head dim, Dv value head dim, bq/bk block sizes, R = G * bq rows of a tile.
"""
import numpy as np

from scratchllm.attention.flash_kernels import online_block_, probs_block_, softmax_grad_
from scratchllm.core.blas import blas_threads, run_tasks

THREADS_FROM = 1 << 24  # multiply-adds of a call below which threads cost more than they give


def _workers(n_lanes, work):
    """Threads for a call: the BLAS thread count, or 1 (one lane, work below THREADS_FROM,
    or no OpenBLAS found)."""
    if n_lanes < 2 or work < THREADS_FROM:
        return 1
    return max(blas_threads(), default=1)


def _lane_groups(N, workers):
    """[(a, b)]: lanes a:b of one task; one lane each on threads, all of them in turn (then
    each product is one batched call over the lanes)."""
    return [(n, n + 1) for n in range(N)] if workers > 1 else [(0, N)]


def _rows(a, i0, i1):
    """Rows i0:i1 of lanes (n, G, T, X), grouped: (n, G*bq, X), C-contiguous."""
    n, G, _, X = a.shape
    return np.ascontiguousarray(a[:, :, i0:i1]).reshape(n, G * (i1 - i0), X)  # (n, R, X)


def _mask_args(opts, i0, i1, j0, keep, offset):
    """The tile's mask for flash_kernels: (i0, bq, j0, offset, causal, window, n_sink); a
    tile flash._blocks found fully kept gets none."""
    causal = opts.causal and keep is not True
    window = -1 if opts.window is None else opts.window
    return i0, i1 - i0, j0, offset, causal, window, opts.n_sink


def _tile(buf, *shape):
    """The first entries of a flat buffer as a C-contiguous array of the shape."""
    return buf[:np.prod(shape)].reshape(shape)


def _lanes(a, N):
    """(B, heads, ...) -> (N = B * Hkv, heads / Hkv, ...): a view for our own C-contiguous
    outputs, a copy at most for an input."""
    return a.reshape((N, -1) + a.shape[2:])


def forward_lanes(q, k, v, sinks, opts, sched, out, lse):
    """flash_sdpa_forward's loops per lane and query block (tasks, the longest rows first);
    fills out (B, H, Tq, Dv) and lse (B, Hkv, G*Tq, 1). sched: flash._blocks's list
    [(i0, i1, [(j0, j1, keep)])]; sinks (H,) or None."""
    B, H, Tq, Dh = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    N, G, dt = B * Hkv, H // Hkv, q.dtype
    scale, ninf = dt.type(opts.scale), dt.type(-np.inf)
    lowest = np.finfo(dt).min  # online_block_'s reference for a row with no key yet
    q4, out4 = q.reshape(N, G, Tq, Dh), out.reshape(N, G, Tq, Dv)  # (N, G, Tq, Dh|Dv)
    k3, v3, lse3 = k.reshape(N, Tk, Dh), v.reshape(N, Tk, Dv), lse.reshape(N, G, Tq)
    sink2 = None if sinks is None else np.tile(sinks.astype(dt).reshape(Hkv, G), (B, 1))  # (N,G)
    order = sorted(range(len(sched)), key=lambda i: -len(sched[i][2]))  # longest rows first
    workers = _workers(N, B * H * Tq * Tk * (Dh + Dv))
    groups = _lane_groups(N, workers)

    def task(t):  # one query block of some lanes: independent of every other
        (a, b), (i0, i1, ks) = groups[t % len(groups)], sched[order[t // len(groups)]]
        n, R = b - a, G * (i1 - i0)
        qb = _rows(q4[a:b], i0, i1)  # (n, R, Dh)
        if sink2 is None:  # m = -inf, l = 0 (or the sink column: m = sink, l = 1)
            m, l = np.full(n * R, ninf, dt), np.zeros(n * R, dt)  # (n*R,), (n*R,)
        else:
            m, l = np.repeat(sink2[a:b], i1 - i0, axis=1).reshape(n * R), np.ones(n * R, dt)
        acc, pv = np.zeros((n, R, Dv), dt), np.empty((n, R, Dv), dt)  # (n, R, Dv)
        sbuf = np.empty(n * R * opts.block_k, dt)  # the score tile's memory
        for j0, j1, keep in ks:
            s = np.matmul(qb, k3[a:b, j0:j1].swapaxes(-1, -2), out=_tile(sbuf, n, R, j1 - j0))
            online_block_(s.reshape(n * R, j1 - j0), m, l, acc.reshape(n * R, Dv), scale,
                          lowest, *_mask_args(opts, i0, i1, j0, keep, Tk - Tq))
            acc += np.matmul(s, v3[a:b, j0:j1], out=pv)  # fwd: A += exp(S - m) v  (n, R, Dv)
        seen = (l > 0).reshape(n, R, 1)  # (n, R, 1)
        ob = np.divide(acc, l.reshape(n, R, 1), out=np.zeros_like(acc), where=seen)
        out4[a:b, :, i0:i1] = ob.reshape(n, G, i1 - i0, Dv)
        lse3[a:b, :, i0:i1] = np.where(seen[..., 0], m.reshape(n, R) + np.log(
            np.where(seen[..., 0], l.reshape(n, R), 1)), ninf).reshape(n, G, i1 - i0)
    run_tasks(task, len(groups) * len(sched), workers)


def backward_lanes(dout, cache, sched):
    """flash_sdpa_backward's loops per lane (no ALiBi): (dq, dk, dv, dsinks (Hkv, G) or None)."""
    q, k, v, _, sinks, out, lse, opts = cache
    B, H, Tq, Dh = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    N, G, dt = B * Hkv, H // Hkv, q.dtype
    scale = dt.type(opts.scale)
    dq, dk, dv = np.empty(q.shape, dt), np.zeros(k.shape, dt), np.zeros(v.shape, dt)
    q4, do4, out4, dq4 = (_lanes(a, N) for a in (q, dout, out, dq))  # (N, G, Tq, Dh|Dv)
    k3, v3, dk3, dv3 = (_lanes(a, N)[:, 0] for a in (k, v, dk, dv))  # (N, Tk, Dh|Dv)
    lse3 = lse.reshape(N, G, Tq)
    sink2 = None if sinks is None else np.tile(sinks.astype(dt).reshape(Hkv, G), (B, 1))  # (N,G)
    workers = _workers(N, B * H * Tq * Tk * (2 * Dh + 3 * Dv))
    groups = _lane_groups(N, workers)

    def task(t):
        a, b = groups[t]
        n, R_max, bk_max = b - a, G * opts.block_q, opts.block_k
        d_row = np.sum(do4[a:b] * out4[a:b], axis=-1)  # D = rowsum(dout * out)  (n, G, Tq)
        L = np.where(np.isfinite(lse3[a:b]), lse3[a:b], np.inf)  # masked row: P = 0  (n,G,Tq)
        dsink = None if sink2 is None else -np.sum(  # dS_sink = -P_sink D, summed over rows
            np.exp(sink2[a:b, :, None] - L) * d_row, axis=-1)  # (n, G)
        sbuf, dpbuf = (np.empty(n * R_max * bk_max, dt) for _ in range(2))  # the two tiles
        dk_tmp, dv_tmp = np.empty(n * bk_max * Dh, dt), np.empty(n * bk_max * Dv, dt)
        dq_tmp = np.empty(n * R_max * Dh, dt)  # the products added into dk, dv, dq
        for i0, i1, ks in sched:
            R = G * (i1 - i0)
            qb, dob = _rows(q4[a:b], i0, i1), _rows(do4[a:b], i0, i1)  # (n, R, Dh|Dv)
            Lb = np.ascontiguousarray(L[:, :, i0:i1]).reshape(n * R)  # (n*R,)
            Db = np.ascontiguousarray(d_row[:, :, i0:i1]).reshape(n * R)  # (n*R,)
            dqb = np.zeros((n, R, Dh), dt)  # (n, R, Dh)
            for j0, j1, keep in ks:
                bk, kb, vb = j1 - j0, k3[a:b, j0:j1], v3[a:b, j0:j1]  # (n, bk, Dh|Dv)
                p = np.matmul(qb, kb.swapaxes(-1, -2), out=_tile(sbuf, n, R, bk))  # (n, R, bk)
                probs_block_(p.reshape(n * R, bk), Lb, scale,
                             *_mask_args(opts, i0, i1, j0, keep, Tk - Tq))  # P = exp(S - L)
                dv3[a:b, j0:j1] += np.matmul(p.swapaxes(-1, -2), dob,
                                             out=_tile(dv_tmp, n, bk, Dv))  # dv = P^T dout
                dp = np.matmul(dob, vb.swapaxes(-1, -2), out=_tile(dpbuf, n, R, bk))  # dout v^T
                ds = softmax_grad_(dp, p, Db, scale)  # scale P (dP - D)  (n, R, bk)
                dqb += np.matmul(ds, kb, out=_tile(dq_tmp, n, R, Dh))  # dq = scale dS k
                dk3[a:b, j0:j1] += np.matmul(ds.swapaxes(-1, -2), qb,
                                             out=_tile(dk_tmp, n, bk, Dh))  # dk = scale dS^T q
            dq4[a:b, :, i0:i1] = dqb.reshape(n, G, i1 - i0, Dh)
        return dsink

    dsinks = run_tasks(task, len(groups), workers)
    dsinks = None if sinks is None else np.concatenate(dsinks).reshape(B, Hkv, G).sum(axis=0)
    return dq, dk, dv, dsinks
