"""The MoE router and its losses: top-k gates, Switch balance loss, ST-MoE z-loss, and the
aux-loss-free selection bias (DeepSeek-V3), each as a forward/backward pair.

Papers: Switch Transformer (arXiv 2101.03961), Mixtral (HF `MixtralSparseMoeBlock`),
ST-MoE z-loss (arXiv 2202.08906), DeepSeek-V3 (arXiv 2412.19437), aux-loss-free balancing
(Wang et al., arXiv 2408.15664).

Math (one row n of N tokens):
    s = x @ W_r                       router logits                           (E,)
    q = softmax(s)  or  sigmoid(s)    scores                                  (E,)
    K = top-k of (q + b)              b: selection bias, selects only, no gradient
    g = q_K / sum(q_K)                gates over the chosen k; for softmax this IS softmax(s_K)
    p = q / sum(q)                    router probabilities (= q for softmax; DeepSeek's
                                      normalised sigmoid for the balance loss otherwise)
Both normalisations are the same map u -> u / sum(u), so one pair (_normalise) serves both.

Glossary: N tokens, D model width, E experts, K top-k (k in code).
"""
from typing import NamedTuple

import numpy as np
from scipy.special import expit, logsumexp

from scratchllm import ops
from scratchllm.validate import expect_float, expect_int, expect_shape

SCORES = ("softmax", "sigmoid")


def check_k(fn, k, E):
    """Raise ValueError unless 1 <= k <= E (k is the number of experts a token uses)."""
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= E):
        raise ValueError(f"{fn}: k must be an integer in [1, E={E}], got {k!r}")


def topk_margin(values, k):
    """Per row, the gap between the k-th and (k+1)-th largest value: how far the top-k choice
    is from a tie (inf when k equals the row length). Gradient checks draw routing inputs with
    a margin far above the finite-difference step.

    Inputs: values (N, E), 1 <= k <= E.  Returns: (N,).
    """
    if k == values.shape[-1]:
        return np.full(values.shape[0], np.inf)  # (N,)
    part = -np.partition(-values, (k - 1, k), axis=-1)  # (N, E) k-th and (k+1)-th in place
    return part[:, k - 1] - part[:, k]  # (N,)


# ---------------------------------------------------------------------------- normalise
def _normalise_forward(u):
    """v = u / sum(u) over the last axis (u > 0).  Cache: (v, sum)."""
    total = u.sum(axis=-1, keepdims=True)  # (..., 1)
    v = u / total  # (..., M)
    return v, (v, total)


def _normalise_backward(dv, cache):
    """Math: dv_i/du_j = (delta_ij - v_i) / sum  ->  du = (dv - sum(dv * v)) / sum."""
    v, total = cache
    return (dv - np.sum(dv * v, axis=-1, keepdims=True)) / total  # (..., M)


# ---------------------------------------------------------------------------- router
class RouterCache(NamedTuple):
    linear: ops.LinearCache
    score: str
    scores: np.ndarray
    topk_idx: np.ndarray
    gates: tuple
    probs: tuple


def router_forward(x, w_router, *, k, score="softmax", selection_bias=None):
    """Top-k router.

    Inputs:  x (N, D), w_router (D, E), k in [1, E], score "softmax" | "sigmoid",
             selection_bias (E,) or None: added to the scores for the top-k choice only.
    Returns: (gates (N, K), topk_idx (N, K) int, probs (N, E), logits (N, E)); the k chosen
             experts of a row are in descending order of score + bias.
    Cache:   the logits' linear cache, the scores, topk_idx and the two normalise caches.
    """
    expect_float("router", "x", x)
    expect_shape("router", "x", x, (None, None), "(N, D)")
    expect_shape("router", "w_router", w_router, (x.shape[1], None), "(D, E), D = x.shape[1]")
    N, D = x.shape
    E = w_router.shape[1]
    check_k("router", k, E)
    if score not in SCORES:
        raise ValueError(f"router: score must be one of {SCORES}, got {score!r}")
    logits, lin = ops.linear_forward(x, w_router)  # (N, E)
    scores = ops.softmax_forward(logits)[0] if score == "softmax" else expit(logits)  # (N, E)
    sel = scores
    if selection_bias is not None:
        expect_shape("router", "selection_bias", selection_bias, (E,), "(E,)")
        sel = scores + selection_bias  # (N, E)
    top = np.argpartition(-sel, k - 1, axis=-1)[:, :k]  # (N, K) unordered
    order = np.argsort(-np.take_along_axis(sel, top, axis=-1), axis=-1, kind="stable")
    topk_idx = np.take_along_axis(top, order, axis=-1)  # (N, K)
    gates, g_cache = _normalise_forward(np.take_along_axis(scores, topk_idx, axis=-1))  # (N, K)
    probs, p_cache = _normalise_forward(scores)  # (N, E)
    cache = RouterCache(lin, score, scores, topk_idx, g_cache, p_cache)
    return (gates, topk_idx, probs, logits), cache


