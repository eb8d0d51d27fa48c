"""The MoE router as a forward/backward pair: scores, top-k choice with an optional
selection-only bias (and DeepSeek-V3's group limit), and the gates over the chosen k.

Papers: Switch Transformer (arXiv 2101.03961), Mixtral (HF `MixtralSparseMoeBlock`),
ST-MoE z-loss (arXiv 2202.08906), DeepSeek-V3 (arXiv 2412.19437), aux-loss-free balancing
(Wang et al., arXiv 2408.15664).

Math (one row n of the BT token rows):
    s = x @ W_r (+ b_r)               router logits; b_r a trained logit bias (gpt-oss)  (E,)
    q = softmax(s)  or  sigmoid(s)    scores                                  (E,)
    K = top-k of (q + b)              b: selection bias, selects only, no gradient
    g = r q_K / sum(q_K)              gates over the chosen k; for softmax this IS softmax(s_K),
                                      gpt-oss's softmax after top-k on the logits; without
                                      norm_topk_prob g = r q_K; r = routed_scaling_factor
    p = q / sum(q)                    router probabilities (= q for softmax; DeepSeek's
                                      normalised sigmoid for the balance loss otherwise)
Both normalisations are the same map u -> u / sum(u), so one pair (normalise) serves both.
Group-limited routing (DeepSeek-V3, n_group > 1): the E experts form n_group groups of E/n_group
in order; a group scores the sum of its top-2 values of q + b (group_top = 2; DeepSeek-V2's
group_limited_greedy: its top-1, the max, group_top = 1); K is the top-k of q + b inside the
topk_group best groups. Like the bias, the group limit only selects.
The options (score, top_k, the group limit, norm_topk_prob, r, a logit bias or none) are one
RouterSpec (scratchllm.specs), validated where it is made.

Glossary: BT tokens (rows), D model width, E experts, K top-k (k in code), n_group groups.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import ops
from scratchllm.core.fp8 import full_precision
from scratchllm.core.validate import (expect_dout, expect_douts, expect_float,
                                      expect_instance, expect_shape)
from scratchllm.specs import RouterSpec


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


# ---------------------------------------------------------------------------- selection
def _group_limit(sel, n_group, topk_group, group_top=2):
    """sel with the experts outside each row's topk_group best groups set to -inf (a group
    scores the sum of its top group_top values), and the group scores (BT, n_group)."""
    BT, E = sel.shape
    grouped = sel.reshape(BT, n_group, E // n_group)  # (BT, n_group, E/n_group)
    n = group_top
    group_scores = -np.partition(-grouped, n - 1, axis=-1)[..., :n].sum(axis=-1)  # (BT, n_group)
    best = np.argpartition(-group_scores, topk_group - 1, axis=-1)[:, :topk_group]  # (BT, tg)
    keep = np.zeros((BT, n_group), bool)  # (BT, n_group)
    np.put_along_axis(keep, best, True, axis=-1)
    limited = np.where(np.repeat(keep, E // n_group, axis=1), sel, -np.inf)  # (BT, E)
    return limited, group_scores


def select_topk(sel, k, n_group=1, topk_group=1, group_top=2):
    """The k experts of each row by descending selection value sel (scores + bias), inside
    the topk_group best of n_group groups when n_group > 1 (DeepSeek-V3: a group scores the
    sum of its top group_top values; DeepSeek-V2: its max, group_top = 1).

    Inputs: sel (BT, E).  Returns: topk_idx (BT, K) ints, distinct per row.
    """
    if n_group > 1:
        sel = _group_limit(sel, n_group, topk_group, group_top)[0]  # (BT, E), -inf outside
    top = np.argpartition(-sel, k - 1, axis=-1)[:, :k]  # (BT, K) unordered
    order = np.argsort(-np.take_along_axis(sel, top, axis=-1), axis=-1, kind="stable")
    return np.take_along_axis(top, order, axis=-1)  # (BT, K)


def selection_margin(sel, k, n_group=1, topk_group=1, group_top=2):
    """Per row, how far select_topk's choice is from a tie: the smaller of the top-k gap
    inside the chosen groups and (n_group > 1) the gap between the topk_group-th and the next
    group score. Inputs: sel (BT, E).  Returns: (BT,)."""
    if n_group == 1:
        return topk_margin(sel, k)  # (BT,)
    limited, group_scores = _group_limit(sel, n_group, topk_group, group_top)
    return np.minimum(topk_margin(limited, k), topk_margin(group_scores, topk_group))  # (BT,)


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
    gates: NormaliseCache  # None without norm_topk_prob
    probs: NormaliseCache
    scaling: float  # routed_scaling_factor r
    w: np.ndarray  # sigmoid: the rescaled scores both normalisations see; None for softmax


def router_forward(x, w_router, b_router=None, *, spec, selection_bias=None):
    """Top-k router.

    Inputs:  x (BT, D), w_router (D, E), b_router (E,): a trained logit bias (gpt-oss), given
             exactly when spec.bias; spec: RouterSpec (E = n_experts, K = top_k, score
             "softmax" | "sigmoid", the group limit n_group / topk_group, norm_topk_prob: gates
             renormalised over the chosen k (else the chosen scores), routed_scaling_factor r:
             the gates' multiplier); selection_bias (E,) or None: added to the scores for the
             top-k choice only.
    Returns: RouterOut(gates (BT, K), topk_idx (BT, K) int, probs (BT, E), logits (BT, E));
             the k chosen experts of a row are in descending order of score + bias.
    Cache:   the logits' linear cache, the scores, topk_idx, the two normalise caches, r.
    """
    E = _check_router(x, w_router, b_router, spec)
    with full_precision():  # the gating stays out of FP8 training (DeepSeek-V3 sec. 3.3.1)
        logits, lin = ops.linear_forward(x, w_router, b_router)  # (BT, E)
    score_forward = ops.softmax_forward if spec.score == "softmax" else ops.sigmoid_forward
    scores, s_cache = score_forward(logits)  # (BT, E)
    w = None if spec.score == "softmax" else _rescaled_sigmoid(logits)  # (BT, E)
    norm_in = scores if w is None else w  # (BT, E) what gates and probs normalise
    sel = scores
    if selection_bias is not None:
        expect_shape("router", "selection_bias", selection_bias, (E,), "(E,)")
        sel = scores + selection_bias  # (BT, E)
    topk_idx = select_topk(sel, spec.top_k, spec.n_group, spec.topk_group,
                           spec.group_top)  # (BT, K)
    g_cache = None
    if spec.norm_topk_prob:  # normalised: of w for sigmoid (the same ratios as of q)
        gates, g_cache = normalise_forward(np.take_along_axis(norm_in, topk_idx, axis=-1))
    else:  # the chosen scores q_K themselves
        gates = np.take_along_axis(scores, topk_idx, axis=-1)  # (BT, K)
    r = spec.routed_scaling_factor
    gates = gates * r  # (BT, K)
    probs, p_cache = normalise_forward(norm_in)  # (BT, E)
    cache = RouterCache(lin, s_cache, topk_idx, g_cache, p_cache, r, w)
    return RouterOut(gates, topk_idx, probs, logits), cache


def _check_router(x, w_router, b_router, spec):
    """Raise unless x is (BT, D) float, w_router (D, spec.n_experts) and b_router (E,) is
    given exactly when spec.bias; return E."""
    expect_instance("router", "spec", spec, RouterSpec)
    expect_float("router", "x", x)
    expect_shape("router", "x", x, (None, None), "(BT, D)")
    E = spec.n_experts
    expect_shape("router", "w_router", w_router, (x.shape[1], E),
                 f"(D, E), D = x.shape[1], E = spec.n_experts = {E}")
    if spec.bias != (b_router is not None):
        raise ValueError(f"router: b_router must be given exactly when spec.bias is True, got "
                         f"spec.bias={spec.bias} and b_router "
                         f"{'None' if b_router is None else 'given'}")
    if b_router is not None:
        expect_shape("router", "b_router", b_router, (E,), "(E,)")
    return E


def _rescaled_sigmoid(logits):
    """w = sigmoid(s) / sigmoid(max_j s_j) per row, as exp(log sigmoid(s) - its row max):
    in (0, 1] with a 1 in every row, so normalising w gives exactly the normalised sigmoid
    scores (the ratio is scale-free) without 0/0 when every score underflows (s << 0)."""
    log_q = -np.logaddexp(np.asarray(0, logits.dtype), -logits)  # (BT, E) log sigmoid(s)
    return np.exp(log_q - log_q.max(axis=-1, keepdims=True))  # (BT, E)


def router_backward(dout, cache):
    """Router gradients. dout = (dgates, None, dprobs, dlogits); dprobs, dlogits may be None.

    Math: the gates see the logits only through the chosen scores q_K, so with u = r dg
        dq_K = (u - sum(u * g/r)) / sum(q_K)  (normalise backward; dq_K = u without it), 0 off K
        softmax: ds = q (dq - sum(dq q)); for the gates alone ds_j = g_j (dg_j - sum g dg), j in K
        sigmoid: both normalise w = q / q_max instead of q (the same ratios, no underflow);
                 normalising is scale-free, so the gradient through q_max vanishes and
                 ds = dw w (1 - q)    (d log sigmoid(s) / ds = 1 - q); the raw q_K of
                 norm_topk_prob=False: ds = dq q (1 - q)
        s = x W_r + b_r:  dx = ds W_r^T, dW_r = x^T ds, db_r = sum over rows of ds
    The selection bias and the group limit only chose K: K is piecewise constant in the
    inputs, so away from ties they get no gradient (and the bias has no entry).
    Reference: Mixtral (arXiv 2401.04088) §2.1, huggingface/transformers
    src/transformers/models/mixtral/modeling_mixtral.py MixtralSparseMoeBlock; DeepSeek-V3
    (arXiv 2412.19437) §2.1.2 (sigmoid scores, normalised over the chosen k);
    huggingface/transformers src/transformers/models/deepseek_v3/modeling_deepseek_v3.py
    DeepseekV3TopkRouter (groups, scaling); huggingface/transformers
    src/transformers/models/gpt_oss/modeling_gpt_oss.py GptOssTopKRouter (logit bias).
    """
    lin, s_cache, topk_idx, g_cache, p_cache, scaling, w = cache
    expect_douts("router_backward", dout, {
        "gates": (topk_idx.shape, p_cache.v.dtype), "topk_idx": None,
        "probs": (p_cache.v.shape, p_cache.v.dtype), "logits": ops.linear_out(lin)})
    dgates, _, dprobs, dlogits = dout
    d_in = np.zeros_like(p_cache.v)  # (BT, E) d of what the normalisations see (q, or w)
    d_raw = None  # (BT, E) d of the raw chosen scores q_K (norm_topk_prob=False)
    if dgates is not None:  # fwd: g = r normalise(q_K)  (or r q_K)
        dq_k = dgates * scaling  # (BT, K)
        if g_cache is not None:
            np.put_along_axis(d_in, topk_idx, normalise_backward(dq_k, g_cache)["u"], axis=-1)
        else:
            d_raw = np.zeros_like(d_in)  # (BT, E)
            np.put_along_axis(d_raw, topk_idx, dq_k, axis=-1)  # top-k indices are distinct
    if dprobs is not None:  # fwd: p = normalise(q or w)
        d_in += normalise_backward(dprobs, p_cache)["u"]
    if w is None:  # fwd: q = softmax(s), and both paths read q
        ds = ops.softmax_backward(d_in if d_raw is None else d_in + d_raw, s_cache)["x"]
    else:  # fwd: w = exp(log sigmoid(s) - max), normalised; raw q = sigmoid(s)
        ds = d_in * w * (1 - s_cache.y)  # (BT, E)
        if d_raw is not None:
            ds = ds + ops.sigmoid_backward(d_raw, s_cache)["x"]  # (BT, E)
    if dlogits is not None:
        ds = ds + dlogits  # (BT, E)
    g = ops.linear_backward(ds, lin)  # fwd: s = x @ W_r (+ b_r)
    grads = {"x": g["x"], "w_router": g["W"]}
    if "b" in g:
        grads["b_router"] = g["b"]
    return grads
