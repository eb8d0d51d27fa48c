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
import ctypes
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from scratchllm.attention.flash_kernels import online_block_, probs_block_, softmax_grad_

_OPENBLAS = ("scipy_openblas_{}_num_threads64_", "scipy_openblas_{}_num_threads",
             "openblas_{}_num_threads64_", "openblas_{}_num_threads")


@lru_cache(maxsize=1)
def _blas_thread_controls():
    """[(get, set)] thread-count functions of the OpenBLAS libraries mapped into this process
    (NumPy's, SciPy's), read once from /proc/self/maps; [] when there is none."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower()})
    except OSError:
        return []
    controls = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _OPENBLAS:
            if hasattr(lib, name.format("get")) and hasattr(lib, name.format("set")):
                controls.append((getattr(lib, name.format("get")), getattr(lib, name.format("set"))))
                break
    return controls


THREADS_FROM = 1 << 24  # multiply-adds of a call below which threads cost more than they give


def run_tasks(fn, n_tasks, work):
    """[fn(i) for i in range(n_tasks)], on as many threads as BLAS had (BLAS at one thread
    meanwhile, then restored); in turn when BLAS has one thread, there is one task, or the
    call's work (multiply-adds) is below THREADS_FROM (a thread pool costs ~0.1-1 ms)."""
    controls = _blas_thread_controls() if n_tasks > 1 and work >= THREADS_FROM else []
    before = [int(get()) for get, _ in controls]
    workers = min(n_tasks, max(before, default=1))
    if workers <= 1:
        return [fn(i) for i in range(n_tasks)]
    for _, set_threads in controls:
        set_threads(1)
    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(fn, range(n_tasks)))
    finally:
        for (_, set_threads), n in zip(controls, before):
            set_threads(n)


def _lane_rows(a, G, i0, i1):
    """Rows i0:i1 of a lane's G heads (G, T, X), grouped: (G*bq, X), C-contiguous."""
    return np.ascontiguousarray(a[:, i0:i1]).reshape(G * (i1 - i0), a.shape[-1])  # (R, X)


def _mask_args(opts, i0, i1, j0, keep, offset):
    """The tile's mask for flash_kernels: (i0, bq, j0, offset, causal, window, n_sink); a
    tile flash._blocks found fully kept gets none."""
    causal = opts.causal and keep is not True
    window = -1 if opts.window is None else opts.window
    return i0, i1 - i0, j0, offset, causal, window, opts.n_sink


def _tile(buf, R, bk):
    """The first R*bk entries of a flat buffer as a C-contiguous (R, bk) tile."""
    return buf[:R * bk].reshape(R, bk)  # (R, bk)


