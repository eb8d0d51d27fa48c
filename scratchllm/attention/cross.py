"""Cross-attention (Vaswani et al. 2017, arXiv 1706.03762, the decoder's encoder-decoder
attention): queries from one sequence, keys and values from another, so Tq != Tk.

Math:
    q = x Wq,  k = ctx Wk,  v = ctx Wv   (heads split; query head h reads KV head h // G)
    y = concat_heads(sdpa(q, k, v, mask)) Wo        mask e.g. (B, 1, 1, Tk) for padding
No RoPE and no causal mask: every query may read the whole context (masked keys excepted).
Backward: the linear and sdpa backwards; ctx's gradient is the sum of its k and v paths.

Glossary: B batch, Tq query length, Tk context length, D model width, Dc context width,
H heads, Hkv KV heads, Dh head dim.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.sdpa import merge_heads, sdpa_backward, sdpa_forward, split_heads
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import linear_backward, linear_forward, linear_out
from scratchllm.core.validate import expect_dout, expect_ndim, expect_shape


class CrossCache(NamedTuple):
    lin_q: tuple
    lin_k: tuple
    lin_v: tuple
    sdpa: tuple
    lin_o: tuple
    n_heads: int
    n_kv_heads: int


def cross_attention_forward(x, ctx, wq, wk, wv, wo, *, n_heads, n_kv_heads, mask=None):
    """y = sdpa(split(x Wq), split(ctx Wk), split(ctx Wv), mask) Wo.

    Inputs:  x (B, Tq, D) queries' stream; ctx (B, Tk, Dc) the other sequence (an encoder's
             output); wq (D, H*Dh); wk, wv (Dc, Hkv*Dh); wo (H*Dh, D); mask bool
             broadcastable to (B, H, Tq, Tk) or None.
    Returns: y (B, Tq, D).  Cache: CrossCache.
    """
    expect_ndim("cross_attention", "x", x, 3, "(B, Tq, D)")
    expect_ndim("cross_attention", "ctx", ctx, 3, "(B, Tk, Dc)")
    expect_shape("cross_attention", "ctx", ctx, (x.shape[0], None, None), "(B, Tk, Dc) like x")
    expect_ndim("cross_attention", "wq", wq, 2, "(D, H*Dh)")
    if n_kv_heads < 1 or n_heads % n_kv_heads or wq.shape[-1] % n_heads:
        raise ValueError(f"cross_attention: n_heads={n_heads} must be a multiple of "
                         f"n_kv_heads={n_kv_heads} and divide wq's {wq.shape[-1]} columns")
    Dh = wq.shape[-1] // n_heads
    expect_shape("cross_attention", "wk", wk, (ctx.shape[2], n_kv_heads * Dh), "(Dc, Hkv*Dh)")
    expect_shape("cross_attention", "wv", wv, wk.shape, "(Dc, Hkv*Dh)")
    expect_shape("cross_attention", "wo", wo, (n_heads * Dh, x.shape[2]), "(H*Dh, D)")
    q, lin_q = linear_forward(x, wq)  # (B, Tq, H*Dh)
    k, lin_k = linear_forward(ctx, wk)  # (B, Tk, Hkv*Dh)
    v, lin_v = linear_forward(ctx, wv)  # (B, Tk, Hkv*Dh)
    o, sd = sdpa_forward(split_heads(q, n_heads), split_heads(k, n_kv_heads),
                         split_heads(v, n_kv_heads), mask)  # (B, H, Tq, Dh)
    y, lin_o = linear_forward(merge_heads(o), wo)  # (B, Tq, D)
    return y, CrossCache(lin_q, lin_k, lin_v, sd, lin_o, n_heads, n_kv_heads)


def cross_attention_backward(dy, cache):
    """Math: the linear and sdpa backwards in reverse; d ctx = dk Wk^T + dv Wv^T.
    Reference: Vaswani et al. 2017 (arXiv 1706.03762) section 3.2.3."""
    expect_dout("cross_attention_backward", dy, *linear_out(cache.lin_o), name="dy")
    g_o = linear_backward(dy, cache.lin_o)  # fwd: y = merge_heads(o) @ wo
    g = sdpa_backward(split_heads(g_o["x"], cache.n_heads), cache.sdpa)  # fwd: o = sdpa(q,k,v)
    g_q = linear_backward(merge_heads(g["q"]), cache.lin_q)  # fwd: q = split(x @ wq)
    g_k = linear_backward(merge_heads(g["k"]), cache.lin_k)  # fwd: k = split(ctx @ wk)
    g_v = linear_backward(merge_heads(g["v"]), cache.lin_v)  # fwd: v = split(ctx @ wv)
    return {"x": g_q["x"], "ctx": g_k["x"] + g_v["x"], "wq": g_q["W"], "wk": g_k["W"],
            "wv": g_v["W"], "wo": g_o["W"]}


class CrossAttention(Module):
    """Cross-attention layer owning wq, wk, wv, wo: forward(x, ctx, mask) -> (y, cache);
    backward(dy, cache) -> {"x": dx, "ctx": dctx}, Param grads added (the context's gradient
    goes back to the encoder, so both input gradients are returned, keyed like the pair's)."""

    def __init__(self, d_model, n_heads, n_kv_heads=None, *, rng, d_context=None,
                 head_dim=None, dtype=np.float32):
        Hkv, Dc = n_kv_heads or n_heads, d_context or d_model
        Dh = head_dim or d_model // n_heads
        self.wq = Param(normal_init(rng, (d_model, n_heads * Dh), d_model ** -0.5, dtype))
        self.wk = Param(normal_init(rng, (Dc, Hkv * Dh), Dc ** -0.5, dtype))
        self.wv = Param(normal_init(rng, (Dc, Hkv * Dh), Dc ** -0.5, dtype))
        self.wo = Param(normal_init(rng, (n_heads * Dh, d_model), (n_heads * Dh) ** -0.5, dtype))
        self.n_heads, self.n_kv_heads = n_heads, Hkv

    def forward(self, x, ctx, mask=None):
        return cross_attention_forward(x, ctx, self.wq.data, self.wk.data, self.wv.data,
                                       self.wo.data, n_heads=self.n_heads,
                                       n_kv_heads=self.n_kv_heads, mask=mask)

    def backward(self, dy, cache):
        grads = cross_attention_backward(dy, cache)
        self.add_grads(grads)
        return {"x": grads["x"], "ctx": grads["ctx"]}
