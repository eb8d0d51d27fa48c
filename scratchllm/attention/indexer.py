"""The lightning indexer of DeepSeek Sparse Attention and its KL loss (sparse.py attends to
the keys it selects). DeepSeek Sparse Attention (DeepSeek-V3.2-Exp,
deepseek-ai/DeepSeek-V3.2-Exp inference/model.py class Indexer): a cheap "lightning indexer"
scores every (query, key) pair, each query keeps its top-k causal keys, and attention runs on
those k keys only, O(T k) instead of O(T^2).

Math:
    indexer:    I[t, s] = sum_j w[t, j] relu(q_I[t, j] . k_I[s])      (HI small heads, DI dims)
    selection:  S_t = the top_k keys s <= t by I[t, s] (all of them when t + 1 <= top_k);
                shared by every attention head, as DSA shares it over MLA's heads
    attention:  out[h, t] = sum_{s in S_t} softmax_s(scale q[h, t] . k[s]) v[s]
    indexer loss (the indexer trains on its own, the attention detached):
                p_t = sum_h P[h, t, :] / H  (dense attention, or restricted to S_t, renormed)
                L = (1/N) sum_t KL(p_t || softmax(I[t, :]))   over the rows' allowed keys
Backward: attention's flows through the selected entries only (a gather forward is a
scatter-add backward); the indexer's, with r = q_I . k_I and a = relu(r):
    dw[t, j] = sum_s dI[t, s] a[t, j, s],  dr = w dI [r > 0],
    dq_I[t, j] = sum_s dr[t, j, s] k_I[s],  dk_I[s] = sum_{t, j} dr[t, j, s] q_I[t, j];
the KL loss's, per row: dL/dI[t, s] = (softmax(I_t)[s] - p_t[s]) / N (the entropy of p does
not depend on I; d/dI of -sum_s p log softmax(I)_s is softmax(I) sum_s p_s - p, sum_s p_s = 1).

Glossary: B batch, Tq/Tk query/key lengths, H heads, Hkv KV heads, G = H / Hkv, Dh head dim,
Dv value dim, K = top_k; HI, DI the indexer's heads and head dim; N the rows of the loss.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.ops import log_softmax_forward, softmax_forward
from scratchllm.core.validate import expect_bool, expect_dout, expect_ndim, expect_shape


# ---------------------------------------------------------------------------- indexer
class IndexerCache(NamedTuple):
    q_idx: np.ndarray  # (B, Tq, HI, DI)
    k_idx: np.ndarray  # (B, Tk, DI)
    w: np.ndarray      # (B, Tq, HI)
    r: np.ndarray      # (B, Tq, HI, Tk) = q_I . k_I


def lightning_indexer_forward(q_idx, k_idx, w):
    """I[b, t, s] = sum_j w[b, t, j] relu(q_idx[b, t, j] . k_idx[b, s]).

    Inputs:  q_idx (B, Tq, HI, DI), k_idx (B, Tk, DI) (one key per token, shared by the
             indexer heads), w (B, Tq, HI) per-token head weights.
    Returns: I (B, Tq, Tk), unmasked (topk_select applies causality).  Cache: IndexerCache.
    """
    expect_ndim("lightning_indexer", "q_idx", q_idx, 4, "(B, Tq, HI, DI)")
    B, Tq, HI, DI = q_idx.shape
    expect_shape("lightning_indexer", "k_idx", k_idx, (B, None, DI), "(B, Tk, DI)")
    expect_shape("lightning_indexer", "w", w, (B, Tq, HI), "(B, Tq, HI)")
    r = q_idx @ k_idx[:, None].swapaxes(-1, -2)  # (B, Tq, HI, Tk)
    scores = (w[..., None] * np.maximum(r, 0)).sum(axis=2)  # (B, Tq, Tk)
    return scores, IndexerCache(q_idx, k_idx, w, r)


def lightning_indexer_backward(dout, cache):
    """Math (a = relu(r), r = q_I . k_I):  dw = sum_s dI a,  dr = w dI [r > 0],
    dq_I = dr k_I,  dk_I = sum_{t, j} dr^T q_I.
    Reference: deepseek-ai/DeepSeek-V3.2-Exp inference/model.py class Indexer."""
    expect_dout("lightning_indexer_backward", dout, cache.r.shape[:2] + cache.r.shape[3:],
                np.result_type(cache.w, cache.r))  # I (B, Tq, Tk)
    q_idx, k_idx, w, r = cache
    B, Tq, HI, DI = q_idx.shape
    a = np.maximum(r, 0)  # (B, Tq, HI, Tk)
    dw = np.einsum("bts,btjs->btj", dout, a)  # fwd: I = sum_j w a -> dw = sum_s dI a
    dr = w[..., None] * dout[:, :, None, :] * (r > 0)  # fwd: a = relu(r)   (B, Tq, HI, Tk)
    dq = dr @ k_idx[:, None]  # fwd: r = q_I k_I^T -> dq_I = dr k_I        (B, Tq, HI, DI)
    dk = dr.reshape(B, Tq * HI, -1).swapaxes(-1, -2) @ q_idx.reshape(B, Tq * HI, DI)  # (B,Tk,DI)
    return {"q_idx": dq, "k_idx": dk, "w": dw}


# ---------------------------------------------------------------------------- KL loss
class IndexerKLCache(NamedTuple):
    log_q: np.ndarray   # (B, Tq, Tk) log softmax(I) over the allowed keys, -inf elsewhere
    target: np.ndarray  # (B, Tq, Tk) p, rows summing to 1 over the allowed keys
    n_rows: int


def attention_distribution(q, k, allowed, scale=None):
    """The indexer's target p (B, Tq, Tk): the attention probabilities of every query head
    summed over heads and L1-renormalised over the allowed keys (a constant: no backward).

    Inputs: q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), allowed bool (Tq, Tk) or (B, Tq, Tk).
    """
    B, H, Tq, Dh = q.shape
    Hkv = k.shape[1]
    s = q.reshape(B, Hkv, -1, Tq, Dh) @ k[:, :, None].swapaxes(-1, -2)  # (B, Hkv, G, Tq, Tk)
    s = s * (Dh ** -0.5 if scale is None else scale)
    p = softmax_forward(np.where(allowed[:, None, None] if allowed.ndim == 3 else allowed,
                                 s, -np.inf))[0].sum(axis=(1, 2))  # (B, Tq, Tk)
    total = p.sum(axis=-1, keepdims=True)  # (B, Tq, 1)
    return p / np.where(total > 0, total, 1)  # (B, Tq, Tk)


def indexer_kl_loss_forward(index_scores, target, allowed):
    """L = mean over rows t of KL(p_t || softmax(I_t)), both over the allowed keys.

    Inputs:  index_scores I (B, Tq, Tk); target p (B, Tq, Tk) (attention_distribution; rows
             sum to 1 over the allowed keys, treated as a constant); allowed bool broadcastable
             to (B, Tq, Tk): causal keys (dense warm-up) or the selected ones (sparse stage).
    Returns: loss (0-d array).  Cache: IndexerKLCache.
    """
    expect_ndim("indexer_kl_loss", "index_scores", index_scores, 3, "(B, Tq, Tk)")
    expect_shape("indexer_kl_loss", "target", target, index_scores.shape, "like index_scores")
    expect_bool("indexer_kl_loss", "allowed", allowed)
    if allowed.shape not in (index_scores.shape, index_scores.shape[1:]):
        raise ValueError(f"indexer_kl_loss: allowed has shape {allowed.shape}, expected (Tq, Tk)"
                         f" = {index_scores.shape[1:]} or (B, Tq, Tk) = {index_scores.shape}")
    log_q = log_softmax_forward(np.where(allowed, index_scores, -np.inf))[0]  # (B, Tq, Tk)
    live = target > 0  # (B, Tq, Tk): 0 log 0 = 0
    safe_t, safe_log_q = np.where(live, target, 1), np.where(live, log_q, 0)  # no 0 * inf
    terms = np.where(live, target * (np.log(safe_t) - safe_log_q), 0)  # (B, Tq, Tk)
    n_rows = index_scores.shape[0] * index_scores.shape[1]
    loss = np.asarray(terms.sum() / n_rows, index_scores.dtype)
    return loss, IndexerKLCache(log_q, target, n_rows)


def indexer_kl_loss_backward(dloss, cache):
    """Math: L = (1/N) sum_t [sum_s p log p - sum_s p_s log softmax(I_t)_s], so
        dL/dI[t, s] = (softmax(I_t)[s] sum_s' p_ts' - p_ts) / N = (softmax(I_t)[s] - p_ts) / N,
    zero at the keys not allowed (softmax is 0 there and so is p).
    The loss is the DeepSeek-V3.2-Exp report's (section 2.1); the gradient is derived here.
    Reference: grads/cases/attention.py indexer_kl_loss (checked by finite differences)."""
    expect_dout("indexer_kl_loss_backward", dloss, (), cache.log_q.dtype, name="dloss")
    log_q, target, n_rows = cache
    q = np.exp(log_q)  # (B, Tq, Tk), 0 where not allowed
    rows = target.sum(axis=-1, keepdims=True)  # (B, Tq, 1): 1, or 0 for an empty row
    return {"index_scores": np.asarray(dloss) * (q * rows - target) / n_rows}  # (B, Tq, Tk)
