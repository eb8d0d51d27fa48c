"""Top-k sparse attention in the form of DeepSeek Sparse Attention (DeepSeek-V3.2-Exp,
deepseek-ai/DeepSeek-V3.2-Exp inference/model.py): each query attends only to the k keys its
lightning indexer (indexer.py) ranks highest among the causal ones, O(T k) instead of O(T^2).

Math (S_t = indices[t], shared by every head, -1 = padding when fewer than k keys exist):
    s[h, t, i] = scale q[h, t] . k[S_t[i]],  P = softmax_i(s),  out[h, t] = sum_i P[h, t, i] v[S_t[i]]
Backward through the selected entries only: with the gathered k_sel = k[S_t], v_sel = v[S_t],
    dv_sel = P^T dout,  dP = dout v_sel^T,  dS = softmax backward,  dq = scale dS k_sel,
    dk_sel = scale dS^T q,  and the gather's backward scatter-adds dk_sel, dv_sel into dk, dv.
It equals sdpa under the mask "key s is in S_t", and full causal attention when k >= T.
Two twins (core/twins.py), chosen once per forward (the fused one unless SCRATCHLLM_READABLE=1),
the cache carrying the matching backward:
- fused (sparse_kernels.py, Numba, float32 and float64; other dtypes run the readable one):
  each query walks its K key rows (sorted) in place with an online softmax, keeps only out
  and the row logsumexp, and the backward recomputes P and adds dk, dv per (b, KV head)
  lane in query order, key tile by key tile: O(B H Tq K Dh) work, no copy of the selected
  rows, no scatter by sorting;
- readable (_ref): queries in blocks, the gathered (bq, k, Dh) keys of one block the largest
  temporary, P (B, H, Tq, k) kept for the backward, dk, dv scatter-added by sorting.

Glossary: B batch, Tq/Tk query/key lengths, H heads, Hkv KV heads, G = H / Hkv, Dh head dim,
Dv value dim, K = top_k selected keys per query; bq the query block.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.sdpa import check_heads
from scratchllm.attention.sparse_kernels import (LANES, TILE_BYTES, run_strided, sparse_backward_tasks,
                                                sparse_forward_tasks)
from scratchllm.core.ops import softmax_forward
from scratchllm.core.twins import Twin, TwinCache
from scratchllm.core.validate import (common_float, expect_dout, expect_finite, expect_int,
                                      expect_integer, expect_ndim, expect_shape)


class SparseCache(NamedTuple):
    q: np.ndarray        # (B, H, Tq, Dh)
    k: np.ndarray        # (B, Hkv, Tk, Dh)
    v: np.ndarray        # (B, Hkv, Tk, Dv)
    indices: np.ndarray  # (B, Tq, K) int, -1 = padding
    p: np.ndarray        # (B, Hkv, Tq, G, K) attention over the selected keys
    scale: float
    block_q: int


class FusedSparseCache(NamedTuple):
    q: np.ndarray        # (B, H, Tq, Dh) C-contiguous
    k: np.ndarray        # (B, Hkv, Tk, Dh)
    v: np.ndarray        # (B, Hkv, Tk, Dv)
    indices: np.ndarray  # (B, Tq, K) int64, -1 = padding
    out: np.ndarray      # (B, H, Tq, Dv)
    lse: np.ndarray      # (B, H, Tq) row logsumexp over the selected keys, -inf for none
    scale: float


def topk_select(scores, top_k):
    """(B, Tq, K) int: per query row t (at position t + Tk - Tq) the top_k keys s <= t by
    score, in increasing key order; -1 pads rows with fewer than top_k causal keys."""
    expect_ndim("topk_select", "scores", scores, 3, "(B, Tq, Tk)")
    B, Tq, Tk = scores.shape
    if not isinstance(top_k, (int, np.integer)) or top_k < 1:
        raise ValueError(f"topk_select: top_k must be a positive integer, got {top_k!r}")
    K = min(int(top_k), Tk)
    causal = np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + (Tk - Tq)  # (Tq, Tk)
    masked = np.where(causal, scores, -np.inf)  # (B, Tq, Tk)
    top = np.argpartition(-masked, K - 1, axis=-1)[..., :K]  # (B, Tq, K), unordered
    top = np.sort(top, axis=-1)  # (B, Tq, K)
    keep = np.take_along_axis(np.broadcast_to(causal, masked.shape), top, -1)  # (B, Tq, K)
    return np.where(keep, top, -1)  # (B, Tq, K)


def _gather(a, idx):
    """a (B, Hkv, Tk, X) at idx (B, bq, K) (-1 read as 0): (B, Hkv, bq, K, X)."""
    b = np.arange(a.shape[0])[:, None, None]  # (B, 1, 1)
    return a[b, :, np.maximum(idx, 0)].transpose(0, 3, 1, 2, 4)  # (B, Hkv, bq, K, X)


def _scatter_add(target, idx, vals):
    """target (B*Tk, Hkv*X) += vals (B, Hkv, bq, K, X) at rows b*Tk + idx (B, bq, K): the
    gather's backward, by sorting the rows and summing runs of equal rows (add.reduceat)."""
    B, Hkv, _, _, X = vals.shape
    Tk = target.shape[0] // B
    rows = (np.arange(B)[:, None, None] * Tk + np.maximum(idx, 0)).ravel()  # (B*bq*K,)
    flat = vals.transpose(0, 2, 3, 1, 4).reshape(rows.size, Hkv * X)  # (B*bq*K, Hkv*X)
    order = np.argsort(rows, kind="stable")
    rows, flat = rows[order], flat[order]
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])  # first of each run
    target[rows[starts]] += np.add.reduceat(flat, starts, axis=0)  # rows are distinct


