"""Multi-head latent attention (MLA), DeepSeek-V2 (arXiv 2405.04434) / DeepSeek-V3: the
training form, the absorbed decoding form with its latent state, and a Module.

Names follow DeepSeek-V3 `inference/model.py` (class MLA). Per token x (D,):
    q            = x @ wq                    or  wq_b(rmsnorm(x @ wq_a, q_norm))  # (H, dn+dr)
    q_nope, q_pe = split(q, [dn, dr]);   q_pe = rope(q_pe)                 (per head)
    c_kv, k_pe   = split(x @ wkv_a, [Dc, dr]);   k_pe = rope(k_pe)         (ONE key, all heads)
    k_nope, v    = split(rmsnorm(c_kv, kv_norm) @ wkv_b, [dn, dv])         (per head)
    out          = sdpa([q_nope, q_pe], [k_nope, k_pe], v, scale) @ wo,  scale = (dn+dr)^-1/2
Absorbed decoding keeps only (kv_norm(c_kv), k_pe): Dc + dr numbers per token per layer.
With spec.indexer (DeepSeek-V3.2's sparse attention, dsa.py) each query attends only to the
top_k keys its lightning indexer picks (sparse.py's pair), and the state also keeps each
token's indexer key; the indexer's weights get no gradient from the attention (a discrete
choice).
A layer's arrays travel as one MLAWeights (mla_projection.py), its sizes and RoPE as an
MLASpec (scratchllm.specs), passed unchanged from the Module into the pairs.
With wkv_b viewed as (Dc, H, dn+dv) = [W_UK | W_UV], q_nope . k_nope = (W_UK q_nope) . c, so
W_UK folds into the query and W_UV applies after attention: K and V are never rebuilt.

Glossary: B batch, T time (t cached tokens), D model, H heads, dn qk_nope_head_dim,
dr qk_rope_head_dim, dv v_head_dim, Dc kv_lora_rank, Dq q_lora_rank, Dh head dim (MHA/GQA).
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.dsa import (INDEXER_FIELDS, IndexedLatentState,
                                      check_indexer_weights, indexer_keep, indexer_select)
from scratchllm.attention.kv_state import LatentKVState, begin_step, rows_mask
from scratchllm.attention.mla_projection import (MLAProjCache, MLAProjection, MLAWeights,
                                                 check_mla_weights, geometry,
                                                 mla_project_backward, mla_project_forward)
from scratchllm.attention.rope import get_mscale, make_rope, row_rope
from scratchllm.attention.sdpa import merge_heads, sdpa_backward, sdpa_forward, split_heads
from scratchllm.attention.sparse import (topk_sparse_attention_backward,
                                         topk_sparse_attention_forward)
from scratchllm.core import ops
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.validate import expect_dout, expect_float, expect_ndim, expect_positive
from scratchllm.specs import Mask


# ---------------------------------------------------------------------------- arithmetic
def mla_softmax_scale(qk_head_dim, rope_scaling=None):
    """(dn+dr)^-1/2, times mscale^2 with mscale = 0.1 mscale_all_dim ln(factor) + 1 when a
    non-default rope_scaling carries a nonzero `mscale_all_dim` (HF deepseek_v3
    yarn_apply_mscale; DeepSeek-V3's model.py: 0.1 * mscale * ln(factor) + 1, the same with
    its mscale = mscale_all_dim = 1).

    >>> round(mla_softmax_scale(192, {"rope_type": "yarn", "factor": 40, "mscale_all_dim": 1}), 7)
    0.1352338
    """
    expect_positive("mla_softmax_scale", "qk_head_dim", qk_head_dim)
    scale = qk_head_dim ** -0.5
    p = rope_scaling or {}
    if p.get("rope_type", p.get("type", "default")) != "default" and p.get("mscale_all_dim"):
        scale *= get_mscale(p["factor"], p["mscale_all_dim"]) ** 2
    return scale


def _scale(spec):
    """The softmax scale of an MLASpec: mla_softmax_scale(dn + dr, its rope scaling)."""
    return mla_softmax_scale(spec.qk_nope_head_dim + spec.qk_rope_head_dim, spec.rope.scaling)


# ---------------------------------------------------------------------------- training form
class MLATrainCache(NamedTuple):
    proj: MLAProjCache
    up: ops.LinearCache
    att: tuple
    down: ops.LinearCache
    latent: np.ndarray  # (B, T, Dc) kv_norm(c_kv) and (B, 1, T, dr) the roped shared key:
    k_pe: np.ndarray  # what a LatentKVState holds after these tokens (MLA.prefill)
    attend_backward: object = sdpa_backward  # or topk_sparse_attention_backward (indexer)
    index_keys: np.ndarray = None  # (B, T, DI) the indexer's keys (spec.indexer)
    index_grads: tuple = None  # zeros like the indexer's arrays: no gradient reaches them


def mla_forward(x, w, *, spec, rope=None, mask=None):
    """MLA training form: rebuild per-head k, v from the latent, then attend.

    Inputs:  x (B, T, D); w an MLAWeights: wkv_a (D, Dc+dr), kv_norm (Dc,),
             wkv_b (Dc, H*(dn+dv)), wo (H*dv, D), and either wq (D, H*(dn+dr)) or wq_a
             (D, Dq), q_norm (Dq,), wq_b (Dq, H*(dn+dr)), as spec.q_lora_rank says;
             spec an MLASpec (geometry, norm_eps, rope; the softmax scale is
             mla_softmax_scale(dn + dr, spec.rope.scaling)); rope a Rope over dr, or None:
             spec.rope at positions 0..T-1; mask a Mask, or None: spec.mask (causal).
             With spec.indexer, w also holds the idx_* arrays and each query attends to
             the top_k causal keys the indexer picks (topk_sparse_attention_forward).
    Returns: out (B, T, D).  Cache: the children's caches (projections, wkv_b, sdpa, wo).
    """
    fn = "mla_forward"
    expect_float(fn, "x", x)
    expect_ndim(fn, "x", x, 3, "(B, T, D)")
    if x.shape[1] < 1:
        raise ValueError(f"{fn}: x has shape {x.shape}: no time steps (T must be >= 1)")
    check_mla_weights(fn, x.shape[2], w, spec)
    check_indexer_weights(fn, x.shape[2], w, spec)
    B, T, D = x.shape
    H, dn, dr, dv, Dc = geometry(fn, spec)
    rope = make_rope(spec.rope, dr, np.arange(T)) if rope is None else rope
    (q_nope, q_pe, ckv, k_pe), proj = mla_project_forward(x, w, spec=spec, rope=rope)
    kvb, up = ops.linear_forward(ckv, w.wkv_b)  # (B, T, H*(dn+dv))
    kvb = split_heads(kvb, H)  # (B, H, T, dn+dv)
    q = np.concatenate([q_nope, q_pe], axis=-1)  # (B, H, T, dn+dr)
    k = np.concatenate([kvb[..., :dn], np.broadcast_to(k_pe, (B, H, T, dr))], axis=-1)  # (B, H, T, dn+dr)
    mask = spec.mask if mask is None else mask
    if spec.indexer is None:
        o, att = sdpa_forward(q, k, kvb[..., dn:], mask, _scale(spec))  # (B, H, T, dv)
        out, down = ops.linear_forward(merge_heads(o), w.wo)  # (B, T, D)
        return out, MLATrainCache(proj, up, att, down, ckv, k_pe)
    if not mask.is_plain_causal:
        raise ValueError(f"{fn}: the indexer picks among the causal keys; mask={mask!r}")
    indices, keys = indexer_select(x, w, spec=spec, rope=rope)  # (B, T, K), (B, T, DI)
    o, att = topk_sparse_attention_forward(q, k, kvb[..., dn:], indices,
                                           scale=_scale(spec))  # (B, H, T, dv)
    out, down = ops.linear_forward(merge_heads(o), w.wo)  # (B, T, D)
    zeros = tuple(np.zeros_like(getattr(w, n)) for n in INDEXER_FIELDS)
    return out, MLATrainCache(proj, up, att, down, ckv, k_pe, topk_sparse_attention_backward,
                              keys, zeros)


def mla_backward(dout, cache):
    """Reverse of mla_forward through the linear, sdpa, rmsnorm and rope backward pairs.

    Math: the shared key k_pe is broadcast over heads, so its gradient is the sum over heads
    of dk[..., dn:]; x feeds both the query and the latent, so dx adds the two paths.
    Returns: {"x": dx, "w": MLAWeights of gradients (None for the absent query weights)}.
    With the indexer, attention's backward is the sparse pair's (through the chosen keys
    only) and the indexer's arrays get zeros: the top-k choice passes no gradient.
    Reference: DeepSeek-V2 (arXiv 2405.04434) §2.1; deepseek-ai/DeepSeek-V3
    inference/model.py class MLA.
    """
    proj, up, att, down, _, _, attend_backward, _, index_grads = cache
    expect_dout("mla_backward", dout, *ops.linear_out(down))
    H, dn, dr, dv, Dc = proj.g
    g_out = ops.linear_backward(dout, down)  # fwd: out = o @ wo
    do = split_heads(g_out["x"], H)  # (B, H, T, dv); fwd: merge_heads(o)
    g_att = attend_backward(do, att)  # fwd: o = sdpa(q, k, v) (or over the chosen keys)
    dq, dk = g_att["q"], g_att["k"]  # (B, H, T, dn+dr)
    # fwd: k_nope, v = split(kvb)  ->  stack their gradients back
    dkvb = np.concatenate([dk[..., :dn], g_att["v"]], axis=-1)  # (B, H, T, dn+dv)
    dkvb = merge_heads(dkvb)  # (B, T, H*(dn+dv)); fwd: kvb = split_heads(kvb)
    g_up = ops.linear_backward(dkvb, up)  # fwd: kvb = ckv @ wkv_b
    dk_pe = dk[..., dn:].sum(axis=1, keepdims=True)  # (B, 1, T, dr); fwd: broadcast over heads
    g = mla_project_backward(MLAProjection(dq[..., :dn], dq[..., dn:], g_up["x"], dk_pe), proj)
    dw = g["w"]._replace(wkv_b=g_up["W"], wo=g_out["W"])
    if index_grads is not None:  # fwd: indices = top-k of the indexer: no gradient
        dw = dw._replace(**dict(zip(INDEXER_FIELDS, index_grads)))
    return {"x": g["x"], "w": dw}


def _decode_project(fn, x_t, w, state, position, spec, rope):
    """Project the new token, append (ckv, k_pe) to the state; return q_nope (B, H, 1, dn),
    q_pe (B, H, 1, dr), the geometry and the keys it may attend: rows_mask(state), and with
    spec.indexer only the top_k its indexer picks (None: all)."""
    expect_ndim(fn, "x_t", x_t, 2, "(B, D)")
    check_mla_weights(fn, x_t.shape[1], w, spec, names=("wkv_b", "wo"))  # the rest: below
    check_indexer_weights(fn, x_t.shape[1], w, spec)
    g = geometry(fn, spec)
    width = state.latents.shape[2] if isinstance(state, LatentKVState) else \
        getattr(state, "latent_width", None)  # or a serving cache's view (serve/pool.py)
    if width != g.Dc + g.dr or (spec.indexer is not None and
                                not isinstance(state, IndexedLatentState)):
        raise ValueError(f"{fn}: state must be a LatentKVState of width Dc + dr = "
                         f"{g.Dc + g.dr} (an IndexedLatentState with spec.indexer)")
    position = begin_step(fn, state, position)  # int, or (B,) int64: one per row
    if rope is None:
        rope = row_rope(fn, spec.rope, g.dr, position)
    (q_nope, q_pe, ckv, k_pe), _ = mla_project_forward(x_t[:, None], w, spec=spec, rope=rope)
    state.append(ckv[:, 0], k_pe[:, 0, 0])
    keep = rows_mask(state)  # None, or (B, 1, 1, t) when the rows hold different lengths
    if spec.indexer is not None:  # only the keys the indexer picks
        keep = indexer_keep(x_t[:, None], w, state, spec=spec, rope=rope)[:, None, None]
    return q_nope, q_pe, g, keep


def mla_decode(x_t, w, state, position, *, spec, rope=None):
    """One decoding step in the absorbed form (DeepSeek-V3 attn_impl="absorb").

    Inputs:  x_t (B, D) the new token; w, spec as mla_forward; state: a LatentKVState
             (appended to; or a view with its protocol: latent_width, append, latents,
             key_mask); position: the new token's position, an int or (B,) ints (one per
             row, kv_state.begin_step); rope a Rope there, or None: spec.rope there.
    Returns: out (B, D), equal to the last row of mla_forward on the whole sequence.
    Math:    mla_latent_attention with one query per row against the state's latents.
    """
    q_nope, q_pe, g, keep = _decode_project("mla_decode", x_t, w, state, position, spec,
                                            rope)
    lat = state.latents[:, :state.length]  # (B, t, Dc+dr) view: the keys; [..., :Dc] values
    keep = None if keep is None else keep[:, 0]  # (B, 1, t)
    return mla_latent_attention(q_nope, q_pe, lat, keep, w, spec)[:, 0]  # (B, D)


def mla_latent_attention(q_nope, q_pe, lat, keep, w, spec):
    """The absorbed form's attention of t queries per row against cached latents.

    Inputs:  q_nope (B, H, t, dn), q_pe (B, H, t, dr) roped (mla_project_forward's); lat
             (B, L, Dc+dr) the rows' cached [kv_norm(c_kv) | k_pe]; keep (B, t, L) bool (query
             j of row b may read key l), or None: all; w (wkv_b, wo), spec as mla_forward.
    Returns: out (B, t, D) (forward only: decoding and serving).
    Math:    wkv_b as (Dc, H, dn+dv) = [W_UK | W_UV].  q_abs = W_UK q_nope (B, H, t, Dc), so
             scores = (q_abs . ckv_l + q_pe . k_pe_l) * scale; o = W_UV (sum_l P_l ckv_l).
             All heads share one key (like MQA), so per sequence this is one small
             attention of H t query rows against L latent rows. The scores are computed as
             latents @ q^T (L rows), which OpenBLAS runs faster than sdpa's q @ k^T with only
             H query rows (1.0 vs 3.6 ms at L = 4096, B = 8, t = 1, one thread).
    """
    H, dn, dr, dv, Dc = geometry("mla_latent_attention", spec)
    B, _, t, _ = q_nope.shape
    wb = w.wkv_b.reshape(Dc, H, dn + dv).transpose(1, 0, 2)  # (H, Dc, dn+dv)
    qn = q_nope.transpose(1, 0, 2, 3).reshape(H, B * t, dn)  # (H, B*t, dn)
    q_abs = (qn @ wb[..., :dn].swapaxes(1, 2)).reshape(H, B, t, Dc)  # (H, B, t, Dc)
    q = np.concatenate([q_abs.transpose(1, 0, 2, 3), q_pe], axis=-1)  # (B, H, t, Dc+dr)
    q = q.reshape(B, H * t, Dc + dr)  # (B, H*t, Dc+dr) rows (h, j)
    s = (lat @ q.swapaxes(1, 2)).swapaxes(1, 2) * np.asarray(_scale(spec), q.dtype)  # (B,H*t,L)
    s = s.reshape(B, H, t, lat.shape[1])  # (B, H, t, L)
    if keep is not None:  # a shorter row's stale slots, the unpicked keys, the causal mask
        s = np.where(keep[:, None], s, -np.inf)
    p, _ = ops.softmax_forward(s)  # (B, H, t, L)
    o_lat = p.reshape(B, H * t, -1) @ lat[..., :Dc]  # (B, H*t, Dc)
    o_lat = o_lat.reshape(B, H, t, Dc).transpose(1, 0, 2, 3).reshape(H, B * t, Dc)
    o = o_lat @ wb[..., dn:]  # (H, B*t, dv); W_UV after attention
    o = o.reshape(H, B, t, dv).transpose(1, 2, 0, 3).reshape(B, t, H * dv)  # (B, t, H*dv)
    return ops.linear_forward(o, w.wo)[0]  # (B, t, D)


def mla_decode_ref(x_t, w, state, position, *, spec, rope=None):
    """The naive twin of mla_decode (DeepSeek-V3 attn_impl="naive" math, same latent state):
    rebuild every cached token's per-head k = [ckv W_UK | k_pe] and v = ckv W_UV, then sdpa."""
    q_nope, q_pe, g, keep = _decode_project("mla_decode_ref", x_t, w, state, position, spec,
                                            rope)
    H, dn, dr, dv, Dc = g
    B, t = x_t.shape[0], state.length
    kvb = split_heads(ops.linear_forward(state.kv, w.wkv_b)[0], H)  # (B, H, t, dn+dv)
    pe = np.broadcast_to(state.pe[:, None], (B, H, t, dr))  # (B, H, t, dr)
    k = np.concatenate([kvb[..., :dn], pe], axis=-1)  # (B, H, t, dn+dr)
    q = np.concatenate([q_nope, q_pe], axis=-1)  # (B, H, 1, dn+dr)
    o, _ = sdpa_forward(q, k, kvb[..., dn:], None if keep is None else Mask(array=keep),
                        _scale(spec))  # (B, H, 1, dv)
    return ops.linear_forward(merge_heads(o)[:, 0], w.wo)[0]  # (B, D)