def forward_lanes(q, k, v, sinks, opts, sched, out, lse):
    """flash_sdpa_forward's loops per lane and query block (tasks, the longest rows first);
    fills out (B, H, Tq, Dv) and lse (B, Hkv, G*Tq, 1). sched: flash._blocks's list
    [(i0, i1, [(j0, j1, keep)])]; sinks (H,) or None."""
    B, H, Tq, Dh = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    G, dt = H // Hkv, q.dtype
    scale, ninf = dt.type(opts.scale), dt.type(-np.inf)
    lowest = np.finfo(dt).min  # online_block_'s reference for a row with no key yet
    order = sorted(range(len(sched)), key=lambda i: -len(sched[i][2]))  # longest rows first

    def task(n):  # one query block of one lane: independent of every other
        (b, h), (i0, i1, ks) = divmod(n % (B * Hkv), Hkv), sched[order[n // (B * Hkv)]]
        ql, kl, vl = q[b, h * G:(h + 1) * G], k[b, h], v[b, h]  # (G,Tq,Dh), (Tk,Dh), (Tk,Dv)
        qb, R = _lane_rows(ql, G, i0, i1), G * (i1 - i0)  # (R, Dh)
        if sinks is None:  # m = -inf, l = 0 (or the sink column: m = sink, l = 1)
            m, l = np.full(R, ninf, dt), np.zeros(R, dt)  # (R,), (R,)
        else:
            m, l = np.repeat(sinks[h * G:(h + 1) * G].astype(dt), i1 - i0), np.ones(R, dt)
        acc, pv = np.zeros((R, Dv), dt), np.empty((R, Dv), dt)  # (R, Dv), (R, Dv)
        sbuf = np.empty(R * opts.block_k, dt)  # the score tile's memory
        for j0, j1, keep in ks:
            s = np.matmul(qb, kl[j0:j1].T, out=_tile(sbuf, R, j1 - j0))  # (R, bk)
            online_block_(s, m, l, acc, scale, lowest, *_mask_args(opts, i0, i1, j0, keep,
                                                                 Tk - Tq))
            acc += np.matmul(s, vl[j0:j1], out=pv)  # fwd: A += exp(S - m) v
        seen = l > 0  # (R,)
        ob = np.divide(acc, l[:, None], out=np.zeros_like(acc), where=seen[:, None])
        out[b, h * G:(h + 1) * G, i0:i1] = ob.reshape(G, i1 - i0, Dv)
        lse[b, h, :, 0].reshape(G, Tq)[:, i0:i1] = np.where(  # lse: (G, Tq) view of the lane
            seen, m + np.log(np.where(seen, l, 1)), ninf).reshape(G, i1 - i0)
    run_tasks(task, B * Hkv * len(sched), B * H * Tq * Tk * (Dh + Dv))


def backward_lanes(dout, cache, sched):
    """flash_sdpa_backward's loops per lane (no ALiBi): (dq, dk, dv, dsinks (Hkv, G) or None)."""
    q, k, v, _, sinks, out, lse, opts = cache
    B, H, Tq, Dh = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    G, dt = H // Hkv, q.dtype
    scale = dt.type(opts.scale)
    dq, dk, dv = np.empty_like(q), np.zeros_like(k), np.zeros_like(v)
    R_max = G * opts.block_q

    def lane(n):
        b, h = divmod(n, Hkv)
        heads = slice(h * G, (h + 1) * G)
        ql, dol, kl, vl = q[b, heads], dout[b, heads], k[b, h], v[b, h]
        d_row = np.sum(dol * out[b, heads], axis=-1)  # D = rowsum(dout * out)  (G, Tq)
        L = lse[b, h, :, 0].reshape(G, Tq)  # (G, Tq)
        L = np.where(np.isfinite(L), L, np.inf)  # a fully masked row: P = exp(-inf) = 0
        dsink = None if sinks is None else -np.sum(  # dS_sink = -P_sink D, summed over rows
            np.exp(sinks[heads].astype(dt)[:, None] - L) * d_row, axis=-1)  # (G,)
        sbuf, dpbuf = np.empty(R_max * opts.block_k, dt), np.empty(R_max * opts.block_k, dt)
        dk_tmp, dv_tmp = np.empty((opts.block_k, Dh), dt), np.empty((opts.block_k, Dv), dt)
        dq_tmp = np.empty((R_max, Dh), dt)  # the products added into dk, dv, dq
        for i0, i1, ks in sched:
            R = G * (i1 - i0)
            qb, dob = _lane_rows(ql, G, i0, i1), _lane_rows(dol, G, i0, i1)  # (R, Dh|Dv)
            Lb = np.ascontiguousarray(L[:, i0:i1]).reshape(R)  # (R,)
            Db = np.ascontiguousarray(d_row[:, i0:i1]).reshape(R)  # (R,)
            dqb = np.zeros((R, Dh), dt)  # (R, Dh)
            for j0, j1, keep in ks:
                bk, kb, vb = j1 - j0, kl[j0:j1], vl[j0:j1]  # (bk, Dh), (bk, Dv)
                p = np.matmul(qb, kb.T, out=_tile(sbuf, R, bk))  # (R, bk)
                probs_block_(p, Lb, scale, *_mask_args(opts, i0, i1, j0, keep, Tk - Tq))
                dv[b, h, j0:j1] += np.matmul(p.T, dob, out=dv_tmp[:bk])  # dv = P^T dout
                dp = np.matmul(dob, vb.T, out=_tile(dpbuf, R, bk))  # dP = dout v^T  (R, bk)
                ds = softmax_grad_(dp, p, Db, scale)  # scale P (dP - D)  (R, bk)
                dqb += np.matmul(ds, kb, out=dq_tmp[:R])  # dq = scale dS k
                dk[b, h, j0:j1] += np.matmul(ds.T, qb, out=dk_tmp[:bk])  # dk = scale dS^T q
            dq[b, heads, i0:i1] = dqb.reshape(G, i1 - i0, Dh)
        return dsink

    dsinks = run_tasks(lane, B * Hkv, B * H * Tq * Tk * (2 * Dh + 3 * Dv))
    dsinks = None if sinks is None else np.sum(np.reshape(dsinks, (B, Hkv, G)), axis=0)
    return dq, dk, dv, dsinks
