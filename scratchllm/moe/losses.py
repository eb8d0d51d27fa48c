"""The MoE auxiliary losses as forward/backward pairs: the Switch balance loss, DeepSeek-V3's
sequence-wise balance loss, the ST-MoE router z-loss, and the aux-loss-free selection-bias
update (DeepSeek-V3), which has no gradient.

Papers: Switch Transformer (arXiv 2101.03961) §2.2, ST-MoE (arXiv 2202.08906) §3.5,
DeepSeek-V3 (arXiv 2412.19437) §2.1.2, aux-loss-free balancing (Wang et al., arXiv 2408.15664).

Glossary: BT tokens (rows), B sequences of T tokens, E experts, K top-k (k in code).
"""
from typing import NamedTuple

import numpy as np
from scipy.special import logsumexp

from scratchllm.core.validate import (expect_dout, expect_finite, expect_float, expect_int,
                                      expect_shape)


class BalanceLossCache(NamedTuple):
    f: np.ndarray  # (E,) routed share per expert, a constant
    BT: int


class ZLossCache(NamedTuple):
    logits: np.ndarray
    lse: np.ndarray


# ---------------------------------------------------------------------------- balance loss
def check_balance_inputs(fn, probs, topk_idx):
    """ValueError/TypeError under the caller's name fn unless probs is (BT, E) floats and
    topk_idx (BT, K) integers in [0, E)."""
    expect_float(fn, "probs", probs)
    expect_int(fn, "topk_idx", topk_idx)
    expect_shape(fn, "probs", probs, (None, None), "(BT, E)")
    expect_shape(fn, "topk_idx", topk_idx, (probs.shape[0], None), "(BT, K)")
    E = probs.shape[1]
    if topk_idx.size and (topk_idx.min() < 0 or topk_idx.max() >= E):
        raise ValueError(f"{fn}: topk_idx must lie in [0, E) = [0, {E}) (probs has E "
                         f"columns), got values in [{topk_idx.min()}, {topk_idx.max()}]")


def balance_loss_forward(probs, topk_idx):
    """Switch balance loss L = E * sum_i f_i P_i, equal to 1 at perfect balance.

    f_i = (slots routed to expert i) / (BT k), counted before capacity, a constant (no gradient);
    P_i = mean_n p_ni. With f_i = P_i = 1/E, L = E * E / E^2 = 1; skew makes L > 1.

    Derivation (the interview question), p_n = softmax(s_n):
        dL/dp_ni = E f_i / BT                       (f held constant)
        dp_ni/ds_nj = p_ni (delta_ij - p_nj)       (softmax Jacobian)
        dL/ds_nj = sum_i E f_i / BT * p_ni (delta_ij - p_nj)
                 = (E/BT) p_nj (f_j - sum_i f_i p_ni)
    Each row's gradient sums to zero (softmax is shift invariant); it lowers the logit of an
    expert whose load f_j is above the probability-weighted average load, which is what
    undoes router collapse. This pair returns dL/dp; router_backward applies the Jacobian.

    HF Mixtral's `load_balancing_loss_func` uses f_i = (1/BT) #{n : i in topk(n)}, so sum f = k
    and the loss equals k at balance (2.0 for top-2); ours divides by BT k and equals 1.
    The two differ by the constant factor k only, so the coefficient absorbs it.

    Inputs:  probs (BT, E), topk_idx (BT, K) integers in [0, E).
    Returns: loss, 0-d array of probs' dtype.  Cache: (f, BT).
    """
    check_balance_inputs("balance_loss", probs, topk_idx)
    BT, E = probs.shape
    slots = np.bincount(topk_idx.ravel(), minlength=E)  # (E,)
    f = (slots / max(topk_idx.size, 1)).astype(probs.dtype)  # (E,); no tokens: 0
    P = probs.sum(axis=0) / max(BT, 1)  # (E,) the mean; no tokens: 0, the empty sum's limit
    return np.asarray(E * np.dot(f, P), dtype=probs.dtype), BalanceLossCache(f, BT)


def balance_loss_backward(dloss, cache):
    """Math: dL/dp_ni = E f_i / BT (then the softmax Jacobian in router_backward gives
    (E/BT) p_nj (f_j - sum_i f_i p_ni)).  Reference: Switch Transformer (arXiv 2101.03961)
    eq. (4), derived step by step in balance_loss_forward's docstring."""
    f, BT = cache
    expect_dout("balance_loss_backward", dloss, (), f.dtype, name="dloss")
    E = f.shape[0]
    row = np.asarray(dloss, dtype=f.dtype) * (E / max(BT, 1)) * f  # (E,)
    return {"probs": np.broadcast_to(row, (BT, E)).copy()}  # (BT, E)


# ---------------------------------------------------------------------------- z-loss
def z_loss_forward(logits):
    """Router z-loss (ST-MoE): L_z = mean_n logsumexp(s_n)^2; keeps logits small.

    Inputs: logits (BT, E).  Returns: 0-d array of logits' dtype (0 for BT = 0 tokens, the
    empty sum's limit, with a zero gradient).  Cache: (logits, lse).
    """
    expect_float("z_loss", "logits", logits)
    expect_shape("z_loss", "logits", logits, (None, None), "(BT, E)")
    lse = logsumexp(logits, axis=-1)  # (BT,)
    loss = np.dot(lse, lse) / max(len(lse), 1)  # the mean over tokens
    return np.asarray(loss, dtype=logits.dtype), ZLossCache(logits, lse)


