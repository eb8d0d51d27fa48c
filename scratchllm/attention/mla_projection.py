"""MLA's shared projections (DeepSeek-V2, arXiv 2405.04434 §2.1; DeepSeek-V3
`inference/model.py` class MLA): what the training form and the absorbed decoding form both
compute from x, as one forward/backward pair; and MLAWeights, one layer's arrays, checked
against its MLASpec (scratchllm.specs).

    q            = x @ wq                    or  wq_b(rmsnorm(x @ wq_a, q_norm))  # (H, dn+dr)
    q_nope, q_pe = split(q, [dn, dr]);   q_pe = rope(q_pe)                 (per head)
    c_kv, k_pe   = split(x @ wkv_a, [Dc, dr]);   k_pe = rope(k_pe)         (ONE key, all heads)
    ckv          = rmsnorm(c_kv, kv_norm)

Glossary: B batch, T time, D model, H heads, dn qk_nope_head_dim, dr qk_rope_head_dim,
dv v_head_dim, Dc kv_lora_rank, Dq q_lora_rank.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.rope import make_rope, rope_backward, rope_forward
from scratchllm.attention.sdpa import merge_heads, split_heads
from scratchllm.core import ops
from scratchllm.core.validate import expect_douts, expect_float, expect_ndim, expect_shape
from scratchllm.specs import MLASpec


# ---------------------------------------------------------------------------- weights, shapes
class MLAWeights(NamedTuple):
    """One MLA layer's arrays, DeepSeek-V3's names (the MLA Module's Params)."""
    wkv_a: np.ndarray  # (D, Dc+dr)
    kv_norm: np.ndarray  # (Dc,)
    wkv_b: np.ndarray  # (Dc, H*(dn+dv))
    wo: np.ndarray  # (H*dv, D)
    wq: np.ndarray = None  # (D, H*(dn+dr))   when spec.q_lora_rank == 0
    wq_a: np.ndarray = None  # (D, Dq)        otherwise, with
    q_norm: np.ndarray = None  # (Dq,)
    wq_b: np.ndarray = None  # (Dq, H*(dn+dr))
    idx_wq: np.ndarray = None  # (Dq, HI*DI)  spec.indexer (DeepSeek-V3.2): the lightning
    idx_wk: np.ndarray = None  # (D, DI)      indexer's query and key maps, its key
    idx_k_norm: np.ndarray = None  # (DI,)    LayerNorm's gain and bias, its per-head
    idx_k_norm_b: np.ndarray = None  # (DI,)  weights (dsa.py)
    idx_w: np.ndarray = None  # (D, HI)


class MLAGeometry(NamedTuple):
    H: int
    dn: int
    dr: int
    dv: int
    Dc: int


def geometry(fn, spec):
    """(H, dn, dr, dv, Dc) of an MLASpec (TypeError for anything else)."""
    if not isinstance(spec, MLASpec):
        raise TypeError(f"{fn}: spec must be an MLASpec, got {type(spec).__name__}")
    return MLAGeometry(spec.n_heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim,
                       spec.v_head_dim, spec.kv_lora_rank)


def check_mla_weights(fn, D, w, spec, names=("wkv_a", "kv_norm", "wkv_b", "wo")):
    """The MLAWeights w for model width D: the query weights the spec's q_lora_rank says
    (wq, or wq_a, q_norm and wq_b) and `names` of the others, each of its shape."""
    if not isinstance(w, MLAWeights):
        raise TypeError(f"{fn}: w must be an MLAWeights, got {type(w).__name__}")
    H, dn, dr, dv, Dc = geometry(fn, spec)
    Dq, qk = spec.q_lora_rank, H * (dn + dr)
    shapes = {"wkv_a": ((D, Dc + dr), "(D, Dc + dr)"), "kv_norm": ((Dc,), "(Dc,)"),
              "wkv_b": ((Dc, H * (dn + dv)), "(Dc, H * (dn + dv))"),
              "wo": ((H * dv, D), "(H * dv, D)"), "wq": ((D, qk), "(D, H * (dn + dr))"),
              "wq_a": ((D, Dq), "(D, Dq)"), "q_norm": ((Dq,), "(Dq,)"),
              "wq_b": ((Dq, qk), "(Dq, H * (dn + dr))")}
    query = ("wq",) if Dq == 0 else ("wq_a", "q_norm", "wq_b")
    given = tuple(n for n in ("wq", "wq_a", "q_norm", "wq_b") if getattr(w, n) is not None)
    if given != query:
        raise ValueError(f"{fn}: give either wq (spec.q_lora_rank = 0) or all of wq_a, q_norm "
                         f"and wq_b (q_lora_rank > 0); spec.q_lora_rank={Dq}, got {list(given)}")
    for name in names + query:
        expect_shape(fn, name, getattr(w, name), *shapes[name])


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


def mla_project_forward(x, w, *, spec, rope=None):
    """What both forms share: per-head queries, the normalised latent, the one roped key.

    Inputs:  x (B, T, D); w an MLAWeights (wkv_a, kv_norm and the query weights: wq, or
             wq_a, q_norm and wq_b; wkv_b and wo are not used here, None is fine);
             spec an MLASpec (geometry, norm_eps); rope a Rope over dr, or None: spec.rope
             at positions 0..T-1.
    Returns: MLAProjection(q_nope (B, H, T, dn), q_pe (B, H, T, dr) roped,
             ckv = kv_norm(c_kv) (B, T, Dc), k_pe (B, 1, T, dr) roped).  Cache: MLAProjCache.
    """
    fn = "mla_project"
    expect_float(fn, "x", x)
    expect_ndim(fn, "x", x, 3, "(B, T, D)")
    B, T, D = x.shape
    check_mla_weights(fn, D, w, spec, names=("wkv_a", "kv_norm"))
    g = geometry(fn, spec)
    H, dn, dr, dv, Dc = g
    rope = make_rope(spec.rope, dr, np.arange(T)) if rope is None else rope
    eps = spec.norm_eps
    if w.wq is not None:
        q, lin = ops.linear_forward(x, w.wq)  # (B, T, H*(dn+dr))
        q_caches = (lin,)
    else:
        qa, lin_a = ops.linear_forward(x, w.wq_a)  # (B, T, Dq)
        qn, rms = ops.rmsnorm_forward(qa, w.q_norm, eps)  # (B, T, Dq)
        q, lin_b = ops.linear_forward(qn, w.wq_b)  # (B, T, H*(dn+dr))
        q_caches = (lin_a, rms, lin_b)
    q = split_heads(q, H)  # (B, H, T, dn+dr)
    q_pe, q_rope = rope_forward(q[..., dn:], rope)  # (B, H, T, dr)
    kv, kv_lin = ops.linear_forward(x, w.wkv_a)  # (B, T, Dc+dr)
    ckv, kv_rms = ops.rmsnorm_forward(kv[..., :Dc], w.kv_norm, eps)  # (B, T, Dc)
    k_pe, k_rope = rope_forward(kv[:, None, :, Dc:], rope)  # (B, 1, T, dr)
    out = MLAProjection(q[..., :dn], q_pe, ckv, k_pe)
    return out, MLAProjCache(q_caches, q_rope, kv_lin, kv_rms, k_rope, g)


def mla_project_backward(dout, cache):
    """Reverse of mla_project_forward: dout is an MLAProjection of gradients; returns
    {"x": dx, "w": MLAWeights of the gradients of wkv_a, kv_norm and the query weights, None
    for wkv_b and wo}."""
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
    if len(q_caches) == 1:
        g_q = ops.linear_backward(dq, q_caches[0])  # fwd: q = x @ wq
        dw = MLAWeights(g_kv["W"], g_rms["g"], None, None, wq=g_q["W"])
    else:
        lin_a, rms, lin_b = q_caches
        g_b = ops.linear_backward(dq, lin_b)  # fwd: q = qn @ wq_b
        g_n = ops.rmsnorm_backward(g_b["x"], rms)  # fwd: qn = rmsnorm(qa, q_norm)
        g_q = ops.linear_backward(g_n["x"], lin_a)  # fwd: qa = x @ wq_a
        dw = MLAWeights(g_kv["W"], g_rms["g"], None, None, wq_a=g_q["W"], q_norm=g_n["g"],
                        wq_b=g_b["W"])
    return {"x": g_q["x"] + g_kv["x"], "w": dw}  # x feeds both the query and the latent