def router_backward(dout, cache):
    """Router gradients. dout = (dgates, None, dprobs, dlogits); dprobs, dlogits may be None.

    Math: the gates see the logits only through the chosen scores q_K, so
        dq_K = (dg - sum(dg * g)) / sum(q_K)             (normalise backward), 0 off K
        softmax: ds = q (dq - sum(dq q)); for the gates alone ds_j = g_j (dg_j - sum g dg), j in K
        sigmoid: ds = dq q (1 - q)
    The selection bias only chose K: it gets no gradient (and has no entry).
    Reference: REFERENCE.md §4 (top-k renormalised gates, DeepSeek sigmoid renormalisation).
    """
    lin, score, scores, topk_idx, g_cache, p_cache = cache
    dgates, _, dprobs, dlogits = dout
    dscores = np.zeros_like(scores)  # (N, E)
    if dgates is not None:  # fwd: g = normalise(q_K)
        dq_k = _normalise_backward(dgates, g_cache)  # (N, K)
        np.put_along_axis(dscores, topk_idx, dq_k, axis=-1)  # top-k indices are distinct
    if dprobs is not None:  # fwd: p = normalise(q)
        dscores += _normalise_backward(dprobs, p_cache)
    if score == "softmax":  # fwd: q = softmax(s)
        ds = ops.softmax_backward(dscores, (scores, -1))["x"]  # (N, E)
    else:  # fwd: q = sigmoid(s) -> ds = dq q (1 - q)
        ds = dscores * scores * (1 - scores)  # (N, E)
    if dlogits is not None:
        ds = ds + dlogits  # (N, E)
    g = ops.linear_backward(ds, lin)  # fwd: s = x @ W_r
    return {"x": g["x"], "w_router": g["W"]}


# ---------------------------------------------------------------------------- balance loss
def balance_loss_forward(probs, topk_idx):
    """Switch balance loss L = E * sum_i f_i P_i, equal to 1 at perfect balance.

    f_i = (slots routed to expert i) / (N k), counted before capacity, a constant (no gradient);
    P_i = mean_n p_ni. With f_i = P_i = 1/E, L = E * E / E^2 = 1; skew makes L > 1.

    Derivation (the interview question), p_n = softmax(s_n):
        dL/dp_ni = E f_i / N                       (f held constant)
        dp_ni/ds_nj = p_ni (delta_ij - p_nj)       (softmax Jacobian)
        dL/ds_nj = sum_i E f_i / N * p_ni (delta_ij - p_nj) = (E/N) p_nj (f_j - sum_i f_i p_ni)
    Each row's gradient sums to zero (softmax is shift invariant); it lowers the logit of an
    expert whose load f_j is above the probability-weighted average load, which is what
    undoes router collapse. This pair returns dL/dp; router_backward applies the Jacobian.

    HF Mixtral's `load_balancing_loss_func` uses f_i = (1/N) #{n : i in topk(n)}, so sum f = k
    and the loss equals k at balance (2.0 for top-2); ours divides by N k and equals 1.
    The two differ by the constant factor k only, so the coefficient absorbs it.

    Inputs:  probs (N, E), topk_idx (N, K) integers in [0, E).
    Returns: loss, 0-d array of probs' dtype.  Cache: (f, N).
    """
    expect_float("balance_loss", "probs", probs)
    expect_int("balance_loss", "topk_idx", topk_idx)
    expect_shape("balance_loss", "probs", probs, (None, None), "(N, E)")
    expect_shape("balance_loss", "topk_idx", topk_idx, (probs.shape[0], None), "(N, K)")
    N, E = probs.shape
    slots = np.bincount(topk_idx.ravel(), minlength=E)  # (E,)
    f = (slots / topk_idx.size).astype(probs.dtype)  # (E,)
    P = probs.mean(axis=0)  # (E,)
    return np.asarray(E * np.dot(f, P), dtype=probs.dtype), (f, N)


def balance_loss_backward(dloss, cache):
    """Math: dL/dp_ni = E f_i / N (then the softmax Jacobian in router_backward gives
    (E/N) p_nj (f_j - sum_i f_i p_ni)).  Reference: REFERENCE.md §4."""
    f, N = cache
    E = f.shape[0]
    row = np.asarray(dloss, dtype=f.dtype) * (E / N) * f  # (E,)
    return {"probs": np.broadcast_to(row, (N, E)).copy()}  # (N, E)


# ---------------------------------------------------------------------------- z-loss
def z_loss_forward(logits):
    """Router z-loss (ST-MoE): L_z = mean_n logsumexp(s_n)^2; keeps logits small.

    Inputs: logits (N, E).  Returns: 0-d array of logits' dtype.  Cache: (logits, lse).
    """
    expect_float("z_loss", "logits", logits)
    expect_shape("z_loss", "logits", logits, (None, None), "(N, E)")
    lse = logsumexp(logits, axis=-1)  # (N,)
    return np.asarray(np.mean(lse * lse), dtype=logits.dtype), (logits, lse)


def z_loss_backward(dloss, cache):
    """Math: dL_z/ds_nj = (2/N) lse_n softmax(s_n)_j, with softmax = exp(s - lse).
    Reference: REFERENCE.md §4 (z-loss)."""
    logits, lse = cache
    N = logits.shape[0]
    p = np.exp(logits - lse[:, None])  # (N, E)
    scale = np.asarray(dloss, dtype=logits.dtype) * (2 / N) * lse  # (N,)
    return {"logits": (scale[:, None] * p).astype(logits.dtype)}  # (N, E)


# ---------------------------------------------------------------------------- bias update
def update_selection_bias(bias, tokens_per_expert, gamma):
    """Aux-loss-free balancing: b_i + gamma * sign(mean load - load_i); a new array.

    Underloaded experts get a higher bias, so they are chosen more often next step. The bias
    enters only the top-k choice (router_forward), never the gates, and has no gradient.
    Inputs: bias (E,), tokens_per_expert (E,) routed slot counts, gamma > 0 (~1e-3).
    """
    expect_shape("update_selection_bias", "tokens_per_expert", tokens_per_expert,
                 np.shape(bias), "(E,), like bias")
    load = np.asarray(tokens_per_expert, dtype=np.float64)  # (E,)
    return (bias + gamma * np.sign(load.mean() - load)).astype(bias.dtype)  # (E,)
