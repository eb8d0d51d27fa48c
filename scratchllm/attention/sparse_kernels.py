"""Numba kernels of the fused top-k sparse attention (sparse.py's fused_topk_sparse_attention_forward
/ _backward_fused call them; the readable twin is sparse.py's _ref pair, which gathers each query
block's keys and scatter-adds by sorting).

Each query walks only its K selected key rows, in place (no gathered copy), in one pass:
    forward, online softmax over the keys (flash.py's recurrence, one key at a time), for the
    G query heads of the key's KV head together (a key row is read once per query):
        s = scale q . k[S_i];  if s > m: acc *= exp(m - s), l *= exp(m - s), m = s
        p = exp(s - m),  l += p,  acc += p v[S_i];   then out = acc / l, lse = m + log l
    backward, with p = exp(s - lse) recomputed from the saved row logsumexp and
    D = dout . out (= rowsum(dP P), flash.py's docstring):
        dP = dout . v[S_i],  dS = scale p (dP - D),
        dq += dS k[S_i],  dk[S_i] += dS q,  dv[S_i] += p dout
A row with no selected key has lse = -inf, out = 0 and no gradient.

Parallel layout (sparse.py runs the tasks on a thread pool; the kernels release the GIL):
the forward's tasks are (b, KV head, block of bq queries), independent. The backward's tasks
are lanes (b, KV head, chunk of queries): a lane adds dk, dv of its own KV head into its own
(Tk, Dh) buffer in query order, so nothing is shared and no sort is needed; with C > 1 chunks
per head (B * Hkv < LANES, so that both cores have work) sparse.py sums the C buffers in chunk
order. A lane walks the keys in tiles of R rows (TILE_BYTES of k, v, dk, dv: they stay in L2
while all its queries visit them; each row's indices are sorted, so a query resumes where the
last tile stopped): the random row accesses hit L2 instead of L3 or memory (80 instead of 120
ns per (query, key, head) at T = 8k, loaded machine); each key still receives its queries'
terms in query order. Tasks depend on the shapes only: the same bits for any thread count.
fastmath "reassoc" + "contract" lets LLVM vectorise the dot products (a fixed order for a given
build; no nnan/ninf: -inf still means "no key").

Glossary: B batch, H query heads, Hkv KV heads, G = H / Hkv, Tq/Tk query/key lengths, Dh head
dim, Dv value dim, K selected keys per query, bq query block, C query chunks per lane,
R key tile rows.
"""
import numba
import numpy as np
from numba import njit

from scratchllm.core.blas import run_tasks
from scratchllm.core.exp32 import exp_lanes

FASTMATH = {"reassoc", "contract"}
LANES = 4  # the backward splits each (b, KV head) into ceil(LANES / (B * Hkv)) query chunks
TILE_BYTES = 1 << 19  # the backward's key tile: rows of k, v, dk, dv in 512 KiB (L2)
# multiply-adds below which one thread is faster than handing off to a pool (a call at the
# grads case's sizes, ~10^4, took 3x the CPU on two threads: starting them is the cost)
MIN_THREADED_WORK = 1 << 16


def run_strided(kernel, before, after, threads=None, *, work=None):
    """kernel(*before, first, step, *after) for first = 0 .. n - 1, step = n, on n threads
    (default numba.get_num_threads(): NUMBA_NUM_THREADS, or 1 when `work`, the multiply-adds
    of the call, is under MIN_THREADED_WORK; the kernels release the GIL)."""
    n = threads
    if n is None:
        n = numba.get_num_threads() if work is None or work >= MIN_THREADED_WORK else 1
    run_tasks(lambda first: kernel(*before, first, n, *after), n, n)


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _dot(a, b):
    """a . b of two rows (Dh,)."""
    acc = a.dtype.type(0)
    for c in range(a.shape[0]):
        acc += a[c] * b[c]
    return acc


@njit(cache=True, fastmath=FASTMATH)
def _exp(x):
    """exp_lanes (core/exp32.py) as a function of its own: LLVM inlines it; inlined by Numba
    into the branches here it trips Numba's IR scope check (NumbaIRAssumptionWarning)."""
    return exp_lanes(x)


