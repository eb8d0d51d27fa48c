"""Cross-attention (Vaswani et al. 2017, arXiv 1706.03762, the decoder's encoder-decoder
attention): queries from one sequence, keys and values from another, so Tq != Tk.

Math:
    q = x Wq,  k = ctx Wk,  v = ctx Wv   (heads split; query head h reads KV head h // G)
    y = concat_heads(sdpa(q, k, v, mask)) Wo        mask e.g. Mask(array=(B, 1, 1, Tk)) for padding
No RoPE and no causal mask: every query may read the whole context (masked keys excepted).
Backward: the linear and sdpa backwards; ctx's gradient is the sum of its k and v paths.

Glossary: B batch, Tq query length, Tk context length, D model width, Dc context width,
H heads, Hkv KV heads, Dh head dim.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.qkv import AttentionWeights, check_attention_weights
from scratchllm.attention.sdpa import merge_heads, sdpa_backward, sdpa_forward, split_heads
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import linear_backward, linear_forward, linear_out
from scratchllm.core.validate import (expect_dout, expect_float, expect_linear, expect_ndim,
                                      expect_shape)


class CrossCache(NamedTuple):
    lin_q: tuple
    lin_k: tuple
    lin_v: tuple
    sdpa: tuple
    lin_o: tuple
    n_heads: int
    n_kv_heads: int


def _check_spec(fn, spec):
    """Cross-attention has no positions or tiled kernel (biases on the projections it takes:
    spec.qkv_bias, spec.o_bias), and its queries read the whole context: what the spec may
    ask of it."""
    asked = [f"{name}={getattr(spec, name)!r}" for name, off in (
        ("rope", None), ("alibi", False), ("impl", "sdpa"), ("output_gate", False))
        if getattr(spec, name) != off]
    if asked:
        raise ValueError(f"{fn}: spec has {', '.join(asked)}; cross-attention takes rope=None, "
                         f"position_bias=None, impl='sdpa', no output_gate")
    if spec.mask.causal and spec.mask.array is None:
        raise ValueError(f"{fn}: spec.mask={spec.mask!r} is causal; cross-attention reads the "
                         f"whole context: give Mask(causal=False) (or a padding array)")


def check_cross_inputs(fn, x, ctx, w, spec, names=("x", "ctx")):
    """What cross_attention_forward reads, checked under the caller's name `fn` and its names
    of the two streams: x (B, Tq, D), ctx (B, Tk, Dc) float; w an AttentionWeights with
    wq (D, H*Dh), wk, wv (Dc, Hkv*Dh), wo (H*Dh, D) and the biases the spec asks for."""
    for name, a in zip(names, (x, ctx)):
        expect_float(fn, name, a)
    expect_ndim(fn, names[0], x, 3, "(B, Tq, D)")
    expect_ndim(fn, names[1], ctx, 3, "(B, Tk, Dc)")
    expect_shape(fn, names[1], ctx, (x.shape[0], None, None), f"(B, Tk, Dc) like {names[0]}")
    check_attention_weights(fn, w, spec)
    _check_spec(fn, spec)
    H, Hkv, Dh = spec.n_heads, spec.n_kv_heads, spec.dh(x.shape[2])
    expect_linear(fn, x.shape[2], w.wq, w.bq, ("wq", "bq"), d_out=H * Dh)
    expect_linear(fn, ctx.shape[2], w.wk, w.bk, ("wk", "bk"), d_out=Hkv * Dh)
    expect_linear(fn, ctx.shape[2], w.wv, w.bv, ("wv", "bv"), d_out=Hkv * Dh)
    expect_linear(fn, H * Dh, w.wo, w.bo, ("wo", "bo"), d_out=x.shape[2])


def cross_attention_forward(x, ctx, w, *, spec, mask=None):
    """y = sdpa(split(x Wq + bq), split(ctx Wk + bk), split(ctx Wv + bv), mask) Wo + bo.

    Inputs:  x (B, Tq, D) queries' stream; ctx (B, Tk, Dc) the other sequence (an encoder's
             output); w an AttentionWeights: wq (D, H*Dh), wk, wv (Dc, Hkv*Dh), wo (H*Dh, D),
             and bq, bk, bv, bo where spec.qkv_bias / spec.o_bias ask for them;
             spec an AttentionSpec (n_heads, n_kv_heads, head_dim, scale; rope=None,
             mask=Mask(causal=False)); mask a Mask (e.g. Mask(array=keep) with keep bool
             (B, 1, 1, Tk) for padding), or None: spec.mask.
    Returns: y (B, Tq, D).  Cache: CrossCache.
    """
    check_cross_inputs("cross_attention", x, ctx, w, spec)
    H, Hkv = spec.n_heads, spec.n_kv_heads
    q, lin_q = linear_forward(x, w.wq, w.bq)  # (B, Tq, H*Dh)
    k, lin_k = linear_forward(ctx, w.wk, w.bk)  # (B, Tk, Hkv*Dh)
    v, lin_v = linear_forward(ctx, w.wv, w.bv)  # (B, Tk, Hkv*Dh)
    o, sd = sdpa_forward(split_heads(q, H), split_heads(k, Hkv), split_heads(v, Hkv),
                         spec.mask if mask is None else mask, spec.scale)  # (B, H, Tq, Dh)
    y, lin_o = linear_forward(merge_heads(o), w.wo, w.bo)  # (B, Tq, D)
    return y, CrossCache(lin_q, lin_k, lin_v, sd, lin_o, H, Hkv)


def cross_attention_backward(dy, cache):
    """Math: the linear and sdpa backwards in reverse; d ctx = dk Wk^T + dv Wv^T.
    Returns {"x": dx, "ctx": dctx, "w": AttentionWeights(dwq, dwk, dwv, dwo[, the biases'])}.
    Reference: Vaswani et al. 2017 (arXiv 1706.03762) section 3.2.3."""
    expect_dout("cross_attention_backward", dy, *linear_out(cache.lin_o), name="dy")
    g_o = linear_backward(dy, cache.lin_o)  # fwd: y = merge_heads(o) @ wo
    g = sdpa_backward(split_heads(g_o["x"], cache.n_heads), cache.sdpa)  # fwd: o = sdpa(q,k,v)
    g_q = linear_backward(merge_heads(g["q"]), cache.lin_q)  # fwd: q = split(x @ wq)
    g_k = linear_backward(merge_heads(g["k"]), cache.lin_k)  # fwd: k = split(ctx @ wk)
    g_v = linear_backward(merge_heads(g["v"]), cache.lin_v)  # fwd: v = split(ctx @ wv)
    return {"x": g_q["x"], "ctx": g_k["x"] + g_v["x"],
            "w": AttentionWeights(g_q["W"], g_k["W"], g_v["W"], g_o["W"], g_q.get("b"),
                                  g_k.get("b"), g_v.get("b"), g_o.get("b"))}


class CrossContext(NamedTuple):
    """What decoding keeps of the context: its keys and values, computed once."""
    k: np.ndarray  # (B, Hkv, Tk, Dh)
    v: np.ndarray  # (B, Hkv, Tk, Dh)
    mask: object   # the Mask the queries read it with (None: spec.mask)


def cross_attention_context(ctx, w, *, spec, mask=None):
    """The decoding context of cross_attention_forward: k = split(ctx Wk + bk), v = split(ctx
    Wv + bv), once for every later query. ctx (B, Tk, Dc) -> CrossContext (no cache: decoding
    is not differentiated)."""
    fn = "cross_attention_context"
    expect_ndim(fn, "ctx", ctx, 3, "(B, Tk, Dc)")
    check_attention_weights(fn, w, spec)
    _check_spec(fn, spec)
    k, _ = linear_forward(ctx, w.wk, w.bk)  # (B, Tk, Hkv*Dh)
    v, _ = linear_forward(ctx, w.wv, w.bv)  # (B, Tk, Hkv*Dh)
    return CrossContext(split_heads(k, spec.n_kv_heads), split_heads(v, spec.n_kv_heads), mask)


def cross_attention_read(x, context, w, *, spec):
    """cross_attention_forward's y for queries x (B, D) (one decoding step) or (B, Tq, D)
    (a prefill) over a CrossContext: the same math with k and v already projected."""
    step = x.ndim == 2
    q, _ = linear_forward(x[:, None] if step else x, w.wq, w.bq)  # (B, Tq, H*Dh)
    o, _ = sdpa_forward(split_heads(q, spec.n_heads), context.k, context.v,
                        spec.mask if context.mask is None else context.mask,
                        spec.scale)  # (B, H, Tq, Dh)
    y, _ = linear_forward(merge_heads(o), w.wo, w.bo)  # (B, Tq, D)
    return y[:, 0] if step else y


class CrossAttention(Module):
    """Cross-attention layer owning wq, wk, wv, wo (and bq, bk, bv, bo when the spec asks):
    forward(x, ctx, mask) -> (y, cache);
    backward(dy, cache) -> {"x": dx, "ctx": dctx}, Param grads added (the context's gradient
    goes back to the encoder, so both input gradients are returned, keyed like the pair's).
    spec: an AttentionSpec with rope=None and mask=Mask(causal=False); d_context: the
    context's width Dc (default d_model)."""

    def __init__(self, d_model, spec, *, rng, d_context=None, dtype=np.float32):
        H, Hkv, Dh, Dc = spec.n_heads, spec.n_kv_heads, spec.dh(d_model), d_context or d_model
        _check_spec("CrossAttention", spec)
        self.wq = Param(normal_init(rng, (d_model, H * Dh), d_model ** -0.5, dtype))
        self.wk = Param(normal_init(rng, (Dc, Hkv * Dh), Dc ** -0.5, dtype))
        self.wv = Param(normal_init(rng, (Dc, Hkv * Dh), Dc ** -0.5, dtype))
        self.wo = Param(normal_init(rng, (H * Dh, d_model), (H * Dh) ** -0.5, dtype))
        zeros = lambda n, on: Param(np.zeros(n, dtype)) if on else None  # noqa: E731
        self.bq, self.bo = zeros(H * Dh, spec.qkv_bias), zeros(d_model, spec.o_bias)
        self.bk, self.bv = zeros(Hkv * Dh, spec.qkv_bias), zeros(Hkv * Dh, spec.qkv_bias)
        self.spec = spec

    def _weights(self):
        return AttentionWeights(*(None if p is None else p.data for p in (
            self.wq, self.wk, self.wv, self.wo, self.bq, self.bk, self.bv, self.bo)))

    def forward(self, x, ctx, mask=None):
        return cross_attention_forward(x, ctx, self._weights(), spec=self.spec, mask=mask)

    def context_state(self, ctx, mask=None):
        """The decoding context of ctx (B, Tk, Dc): its keys and values (CrossContext)."""
        return cross_attention_context(ctx, self._weights(), spec=self.spec, mask=mask)

    def read(self, x, context):
        """Queries x (B, D) or (B, Tq, D) over a CrossContext -> y like x."""
        return cross_attention_read(x, context, self._weights(), spec=self.spec)

    def backward(self, dy, cache):
        grads = cross_attention_backward(dy, cache)
        self.add_grads(grads["w"]._asdict())
        return {"x": grads["x"], "ctx": grads["ctx"]}
