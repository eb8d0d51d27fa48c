"""Retention with a scalar decay per head (Sun et al. 2023, "Retentive Network: A Successor to
Transformer for Large Language Models", arXiv 2307.08621, equations 1-8).

Recurrent:  S_t = γ S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t          (γ in (0, 1), per head)
Parallel:   o = (q k^T ⊙ M) v with M_ts = γ^(t−s) for s ≤ t, else 0
Chunked:    the parallel form in each chunk plus γ-decayed states between chunks.
This is gated linear attention (gla.py) with the constant per-head log gate g_t = log γ. The
paper's scaling of q, its xPos rotation and its GroupNorm live outside the retention core.
Default decays: γ_h = 1 − 2^(−5−h), h = 0 .. H−1 (the paper's multi-scale choice).

Glossary: B batch, H heads, T time, Dk key head dim, Dv value head dim, γ (H,) the decays.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import expect_dout, expect_float, expect_shape
from scratchllm.linear_attention.gla import (GLACache, check_head_step, check_qkv,
                                             gla_attention_recurrent_ref,
                                             gla_attention_step, gla_backward_parts,
                                             gla_forward_parts, gla_out)


def retnet_gammas(n_heads, dtype=np.float64):
    """The paper's decays γ_h = 1 − 2^(−5−h): (H,)."""
    return (1 - 2.0 ** (-5 - np.arange(n_heads))).astype(dtype)  # (H,)


def _log_gates(fn, q, gamma):
    """log γ broadcast to one gate per (batch, head, time): (B, H, T)."""
    expect_float(fn, "gamma", gamma)
    expect_shape(fn, "gamma", gamma, (q.shape[1],), "(H,): one decay per head")
    if not np.all((gamma > 0) & (gamma <= 1)):
        raise ValueError(f"{fn}: gamma must lie in (0, 1], got {gamma}")
    return np.broadcast_to(np.log(gamma)[None, :, None], q.shape[:3])  # (B, H, T)


class RetNetCache(NamedTuple):
    gamma: np.ndarray
    gla: GLACache


def retnet_attention_forward(q, k, v, gamma, *, form="chunked", chunk=64):
    """Retention o_t = Σ_{s≤t} γ^(t−s) (q_t·k_s) v_s, in the parallel, chunked or recurrent form.

    Inputs:  q, k (B, H, T, Dk); v (B, H, T, Dv); gamma (H,) in (0, 1].
    Returns: o (B, H, T, Dv).  Cache: γ and the GLA cache.
    """
    fn = "retnet_attention"
    check_qkv(fn, q, k, v)
    o, gla = gla_forward_parts(fn, q, k, v, _log_gates(fn, q, gamma), form, chunk)
    return o, RetNetCache(gamma, gla)


def retnet_attention_backward(do, cache):
    """Math: the GLA backward with g = log γ broadcast; the broadcast's adjoint is a sum over
    batch and time, and dγ = Σ_{b,t} dg / γ.
    Reference: Sun et al. 2023, arXiv 2307.08621 (the backward derived here).
    """
    expect_dout("retnet_attention_backward", do, *gla_out(cache.gla), name="do")
    dq, dk, dv, dg = gla_backward_parts(do, cache.gla)
    # fwd: g = broadcast(log gamma)  ->  dgamma = sum_{b,t} dg / gamma
    return {"q": dq, "k": dk, "v": dv, "gamma": dg.sum(axis=(0, 2)) / cache.gamma}


def retnet_attention_step(q_t, k_t, v_t, gamma, state):
    """One decoding step, S = γ S + k_t v_t^T. q_t, k_t (B, H, Dk); v_t (B, H, Dv); state
    (B, H, Dk, Dv) or None. Returns (o_t (B, H, Dv), state)."""
    check_head_step("retnet_attention_step", q_t, k_t, v_t, state)
    expect_shape("retnet_attention_step", "gamma", np.asarray(gamma), q_t.shape[1:2], "(H,)")
    g_t = np.broadcast_to(np.log(gamma), q_t.shape[:2])  # (B, H)
    return gla_attention_step(q_t, k_t, v_t, g_t, state)


def retnet_attention_recurrent(q, k, v, gamma):
    """The recurrent form, T calls of retnet_attention_step. Returns (o, final state)."""
    check_qkv("retnet_attention_recurrent", q, k, v)
    _log_gates("retnet_attention_recurrent", q, gamma)
    state, outs = None, []
    for t in range(q.shape[2]):
        o_t, state = retnet_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], gamma, state)
        outs.append(o_t)
    return np.stack(outs, axis=2), state  # (B, H, T, Dv)


def retnet_attention_recurrent_ref(q, k, v, gamma):
    """The plain loop (gla_attention_recurrent_ref with α = γ)."""
    return gla_attention_recurrent_ref(q, k, v, _log_gates("retnet_attention", q, gamma))