def _unflatten(t, B, Hkv):
    """(B*Tk, Hkv*X) -> (B, Hkv, Tk, X)."""
    return t.reshape(B, -1, Hkv, t.shape[1] // Hkv).transpose(0, 2, 1, 3)  # (B, Hkv, Tk, X)


def _inputs(q, k, v, indices, scale, block_q):
    """The checked inputs of either twin: q, k, v in their common float dtype, the scale
    (default Dh^-1/2) and block_q; the sizes (B, H, Tq, Dh, Hkv, Tk, G, K, Dv)."""
    fn = "topk_sparse_attention"
    q, k, v = common_float(q, k, v)
    B, H, Tq, Dh, Hkv, Tk = check_heads(fn, q, k, v)
    expect_int(fn, "indices", indices)
    expect_shape(fn, "indices", indices, (B, Tq, None), "(B, Tq, K)")
    if indices.size and (indices.max() >= Tk or indices.min() < -1):
        raise ValueError(f"{fn}: indices must lie in [-1, Tk) = [-1, {Tk})")
    scale = Dh ** -0.5 if scale is None else expect_finite(fn, "scale", scale)
    block_q = expect_integer(fn, "block_q", block_q, 1)
    sizes = (B, H, Tq, Dh, Hkv, Tk, H // Hkv, indices.shape[2], v.shape[3])
    return q, k, v, scale, block_q, sizes


def topk_sparse_attention_forward(q, k, v, indices, *, scale=None, block_q=64):
    """out[h, t] = softmax over the selected keys S_t = indices[t] of scale q k^T, times v.

    Inputs:  q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv); indices (B, Tq, K)
             ints (topk_select of the indexer's scores; -1 = no key); scale default Dh^-1/2;
             block_q the queries per block (task).
    Returns: out (B, H, Tq, Dv); a row with no selected key gives zeros.
    Cache:   TwinCache of the twin that ran (the fused one for float32/float64 unless
             SCRATCHLLM_READABLE=1; see the module docstring).
    """
    if all(isinstance(a, np.ndarray) and a.dtype in (np.float32, np.float64) for a in (q, k, v)):
        return SPARSE.forward(q, k, v, indices, scale=scale, block_q=block_q)
    out, cache = topk_sparse_attention_forward_ref(q, k, v, indices, scale=scale,
                                                   block_q=block_q)  # no fused twin
    return out, TwinCache(topk_sparse_attention_backward_ref, cache)


def topk_sparse_attention_backward(dout, cache):
    """{q, k, v} by the backward of the twin whose forward made `cache` (the math of both:
    topk_sparse_attention_backward_ref)."""
    _check_dout("topk_sparse_attention_backward", dout, cache.cache)
    return SPARSE.backward(dout, cache)


def _check_dout(fn, dout, cache):
    """dout has the forward output's shape (B, H, Tq, Dv) and dtype (either twin's cache)."""
    expect_dout(fn, dout, cache.q.shape[:3] + cache.v.shape[3:], cache.q.dtype)


def fused_topk_sparse_attention_forward(q, k, v, indices, *, scale=None, block_q=64):
    """The fused twin (sparse_kernels.py): the same inputs and out; Cache: FusedSparseCache
    (the inputs, out and the row logsumexp (B, H, Tq); P is recomputed in the backward)."""
    q, k, v, scale, block_q, (B, H, Tq, Dh, Hkv, Tk, G, K, Dv) = _inputs(q, k, v, indices,
                                                                         scale, block_q)
    q, k, v = (np.ascontiguousarray(a) for a in (q, k, v))
    idx = np.sort(indices, axis=-1).astype(np.int64, copy=False)  # (B, Tq, K) -1 first
    out = np.empty((B, H, Tq, Dv), q.dtype)  # (B, H, Tq, Dv)
    lse = np.empty((B, H, Tq), q.dtype)  # (B, H, Tq)
    sc = q.dtype.type(scale)
    run_strided(sparse_forward_tasks, (q.reshape(B * H, Tq, Dh), k.reshape(B * Hkv, Tk, Dh),
                                     v.reshape(B * Hkv, Tk, Dv), idx, sc, block_q),
              (out.reshape(B * H, Tq, Dv), lse.reshape(B * H, Tq)), work=B * H * Tq * K * (Dh + Dv))
    return out, FusedSparseCache(q, k, v, idx, out, lse, scale)


def fused_topk_sparse_attention_backward(dout, cache):
    """The fused twin's backward: topk_sparse_attention_backward_ref's math with P
    recomputed from the row logsumexp, D = rowsum(dout * out) (flash.py), and dk, dv added
    per (b, KV head, query chunk) lane (sparse_kernels.py)."""
    _check_dout("fused_topk_sparse_attention_backward", dout, cache)  # (B, H, Tq, Dv)
    q, k, v, idx, out, lse, scale = cache
    B, H, Tq, Dh = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    C = max(1, min(Tq, -(-LANES // (B * Hkv))))  # query chunks per (b, KV head): shapes only
    tile = max(16, TILE_BYTES // (2 * (Dh + Dv) * q.itemsize))  # k, v, dk, dv rows in cache
    dq = np.empty_like(q)  # (B, H, Tq, Dh)
    dk = np.zeros((B, Hkv, C, Tk, Dh), k.dtype)  # (B, Hkv, C, Tk, Dh) per-chunk partials
    dv = np.zeros((B, Hkv, C, Tk, Dv), v.dtype)  # (B, Hkv, C, Tk, Dv)
    before = (q.reshape(B * H, Tq, Dh), k.reshape(B * Hkv, Tk, Dh), v.reshape(B * Hkv, Tk, Dv),
              idx, q.dtype.type(scale), (out.reshape(B * H, Tq, Dv), lse.reshape(B * H, Tq)),
              np.ascontiguousarray(dout).reshape(B * H, Tq, Dv), (C, tile))
    run_strided(sparse_backward_tasks, before, ((dq.reshape(B * H, Tq, Dh),
                                               dk.reshape(B * Hkv * C, Tk, Dh),
                                               dv.reshape(B * Hkv * C, Tk, Dv)),),
                work=B * H * Tq * idx.shape[-1] * (2 * Dh + 2 * Dv))
    if C == 1:
        return {"q": dq, "k": dk[:, :, 0], "v": dv[:, :, 0]}
    return {"q": dq, "k": dk.sum(axis=2), "v": dv.sum(axis=2)}  # chunks added in order


def topk_sparse_attention_forward_ref(q, k, v, indices, *, scale=None, block_q=64):
    """The readable twin: the same inputs and out; Cache: SparseCache (P kept)."""
    q, k, v, scale, block_q, (B, H, Tq, Dh, Hkv, Tk, G, K, Dv) = _inputs(q, k, v, indices,
                                                                         scale, block_q)
    qg = q.reshape(B, Hkv, G, Tq, Dh).transpose(0, 1, 3, 2, 4)  # (B, Hkv, Tq, G, Dh)
    out = np.empty((B, Hkv, Tq, G, Dv), q.dtype)  # (B, Hkv, Tq, G, Dv)
    p = np.empty((B, Hkv, Tq, G, K), q.dtype)  # (B, Hkv, Tq, G, K)
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        idx = indices[:, i0:i1]  # (B, bq, K)
        s = qg[:, :, i0:i1] @ _gather(k, idx).swapaxes(-1, -2)  # (B, Hkv, bq, G, K)
        s *= np.asarray(scale, s.dtype)
        np.copyto(s, np.asarray(-np.inf, s.dtype), where=(idx < 0)[:, None, :, None, :])
        p[:, :, i0:i1] = softmax_forward(s)[0]
        out[:, :, i0:i1] = p[:, :, i0:i1] @ _gather(v, idx)  # (B, Hkv, bq, G, Dv)
    out = out.transpose(0, 1, 3, 2, 4).reshape(B, H, Tq, Dv)  # (B, H, Tq, Dv)
    return out, SparseCache(q, k, v, indices, p, scale, block_q)


def topk_sparse_attention_backward_ref(dout, cache):
    """Math, per query block with k_sel, v_sel the gathered keys and values:
        dv_sel = P^T dout,  dP = dout v_sel^T,  dS = P (dP - rowsum(dP P)),
        dq = scale dS k_sel,  dk_sel = scale dS^T q;  dk, dv = scatter-add of dk_sel, dv_sel.
    Only the selected entries carry gradient; padding (-1) has P = 0.
    Reference: deepseek-ai/DeepSeek-V3.2-Exp inference/model.py; Dao 2023 (arXiv 2307.08691)
    for the softmax backward's row term."""
    _check_dout("topk_sparse_attention_backward_ref", dout, cache)  # (B, H, Tq, Dv)
    q, k, v, indices, p, scale, block_q = cache
    B, H, Tq, Dh = q.shape
    Hkv, G, Dv = k.shape[1], H // k.shape[1], v.shape[3]
    qg = q.reshape(B, Hkv, G, Tq, Dh).transpose(0, 1, 3, 2, 4)  # (B, Hkv, Tq, G, Dh)
    dog = dout.reshape(B, Hkv, G, Tq, Dv).transpose(0, 1, 3, 2, 4)  # (B, Hkv, Tq, G, Dv)
    dq = np.empty_like(qg)  # (B, Hkv, Tq, G, Dh)
    Tk = k.shape[2]
    dk = np.zeros((B * Tk, Hkv * Dh), k.dtype)  # (B*Tk, Hkv*Dh), rows = (batch, key)
    dv = np.zeros((B * Tk, Hkv * Dv), v.dtype)  # (B*Tk, Hkv*Dv)
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        idx, pb, dob = indices[:, i0:i1], p[:, :, i0:i1], dog[:, :, i0:i1]
        k_sel, v_sel = _gather(k, idx), _gather(v, idx)  # (B, Hkv, bq, K, Dh|Dv)
        _scatter_add(dv, idx, pb.swapaxes(-1, -2) @ dob)  # fwd: out = P v_sel -> P^T dout
        dp = dob @ v_sel.swapaxes(-1, -2)  # fwd: out = P v_sel -> dP   (B, Hkv, bq, G, K)
        ds = pb * (dp - np.sum(dp * pb, axis=-1, keepdims=True))  # fwd: P = softmax(s)
        ds *= np.asarray(scale, ds.dtype)  # fwd: s = scale q k_sel^T
        dq[:, :, i0:i1] = ds @ k_sel  # (B, Hkv, bq, G, Dh)
        _scatter_add(dk, idx, ds.swapaxes(-1, -2) @ qg[:, :, i0:i1])  # dk_sel = dS^T q
    dq = dq.transpose(0, 1, 3, 2, 4).reshape(B, H, Tq, Dh)  # (B, H, Tq, Dh)
    return {"q": dq, "k": _unflatten(dk, B, Hkv), "v": _unflatten(dv, B, Hkv)}


SPARSE = Twin((fused_topk_sparse_attention_forward, fused_topk_sparse_attention_backward),
              (topk_sparse_attention_forward_ref, topk_sparse_attention_backward_ref))