@njit(cache=True, fastmath=FASTMATH, inline="always")
def _axpy(y, a, x):
    """y += a x in place (rows)."""
    for c in range(y.shape[0]):
        y[c] += a * x[c]


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def sparse_forward_tasks(q, k, v, idx, scale, block, first, step, out, lse):
    """out (B*H, Tq, Dv) and lse (B*H, Tq) of q (B*H, Tq, Dh), k (B*Hkv, Tk, Dh),
    v (B*Hkv, Tk, Dv), idx (B, Tq, K) int64 (-1 = none); the tasks first, first + step, ...
    of (b, KV head, query block)."""
    B, Tq, K = idx.shape
    H, Hkv, Dv = q.shape[0] // B, k.shape[0] // B, v.shape[2]
    G, nblk = H // Hkv, (Tq + block - 1) // block
    acc = np.empty((G, Dv), q.dtype)  # (G, Dv) sum of p v
    m = np.empty(G, q.dtype)  # (G,) running max
    total = np.empty(G, q.dtype)  # (G,) running sum of p
    for task in range(first, B * Hkv * nblk, step):
        bh, t0 = task // nblk, task % nblk * block  # bh = b * Hkv + KV head
        b, h0 = bh // Hkv, bh * G  # rows h0 .. h0 + G - 1 of q: this KV head's query heads
        for t in range(t0, min(t0 + block, Tq)):
            acc[:], m[:], total[:] = 0, -np.inf, 0
            for i in range(K):
                j = idx[b, t, i]
                if j < 0:
                    continue
                for g in range(G):
                    s = _dot(q[h0 + g, t], k[bh, j]) * scale  # s = scale q . k[S_i]
                    m_new = max(m[g], s)
                    r, p = _exp(m[g] - m_new), _exp(s - m_new)
                    if m_new > m[g]:  # a new max: rescale what was summed against the old one
                        total[g] *= r
                        for c in range(Dv):
                            acc[g, c] *= r
                        m[g] = m_new
                    total[g] += p
                    _axpy(acc[g], p, v[bh, j])
            for g in range(G):
                if total[g] == 0:  # no key: out = 0, lse = -inf
                    out[h0 + g, t, :], lse[h0 + g, t] = 0, -np.inf
                    continue
                lse[h0 + g, t] = m[g] + np.log(total[g])
                for c in range(Dv):
                    out[h0 + g, t, c] = acc[g, c] / total[g]


@njit(cache=True, nogil=True, fastmath=FASTMATH)
def sparse_backward_tasks(q, k, v, idx, scale, fwd, dout, sizes, first, step, grads):
    """dq (B*H, Tq, Dh) and the per-chunk dk (B*Hkv*C, Tk, Dh), dv (B*Hkv*C, Tk, Dv) (zeroed by
    the caller) of sparse_forward_tasks, fwd = (out, lse) and grads = (dq, dk, dv) as there,
    idx sorted along each row (-1 first); sizes = (C chunks, key tile rows R); the lanes
    first, first + step, ... of (b, KV head, chunk of queries). A lane visits the keys tile by
    tile (rows [r R, r R + R) of k, v, dk, dv stay in cache while every query of the chunk
    adds its pairs there), each query resuming at its first index not yet visited."""
    out, lse = fwd
    dq, dk, dv = grads
    chunks, tile = sizes
    B, Tq, K = idx.shape
    H, Hkv, Tk = q.shape[0] // B, k.shape[0] // B, k.shape[1]
    G, per = H // Hkv, (Tq + chunks - 1) // chunks
    d = np.empty((per, G), q.dtype)  # (per, G) D = dout . out
    pos = np.empty(per, np.int64)  # (per,) each query's next index
    for lane in range(first, B * Hkv * chunks, step):
        bh, t0 = lane // chunks, lane % chunks * per
        b, h0, t1 = bh // Hkv, bh * G, min(t0 + per, Tq)
        for t in range(t0, t1):
            pos[t - t0] = 0
            while pos[t - t0] < K and idx[b, t, pos[t - t0]] < 0:  # skip the padding
                pos[t - t0] += 1
            for g in range(G):
                dq[h0 + g, t, :] = 0
                d[t - t0, g] = _dot(dout[h0 + g, t], out[h0 + g, t])
        for end in range(tile, Tk + tile, tile):
            for t in range(t0, t1):
                i = pos[t - t0]
                while i < K and idx[b, t, i] < end:
                    j = idx[b, t, i]
                    for g in range(G):
                        h = h0 + g
                        # fwd: p = exp(scale q . k[S_i] - lse)
                        p = _exp(_dot(q[h, t], k[bh, j]) * scale - lse[h, t])
                        ds = scale * p * (_dot(dout[h, t], v[bh, j]) - d[t - t0, g])  # dS
                        _axpy(dq[h, t], ds, k[bh, j])  # fwd: s = scale q . k
                        _axpy(dk[lane, j], ds, q[h, t])
                        _axpy(dv[lane, j], p, dout[h, t])  # fwd: out = sum_i p v[S_i]
                    i += 1
                pos[t - t0] = i
