"""The MoE router as a forward/backward pair: scores, top-k choice with an optional
selection-only bias, and the gates renormalised over the chosen k.

Papers: Switch Transformer (arXiv 2101.03961), Mixtral (HF `MixtralSparseMoeBlock`),
ST-MoE z-loss (arXiv 2202.08906), DeepSeek-V3 (arXiv 2412.19437), aux-loss-free balancing
(Wang et al., arXiv 2408.15664).

Math (one row n of the BT token rows):
    s = x @ W_r                       router logits                           (E,)
    q = softmax(s)  or  sigmoid(s)    scores                                  (E,)
    K = top-k of (q + b)              b: selection bias, selects only, no gradient
    g = q_K / sum(q_K)                gates over the chosen k; for softmax this IS softmax(s_K)
    p = q / sum(q)                    router probabilities (= q for softmax; DeepSeek's
                                      normalised sigmoid for the balance loss otherwise)
Both normalisations are the same map u -> u / sum(u), so one pair (normalise) serves both.

Glossary: BT tokens (rows), D model width, E experts, K top-k (k in code).
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import ops
from scratchllm.core.validate import expect_dout, expect_douts, expect_float, expect_shape

SCORES = ("softmax", "sigmoid")


def check_k(fn, k, E):
    """Raise ValueError unless 1 <= k <= E (k is the number of experts a token uses)."""
    if not (isinstance(k, (int, np.integer)) and 1 <= k <= E):
        raise ValueError(f"{fn}: k must be an integer in [1, E={E}], got {k!r}")


def topk_margin(values, k):
    """Per row, the gap between the k-th and (k+1)-th largest value: how far the top-k choice
    is from a tie (inf when k equals the row length). Gradient checks draw routing inputs with
    a margin far above the finite-difference step.

    Inputs: values (BT, E), 1 <= k <= E.  Returns: (BT,).
    """
    if k == values.shape[-1]:
        return np.full(values.shape[0], np.inf)  # (BT,)
    part = -np.partition(-values, (k - 1, k), axis=-1)  # (BT, E) k-th and (k+1)-th in place
    return part[:, k - 1] - part[:, k]  # (BT,)


# ---------------------------------------------------------------------------- normalise
class NormaliseCache(NamedTuple):
    v: np.ndarray
    total: np.ndarray


def normalise_forward(u):
    """v = u / sum(u) over the last axis (u > 0).

    Inputs: u (..., M).  Returns: v (..., M).  Cache: (v, sum).
    """
    expect_float("normalise", "u", u)
    total = u.sum(axis=-1, keepdims=True)  # (..., 1)
    v = u / total  # (..., M)
    return v, NormaliseCache(v, total)


def normalise_backward(dv, cache):
    """Math: dv_i/du_j = (delta_ij - v_i) / sum  ->  du = (dv - sum(dv * v)) / sum."""
    v, total = cache
    expect_dout("normalise_backward", dv, v.shape, v.dtype, name="dv")
    return {"u": (dv - np.sum(dv * v, axis=-1, keepdims=True)) / total}  # (..., M)


# ---------------------------------------------------------------------------- router
class RouterOut(NamedTuple):
    """The outputs of router_forward (and the shape of its backward's dout; topk_idx takes
    None, and so may any output that receives no gradient)."""
    gates: np.ndarray  # (BT, K)
    topk_idx: np.ndarray  # (BT, K) ints
    probs: np.ndarray  # (BT, E)
    logits: np.ndarray  # (BT, E)


class RouterCache(NamedTuple):
    linear: ops.LinearCache
    score_cache: tuple  # ops.SoftmaxCache or ops.SigmoidCache
    topk_idx: np.ndarray
    gates: NormaliseCache
    probs: NormaliseCache
    w: np.ndarray  # sigmoid: the rescaled scores both normalisations see; None for softmax


def router_forward(x, w_router, *, k, score="softmax", selection_bias=None):
    """Top-k router.

    Inputs:  x (BT, D), w_router (D, E), k in [1, E], score "softmax" | "sigmoid",
             selection_bias (E,) or None: added to the scores for the top-k choice only.
    Returns: (gates (BT, K), topk_idx (BT, K) int, probs (BT, E), logits (BT, E)); the k chosen
             experts of a row are in descending order of score + bias.
    Cache:   the logits' linear cache, the scores, topk_idx and the two normalise caches.
    """
    expect_float("router", "x", x)
    expect_shape("router", "x", x, (None, None), "(BT, D)")
    expect_shape("router", "w_router", w_router, (x.shape[1], None), "(D, E), D = x.shape[1]")
    E = w_router.shape[1]
    check_k("router", k, E)
    if score not in SCORES:
        raise ValueError(f"router: score must be one of {SCORES}, got {score!r}")
    logits, lin = ops.linear_forward(x, w_router)  # (BT, E)
    score_forward = ops.softmax_forward if score == "softmax" else ops.sigmoid_forward
    scores, s_cache = score_forward(logits)  # (BT, E)
    w = None if score == "softmax" else _rescaled_sigmoid(logits)  # (BT, E)
    norm_in = scores if w is None else w  # (BT, E) what gates and probs normalise
    sel = scores
    if selection_bias is not None:
        expect_shape("router", "selection_bias", selection_bias, (E,), "(E,)")
        sel = scores + selection_bias  # (BT, E)
    top = np.argpartition(-sel, k - 1, axis=-1)[:, :k]  # (BT, K) unordered
    order = np.argsort(-np.take_along_axis(sel, top, axis=-1), axis=-1, kind="stable")
    topk_idx = np.take_along_axis(top, order, axis=-1)  # (BT, K)
    gates, g_cache = normalise_forward(np.take_along_axis(norm_in, topk_idx, axis=-1))  # (BT, K)
    probs, p_cache = normalise_forward(norm_in)  # (BT, E)
    cache = RouterCache(lin, s_cache, topk_idx, g_cache, p_cache, w)
    return RouterOut(gates, topk_idx, probs, logits), cache


def _rescaled_sigmoid(logits):
    """w = sigmoid(s) / sigmoid(max_j s_j) per row, as exp(log sigmoid(s) - its row max):
    in (0, 1] with a 1 in every row, so normalising w gives exactly the normalised sigmoid
    scores (the ratio is scale-free) without 0/0 when every score underflows (s << 0)."""
    log_q = -np.logaddexp(np.asarray(0, logits.dtype), -logits)  # (BT, E) log sigmoid(s)
    return np.exp(log_q - log_q.max(axis=-1, keepdims=True))  # (BT, E)


def router_backward(dout, cache):
    """Router gradients. dout = (dgates, None, dprobs, dlogits); dprobs, dlogits may be None.

    Math: the gates see the logits only through the chosen scores q_K, so
        dq_K = (dg - sum(dg * g)) / sum(q_K)             (normalise backward), 0 off K
        softmax: ds = q (dq - sum(dq q)); for the gates alone ds_j = g_j (dg_j - sum g dg), j in K
        sigmoid: both normalise w = q / q_max instead of q (the same ratios, no underflow);
                 normalising is scale-free, so the gradient through q_max vanishes and
                 ds = dw w (1 - q)    (d log sigmoid(s) / ds = 1 - q)
    The selection bias only chose K: it gets no gradient (and has no entry).
    Reference: Mixtral (arXiv 2401.04088) §2.1, huggingface/transformers
    src/transformers/models/mixtral/modeling_mixtral.py MixtralSparseMoeBlock; DeepSeek-V3
    (arXiv 2412.19437) §2.1.2 (sigmoid scores, normalised over the chosen k).
    """
    lin, s_cache, topk_idx, g_cache, p_cache, w = cache
    expect_douts("router_backward", dout, {
        "gates": (g_cache.v.shape, g_cache.v.dtype), "topk_idx": None,
        "probs": (p_cache.v.shape, p_cache.v.dtype), "logits": ops.linear_out(lin)})
    dgates, _, dprobs, dlogits = dout
    dscores = np.zeros_like(p_cache.v)  # (BT, E)
    if dgates is not None:  # fwd: g = normalise(q_K)
        dq_k = normalise_backward(dgates, g_cache)["u"]  # (BT, K)
        np.put_along_axis(dscores, topk_idx, dq_k, axis=-1)  # top-k indices are distinct
    if dprobs is not None:  # fwd: p = normalise(q)
        dscores += normalise_backward(dprobs, p_cache)["u"]
    if w is None:  # fwd: q = softmax(s)
        ds = ops.softmax_backward(dscores, s_cache)["x"]  # (BT, E)
    else:  # fwd: w = exp(log sigmoid(s) - max), normalised
        ds = dscores * w * (1 - s_cache.y)  # (BT, E)
    if dlogits is not None:
        ds = ds + dlogits  # (BT, E)
    g = ops.linear_backward(ds, lin)  # fwd: s = x @ W_r
    return {"x": g["x"], "w_router": g["W"]}
