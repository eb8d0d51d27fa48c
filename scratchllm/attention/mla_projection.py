"""MLA's shared projections (DeepSeek-V2, arXiv 2405.04434 §2.1; DeepSeek-V3
`inference/model.py` class MLA): what the training form and the absorbed decoding form both
compute from x, as one forward/backward pair.

    q            = x @ wq                    or  wq_b(rmsnorm(x @ wq_a, q_norm))  # (H, dn+dr)
    q_nope, q_pe = split(q, [dn, dr]);   q_pe = rope(q_pe)                 (per head)
    c_kv, k_pe   = split(x @ wkv_a, [Dc, dr]);   k_pe = rope(k_pe)         (ONE key, all heads)
    ckv          = rmsnorm(c_kv, kv_norm)

Glossary: B batch, T time, D model, H heads, dn qk_nope_head_dim, dr qk_rope_head_dim,
dv v_head_dim, Dc kv_lora_rank, Dq q_lora_rank.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.rope import rope_backward, rope_forward, rope_frequencies
from scratchllm.attention.sdpa import merge_heads, split_heads
from scratchllm.core import ops
from scratchllm.core.validate import (expect_douts, expect_float, expect_ndim, expect_positive,
                                      expect_shape)


# ---------------------------------------------------------------------------- shapes
class MLAGeometry(NamedTuple):
    H: int
    dn: int
    dr: int
    dv: int
    Dc: int


def geometry(fn, x, wkv_a, kv_norm, wkv_b, wo, wq, wq_a, q_norm, wq_b, n_heads):
    """Read (H, dn, dr, dv, Dc) off the weights; raise ValueError on any inconsistency."""
    expect_float(fn, "x", x)
    D, H = x.shape[-1], n_heads
    expect_positive(fn, "n_heads", H)
    expect_ndim(fn, "kv_norm", kv_norm, 1, "(Dc,)")
    Dc = kv_norm.shape[0]
    expect_shape(fn, "wkv_a", wkv_a, (D, None), "(D, Dc + dr)")
    dr = wkv_a.shape[1] - Dc
    if dr <= 0 or dr % 2:
        raise ValueError(f"{fn}: wkv_a has {wkv_a.shape[1]} columns and kv_norm {Dc}, so the "
                         f"rope dim dr = {dr}; expected a positive even dr")
    expect_shape(fn, "wo", wo, (None, D), "(H * dv, D)")
    expect_shape(fn, "wkv_b", wkv_b, (Dc, None), "(Dc, H * (dn + dv))")
    dv, dn = wo.shape[0] // H, wkv_b.shape[1] // H - wo.shape[0] // H
    if wo.shape[0] % H or wkv_b.shape[1] % H or dn <= 0 or dv <= 0:
        raise ValueError(f"{fn}: wo {wo.shape} and wkv_b {wkv_b.shape} do not split into "
                         f"n_heads={H} heads of positive dv and dn")
    g = MLAGeometry(H, dn, dr, dv, Dc)
    compressed = [w is not None for w in (wq_a, q_norm, wq_b)]
    if not ((wq is not None and not any(compressed)) or (wq is None and all(compressed))):
        got = [n for n, w in zip(("wq", "wq_a", "q_norm", "wq_b"), (wq, wq_a, q_norm, wq_b))
               if w is not None]
        raise ValueError(f"{fn}: give either wq, or all of wq_a, q_norm and wq_b; got {got}")
    _check_query(fn, D, g, wq, wq_a, q_norm, wq_b)
    return g


def _check_query(fn, D, g, wq, wq_a, q_norm, wq_b):
    """wq (D, H(dn+dr)), or wq_a (D, Dq), q_norm (Dq,), wq_b (Dq, H(dn+dr))."""
    width = g.H * (g.dn + g.dr)
    if wq is not None:
        expect_shape(fn, "wq", wq, (D, width), "(D, H * (dn + dr))")
    else:
        expect_shape(fn, "wq_a", wq_a, (D, None), "(D, Dq)")
        expect_shape(fn, "q_norm", q_norm, (wq_a.shape[1],), "(Dq,)")
        expect_shape(fn, "wq_b", wq_b, (wq_a.shape[1], width), "(Dq, H * (dn + dr))")


def rope_defaults(T, dr, positions, inv_freq, softmax_scale, g):
    """Positions 0..T-1, default RoPE frequencies over dr, scale (dn+dr)^-1/2 unless given."""
    positions = np.arange(T) if positions is None else positions  # (T,)
    inv_freq = rope_frequencies(dr)[0] if inv_freq is None else inv_freq  # (dr/2,)
    scale = (g.dn + g.dr) ** -0.5 if softmax_scale is None else softmax_scale
    return positions, inv_freq, scale


# ---------------------------------------------------------------------------- shared projections
class MLAProjection(NamedTuple):
    """The output of mla_project_forward (and the shape of its backward's dout)."""
    q_nope: np.ndarray  # (B, H, T, dn)
    q_pe: np.ndarray  # (B, H, T, dr), roped
    ckv: np.ndarray  # (B, T, Dc) = kv_norm(c_kv)
    k_pe: np.ndarray  # (B, 1, T, dr), roped, shared by all heads


class MLAProjCache(NamedTuple):
    q: tuple  # (linear wq,) or (linear wq_a, rmsnorm q_norm, linear wq_b)
    q_rope: tuple
    kv: ops.LinearCache
    kv_rms: ops.RMSNormCache
    k_rope: tuple
    g: MLAGeometry


def mla_project_forward(x, wkv_a, kv_norm, wq=None, wq_a=None, q_norm=None, wq_b=None, *,
                        geometry, positions, inv_freq, rope_style, attention_factor, eps):
    """What both forms share: per-head queries, the normalised latent, the one roped key.

    Inputs:  x (B, T, D), the weights (wq, or wq_a, q_norm and wq_b), `geometry` (from
             geometry(), which validates the weights), positions (T,) or (B, T).
    Returns: MLAProjection(q_nope (B, H, T, dn), q_pe (B, H, T, dr) roped,
             ckv = kv_norm(c_kv) (B, T, Dc), k_pe (B, 1, T, dr) roped).  Cache: MLAProjCache.
    """
    g = geometry
    fn = "mla_project"
    expect_float(fn, "x", x)
    expect_ndim(fn, "x", x, 3, "(B, T, D)")
    B, T, D = x.shape
    H, dn, dr, dv, Dc = g
    expect_shape(fn, "wkv_a", wkv_a, (D, Dc + dr), "(D, Dc + dr) of the geometry")
    expect_shape(fn, "kv_norm", kv_norm, (Dc,), "(Dc,)")
    _check_query(fn, D, g, wq, wq_a, q_norm, wq_b)
    if wq is not None:
        q, lin = ops.linear_forward(x, wq)  # (B, T, H*(dn+dr))
        q_caches = (lin,)
    else:
        qa, lin_a = ops.linear_forward(x, wq_a)  # (B, T, Dq)
        qn, rms = ops.rmsnorm_forward(qa, q_norm, eps)  # (B, T, Dq)
        q, lin_b = ops.linear_forward(qn, wq_b)  # (B, T, H*(dn+dr))
        q_caches = (lin_a, rms, lin_b)
    q = split_heads(q, H)  # (B, H, T, dn+dr)
    q_pe, q_rope = rope_forward(q[..., dn:], positions, inv_freq, rope_style,
                                attention_factor)  # (B, H, T, dr)
    kv, kv_lin = ops.linear_forward(x, wkv_a)  # (B, T, Dc+dr)
    ckv, kv_rms = ops.rmsnorm_forward(kv[..., :Dc], kv_norm, eps)  # (B, T, Dc)
    k_pe, k_rope = rope_forward(kv[:, None, :, Dc:], positions, inv_freq, rope_style,
                                attention_factor)  # (B, 1, T, dr)
    out = MLAProjection(q[..., :dn], q_pe, ckv, k_pe)
    return out, MLAProjCache(q_caches, q_rope, kv_lin, kv_rms, k_rope, g)


def mla_project_backward(dout, cache):
    """Reverse of mla_project_forward: dout is an MLAProjection of gradients; returns them
    for x, wkv_a, kv_norm and the query weights (wq, or wq_a, q_norm, wq_b)."""
    q_caches, q_rope, kv_lin, kv_rms, k_rope, g = cache
    specs = {"q_nope": (q_rope.shape[:-1] + (g.dn,), q_rope.cos.dtype),
             "q_pe": (q_rope.shape, q_rope.cos.dtype),
             "ckv": (kv_rms.x.shape, np.result_type(kv_rms.x, kv_rms.g)),
             "k_pe": (k_rope.shape, k_rope.cos.dtype)}
    expect_douts("mla_project_backward", dout, specs)
    dq_nope, dq_pe, dckv, dk_pe = (np.zeros(*spec) if d is None else d
                                   for d, spec in zip(dout, specs.values()))
    # fwd: q_pe = rope(q[..., dn:])  ->  rotate back by -theta
    dq = np.concatenate([dq_nope, rope_backward(dq_pe, q_rope)["x"]], axis=-1)  # (B, H, T, dn+dr)
    dq = merge_heads(dq)  # (B, T, H*(dn+dr)); fwd: q = split_heads(q)
    # fwd: ckv = rmsnorm(kv[..., :Dc]),  k_pe = rope(kv[..., Dc:])
    g_rms = ops.rmsnorm_backward(dckv, kv_rms)
    dk_pe = rope_backward(dk_pe, k_rope)["x"][:, 0]  # (B, T, dr)
    dkv = np.concatenate([g_rms["x"], dk_pe], axis=-1)  # (B, T, Dc+dr)
    g_kv = ops.linear_backward(dkv, kv_lin)  # fwd: kv = x @ wkv_a
    grads = {"wkv_a": g_kv["W"], "kv_norm": g_rms["g"]}
    if len(q_caches) == 1:
        g_q = ops.linear_backward(dq, q_caches[0])  # fwd: q = x @ wq
        grads["wq"] = g_q["W"]
    else:
        lin_a, rms, lin_b = q_caches
        g_b = ops.linear_backward(dq, lin_b)  # fwd: q = qn @ wq_b
        g_n = ops.rmsnorm_backward(g_b["x"], rms)  # fwd: qn = rmsnorm(qa, q_norm)
        g_q = ops.linear_backward(g_n["x"], lin_a)  # fwd: qa = x @ wq_a
        grads.update(wq_a=g_q["W"], q_norm=g_n["g"], wq_b=g_b["W"])
    grads["x"] = g_q["x"] + g_kv["x"]  # x feeds both the query and the latent
    return grads