# ---------------------------------------------------------------------------- module
class MLA(Module):
    """MLA layer for a model: owns the Params (named as MLAWeights' fields) and calls
    mla_forward / mla_backward / mla_decode with its MLASpec unchanged. q_lora_rank = 0 gives
    the direct `wq` form. RMSNorm gains start at one; matrices ~ N(0, 1/d_in)."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        D, (H, dn, dr, dv, Dc), Dq = d_model, geometry("MLA", spec), spec.q_lora_rank
        if Dq:
            self.wq_a = Param(normal_init(rng, (D, Dq), D ** -0.5, dtype))
            self.q_norm = Param(np.ones(Dq, dtype))
            self.wq_b = Param(normal_init(rng, (Dq, H * (dn + dr)), Dq ** -0.5, dtype))
        else:
            self.wq = Param(normal_init(rng, (D, H * (dn + dr)), D ** -0.5, dtype))
        self.wkv_a = Param(normal_init(rng, (D, Dc + dr), D ** -0.5, dtype))
        self.kv_norm = Param(np.ones(Dc, dtype))
        self.wkv_b = Param(normal_init(rng, (Dc, H * (dn + dv)), Dc ** -0.5, dtype))
        self.wo = Param(normal_init(rng, (H * dv, D), (H * dv) ** -0.5, dtype))
        if spec.indexer is not None:  # DeepSeek-V3.2's lightning indexer (dsa.py)
            HI, DI = spec.indexer.n_heads, spec.indexer.head_dim
            self.idx_wq = Param(normal_init(rng, (Dq, HI * DI), Dq ** -0.5, dtype))
            self.idx_wk = Param(normal_init(rng, (D, DI), D ** -0.5, dtype))
            self.idx_k_norm = Param(np.ones(DI, dtype))
            self.idx_k_norm_b = Param(np.zeros(DI, dtype))
            self.idx_w = Param(normal_init(rng, (D, HI), D ** -0.5, dtype))
        self.spec = spec

    def _weights(self):
        """The Params' arrays as the pair's MLAWeights (None for the absent query form)."""
        params = (getattr(self, name, None) for name in MLAWeights._fields)
        return MLAWeights(*(None if p is None else p.data for p in params))

    def forward(self, x, positions=None, mask=None):
        """x (B, T, D) at `positions` ((T,) or (B, T) ints; default 0..T-1) under `mask`
        (default spec.mask) -> (y, cache)."""
        rope = None if positions is None else make_rope(self.spec.rope,
                                                        self.spec.qk_rope_head_dim, positions)
        return mla_forward(x, self._weights(), spec=self.spec, rope=rope, mask=mask)

    def backward(self, dout, cache):
        g = mla_backward(dout, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))

    def init_state(self, batch, max_len):
        """The decoding state: a LatentKVState of Dc + dr numbers per token (with the
        indexer an IndexedLatentState, + DI)."""
        spec, dt = self.spec, self.wo.data.dtype
        if spec.indexer is not None:
            return IndexedLatentState(batch, max_len, spec.kv_lora_rank, spec.qk_rope_head_dim,
                                      spec.indexer.head_dim, dt)
        return LatentKVState(batch, max_len, spec.kv_lora_rank, spec.qk_rope_head_dim, dt)

    def prefill(self, x, state):
        """The prompt x (B, T, D) in one training-form forward; returns y (B, T, D) and
        appends each token's [kv_norm(c_kv) | k_pe] to the empty LatentKVState: the latent is
        the input of the wkv_b linear, k_pe the roped part of any head's key."""
        if state.length:
            raise ValueError(f"MLA.prefill: the state already holds {state.length} tokens; "
                             f"prefill fills a fresh state from init_state")
        y, cache = self.forward(x)  # (B, T, D)
        for t in range(x.shape[1]):  # the latent (B, T, Dc) and k_pe (B, 1, T, dr) of the cache
            state.append(cache.latent[:, t], cache.k_pe[:, 0, t])
            if cache.index_keys is not None:  # and the indexer's keys (B, T, DI)
                state.append_index_key(cache.index_keys[:, t])
        return y

    def decode(self, x_t, state, position):
        """One token (B, D) -> (B, D) in the absorbed form, appending to `state`."""
        return mla_decode(x_t, self._weights(), state, position, spec=self.spec)
