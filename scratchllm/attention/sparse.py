"""Top-k sparse attention in the form of DeepSeek Sparse Attention (DeepSeek-V3.2-Exp,
deepseek-ai/DeepSeek-V3.2-Exp inference/model.py): each query attends only to the k keys its
lightning indexer (indexer.py) ranks highest among the causal ones, O(T k) instead of O(T^2).

Math (S_t = indices[t], shared by every head, -1 = padding when fewer than k keys exist):
    s[h, t, i] = scale q[h, t] . k[S_t[i]],  P = softmax_i(s),  out[h, t] = sum_i P[h, t, i] v[S_t[i]]
Backward through the selected entries only: with the gathered k_sel = k[S_t], v_sel = v[S_t],
    dv_sel = P^T dout,  dP = dout v_sel^T,  dS = softmax backward,  dq = scale dS k_sel,
    dk_sel = scale dS^T q,  and the gather's backward scatter-adds dk_sel, dv_sel into dk, dv.
It equals sdpa under the mask "key s is in S_t", and full causal attention when k >= T.
Queries are processed in blocks, so the gathered (bq, k, Dh) keys of one block are the
largest temporary; P (B, H, Tq, k) is kept for the backward.

Glossary: B batch, Tq/Tk query/key lengths, H heads, Hkv KV heads, G = H / Hkv, Dh head dim,
Dv value dim, K = top_k selected keys per query; bq the query block.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.sdpa import check_heads
from scratchllm.core.ops import softmax_forward
from scratchllm.core.validate import (common_float, expect_dout, expect_finite, expect_int,
                                      expect_ndim, expect_shape)


class SparseCache(NamedTuple):
    q: np.ndarray        # (B, H, Tq, Dh)
    k: np.ndarray        # (B, Hkv, Tk, Dh)
    v: np.ndarray        # (B, Hkv, Tk, Dv)
    indices: np.ndarray  # (B, Tq, K) int, -1 = padding
    p: np.ndarray        # (B, Hkv, Tq, G, K) attention over the selected keys
    scale: float
    block_q: int


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


def topk_sparse_attention_forward(q, k, v, indices, *, scale=None, block_q=64):
    """out[h, t] = softmax over the selected keys S_t = indices[t] of scale q k^T, times v.

    Inputs:  q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv); indices (B, Tq, K)
             ints (topk_select of the indexer's scores; -1 = no key); scale default Dh^-1/2.
    Returns: out (B, H, Tq, Dv); a row with no selected key gives zeros.  Cache: SparseCache.
    """
    q, k, v = common_float(q, k, v)
    B, H, Tq, Dh, Hkv, Tk = check_heads("topk_sparse_attention", q, k, v)
    expect_int("topk_sparse_attention", "indices", indices)
    expect_shape("topk_sparse_attention", "indices", indices, (B, Tq, None), "(B, Tq, K)")
    if indices.size and (indices.max() >= Tk or indices.min() < -1):
        raise ValueError(f"topk_sparse_attention: indices must lie in [-1, Tk) = [-1, {Tk})")
    G, K, Dv = H // Hkv, indices.shape[2], v.shape[3]
    scale = Dh ** -0.5 if scale is None else expect_finite("topk_sparse_attention", "scale",
                                                           scale)
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
    return out, SparseCache(q, k, v, indices, p, scale, int(block_q))


def topk_sparse_attention_backward(dout, cache):
    """Math, per query block with k_sel, v_sel the gathered keys and values:
        dv_sel = P^T dout,  dP = dout v_sel^T,  dS = P (dP - rowsum(dP P)),
        dq = scale dS k_sel,  dk_sel = scale dS^T q;  dk, dv = scatter-add of dk_sel, dv_sel.
    Only the selected entries carry gradient; padding (-1) has P = 0.
    Reference: deepseek-ai/DeepSeek-V3.2-Exp inference/model.py; Dao 2023 (arXiv 2307.08691)
    for the softmax backward's row term."""
    expect_dout("topk_sparse_attention_backward", dout, cache.q.shape[:3] + cache.v.shape[3:],
                cache.q.dtype)  # (B, H, Tq, Dv)
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