def z_loss_backward(dloss, cache):
    """Math: dL_z/ds_nj = (2/BT) lse_n softmax(s_n)_j, with softmax = exp(s - lse).
    Reference: ST-MoE (arXiv 2202.08906) eq. (5)."""
    logits, lse = cache
    expect_dout("z_loss_backward", dloss, (), logits.dtype, name="dloss")
    BT = logits.shape[0]
    p = np.exp(logits - lse[:, None])  # (BT, E)
    scale = np.asarray(dloss, dtype=logits.dtype) * (2 / max(BT, 1)) * lse  # (BT,)
    return {"logits": (scale[:, None] * p).astype(logits.dtype)}  # (BT, E)


# ---------------------------------------------------------------------------- bias update
def update_selection_bias(bias, tokens_per_expert, gamma):
    """Aux-loss-free balancing: b_i + gamma * sign(mean load - load_i); a new array.

    Underloaded experts get a higher bias, so they are chosen more often next step. The bias
    enters only the top-k choice (router_forward), never the gates, and has no gradient.
    Inputs: bias (E,), tokens_per_expert (E,) routed slot counts, gamma >= 0 (~1e-3).
    """
    expect_shape("update_selection_bias", "tokens_per_expert", tokens_per_expert,
                 np.shape(bias), "(E,), like bias")
    gamma = expect_finite("update_selection_bias", "gamma", gamma, 0)
    load = np.asarray(tokens_per_expert, dtype=np.float64)  # (E,)
    return (bias + gamma * np.sign(load.mean() - load)).astype(bias.dtype)  # (E,)


# ---------------------------------------------------------------------------- per sequence
class SequenceBalanceCache(NamedTuple):
    f: np.ndarray  # (B, E) per-sequence load, a constant
    s_norm: np.ndarray  # (B, T, E) affinities normalised over the experts
    s_sum: np.ndarray  # (B, T, 1) their sums


def sequence_balance_loss_forward(scores, topk_idx):
    """DeepSeek-V3's sequence-wise balance loss: balance inside every sequence, not only over
    the batch (a batch can be balanced while each sequence sends all its tokens to a few
    experts). Per sequence b of T tokens (DeepSeek-V3, arXiv 2412.19437, eqs. 17-20):
        s'_ti = s_ti / sum_j s_tj                         affinities normalised per token
        f_i = E / (K T) * #{t : i in topk(t)}             load, a constant (no gradient)
        P_i = (1/T) sum_t s'_ti
        L_b = sum_i f_i P_i                               1 at perfect balance (f = 1, P = 1/E)
    and the loss is the mean of L_b over the batch (the coefficient alpha is the caller's).
    With softmax scores s' = s; with DeepSeek-V3's sigmoid scores the normalisation matters.

    Inputs:  scores (B, T, E) positive affinities (softmax probabilities or sigmoid scores);
             topk_idx (B, T, K) integers in [0, E).
    Returns: loss, 0-d array of scores' dtype.  Cache: (f, s', sum s).
    """
    fn = "sequence_balance_loss"
    expect_float(fn, "scores", scores)
    expect_shape(fn, "scores", scores, (None, None, None), "(B, T, E)")
    expect_int(fn, "topk_idx", topk_idx)
    B, T, E = scores.shape
    expect_shape(fn, "topk_idx", topk_idx, (B, T, None), "(B, T, K)")
    if topk_idx.size and (topk_idx.min() < 0 or topk_idx.max() >= E):
        raise ValueError(f"{fn}: topk_idx must lie in [0, E) = [0, {E}), got values in "
                         f"[{topk_idx.min()}, {topk_idx.max()}]")
    K = topk_idx.shape[2]
    counts = np.zeros((B, E))  # (B, E) routed slots per sequence
    np.add.at(counts, (np.repeat(np.arange(B), T * K), topk_idx.ravel()), 1)
    f = (counts * E / max(K * T, 1)).astype(scores.dtype)  # (B, E)
    s_sum = scores.sum(axis=-1, keepdims=True)  # (B, T, 1)
    s_norm = scores / s_sum  # (B, T, E)
    P = s_norm.sum(axis=1) / max(T, 1)  # (B, E) the mean over tokens; none: 0
    loss = np.asarray(np.sum(f * P) / max(B, 1), dtype=scores.dtype)
    return loss, SequenceBalanceCache(f, s_norm, s_sum)


def sequence_balance_loss_backward(dloss, cache):
    """Math: L = (1/B) sum_b sum_i f_bi (1/T) sum_t s'_bti, f constant, s' = s / sum_j s_j:
        dL/ds'_bti = f_bi / (B T)  =: g_bti
        dL/ds_btj = (g_btj - sum_i g_bti s'_bti) / sum_i s_bti   (the normalisation's Jacobian)
    With softmax scores (sum = 1) the second term is what makes each row's gradient orthogonal
    to s'. Reference: DeepSeek-V3 (arXiv 2412.19437) §2.1.2 eqs. (17)-(20).
    Returns {scores}."""
    f, s_norm, s_sum = cache
    expect_dout("sequence_balance_loss_backward", dloss, (), s_norm.dtype, name="dloss")
    B, T, E = s_norm.shape
    g = np.asarray(dloss, s_norm.dtype) * f[:, None, :] / max(B * T, 1)  # (B, 1, E) dL/ds'
    # fwd: s' = s / sum_j s_j
    ds = (g - np.sum(g * s_norm, axis=-1, keepdims=True)) / s_sum  # (B, T, E)
    return {"scores": ds.astype(s_norm.dtype)}
