"""Masked scaled dot-product attention and grouped-query attention (GQA, Ainslie et al. 2023,
arXiv 2305.13245), which covers multi-head (Hkv = H) and multi-query (Hkv = 1) attention.

Math:
    S = q k^T * scale,  S[mask == False] = -inf,  P = softmax(S),  out = P v
    GQA: q = rope(x Wq), k = rope(x Wk), v = x Wv; query head h reads KV head h // G;
         y = concat_heads(sdpa(q, k, v)) Wo.
Masks are boolean (Tq, Tk), True = may attend. A fully masked row outputs zeros.
Backward: the sdpa backward, rope backward (rotation by -theta), and the KV-head sharing
backward (a sum over the G query heads of each group), each through its own pair.

Glossary: B batch, T time, Tq/Tk query/key lengths, D model width, H query heads, Hkv KV heads,
G = H / Hkv group size, Dh head dim, W window, S sink tokens.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.ops import linear_backward, linear_forward, softmax_backward, softmax_forward
from scratchllm.nn import Module, Param, normal_init
from scratchllm.rope import rope_backward, rope_forward, rope_frequencies
from scratchllm.validate import expect_float, expect_ndim, expect_shape


# ---------------------------------------------------------------------------- masks
def causal_mask(T):
    """(T, T) bool: query i may attend key j iff j <= i."""
    return np.tril(np.ones((T, T), dtype=bool))  # (T, T)


def sliding_window_mask(T, window):
    """(T, T) bool: causal, and only the last `window` keys (i - window < j <= i) (Mistral)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j <= i) & (j > i - window)  # (T, T)


def attention_sink_mask(T, window, n_sink):
    """(T, T) bool: sliding window plus the first n_sink tokens (StreamingLLM, 2309.17453)."""
    j = np.arange(T)[None, :]
    return sliding_window_mask(T, window) | ((j < n_sink) & causal_mask(T))  # (T, T)


def block_sparse_mask(T, block, global_tokens=0):
    """(T, T) bool, causal: own block and the previous block, plus the leading global tokens."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    local = (i // block - j // block) <= 1
    return (j <= i) & (local | (j < global_tokens))  # (T, T)


# ---------------------------------------------------------------------------- sdpa
class SDPACache(NamedTuple):
    q: np.ndarray  # grouped: (B, Hkv, G*Tq, Dh)
    k: np.ndarray
    v: np.ndarray
    scale: float
    softmax: tuple


def _masked_out(fn, mask, B, H, Hkv, Tq, Tk):
    """~mask, checked, as a view that broadcasts against the grouped scores (B,Hkv,G,Tq,Tk)."""
    if not isinstance(mask, np.ndarray) or mask.dtype != bool:
        raise TypeError(f"{fn}: mask must be a boolean array (True = may attend), got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    try:
        np.broadcast_shapes(mask.shape, (B, H, Tq, Tk))
    except ValueError:
        raise ValueError(f"{fn}: mask has shape {mask.shape}, expected one broadcastable to "
                         f"(B, H, Tq, Tk) = {(B, H, Tq, Tk)}") from None
    m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # (b, h, tq, tk), h in {1, H}
    heads = (Hkv, H // Hkv) if m.shape[1] == H else (1, 1)
    return ~m.reshape(m.shape[:1] + heads + m.shape[2:])  # (b, Hkv|1, G|1, tq, tk)


def sdpa_forward(q, k, v, mask=None, scale=None):
    """out = softmax(q k^T * scale, masked) v, with grouped K/V heads allowed.

    Inputs:  q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv), H a multiple of Hkv
             (query head h reads KV head h // (H/Hkv); Hkv = H is plain multi-head);
             mask bool broadcastable to (B, H, Tq, Tk) or None; scale defaults to Dh^-1/2.
    Returns: out (B, H, Tq, Dv); a fully masked query row gives zeros.
    Cache:   (q grouped as (B, Hkv, G*Tq, Dh), k, v, scale, softmax cache holding P).
    The G query heads of a group are stacked along the rows, so each KV head meets one
    (G*Tq, Dh) @ (Dh, Tk) product: no copies of K/V, and fewer, larger matmuls.
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        expect_float("sdpa", name, a)
        expect_ndim("sdpa", name, a, 4, "(B, H, T, Dh)")
    B, H, Tq, Dh = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"sdpa: k has shape {k.shape}, expected (B, Hkv, Tk, Dh) with Hkv "
                         f"dividing H = {H}")
    expect_shape("sdpa", "k", k, (B, Hkv, None, Dh), "(B, Hkv, Tk, Dh) like q")
    expect_shape("sdpa", "v", v, (B, Hkv, Tk, None), "(B, Hkv, Tk, Dv) like k")
    G = H // Hkv
    scale = Dh ** -0.5 if scale is None else scale
    qg = q.reshape(B, Hkv, G * Tq, Dh)  # (B, Hkv, G*Tq, Dh)
    s = qg @ k.swapaxes(-1, -2)  # (B, Hkv, G*Tq, Tk)
    s *= np.asarray(scale, dtype=s.dtype)
    if mask is not None:
        out_of_mask = _masked_out("sdpa", mask, B, H, Hkv, Tq, Tk)  # (b, Hkv|1, G|1, tq, tk)
        np.copyto(s.reshape(B, Hkv, G, Tq, Tk), np.asarray(-np.inf, s.dtype), where=out_of_mask)
    p, sm_cache = softmax_forward(s, axis=-1)  # (B, Hkv, G*Tq, Tk)
    out = (p @ v).reshape(B, H, Tq, v.shape[3])  # (B, H, Tq, Dv)
    return out, SDPACache(qg, k, v, scale, sm_cache)


def sdpa_backward(dout, cache):
    """Math (P = softmax(S), S = scale q k^T), per KV group with the G query heads stacked:
        dv = P^T dout,  dP = dout v^T,  dS = P * (dP - rowsum(dP * P)),
        dq = scale dS k,  dk = scale dS^T q.   Masked entries have P = 0, so dS = 0 there.
    The products over the stacked G*Tq rows sum the gradients of the G query heads that
    share a KV head (the KV-sharing backward, as repeat_kv_backward does explicitly).
    Reference: karpathy/llm.c train_gpt2.c attention_backward; Ainslie et al. 2023.
    """
    qg, k, v, scale, sm_cache = cache
    B, H, Tq, Dv = dout.shape
    p = sm_cache[0]  # (B, Hkv, G*Tq, Tk)
    dog = dout.reshape(qg.shape[:3] + (Dv,))  # (B, Hkv, G*Tq, Dv)
    dv = p.swapaxes(-1, -2) @ dog  # fwd: out = P v -> dv = P^T dout      (B, Hkv, Tk, Dv)
    dp = dog @ v.swapaxes(-1, -2)  # fwd: out = P v -> dP = dout v^T      (B, Hkv, G*Tq, Tk)
    ds = softmax_backward(dp, sm_cache)["x"]  # fwd: P = softmax(S)      (B, Hkv, G*Tq, Tk)
    ds *= np.asarray(scale, dtype=ds.dtype)  # fwd: S = scale q k^T
    dq = (ds @ k).reshape(B, H, Tq, qg.shape[3])  # (B, H, Tq, Dh)
    dk = ds.swapaxes(-1, -2) @ qg  # (B, Hkv, Tk, Dh)
    return {"q": dq, "k": dk, "v": dv}


# ---------------------------------------------------------------------------- head plumbing
def split_heads(t, n_heads):
    """(B, T, n*Dh) -> (B, n, T, Dh). Its backward is merge_heads, and vice versa."""
    B, T, HD = t.shape
    return t.reshape(B, T, n_heads, HD // n_heads).transpose(0, 2, 1, 3)  # (B, n, T, Dh)


def merge_heads(t):
    """(B, n, T, Dh) -> (B, T, n*Dh), contiguous."""
    B, n, T, Dh = t.shape
    return np.ascontiguousarray(t.transpose(0, 2, 1, 3)).reshape(B, T, n * Dh)  # (B, T, n*Dh)


def repeat_kv_forward(kv, group):
    """Share each KV head with `group` query heads: head h reads KV head h // group.

    Inputs: kv (B, Hkv, T, Dh).  Returns: (B, Hkv*group, T, Dh).  Cache: (group,).
    """
    return np.repeat(kv, group, axis=1), (group,)  # (B, H, T, Dh)


def repeat_kv_backward(dout, cache):
    """Math: KV head j fed query heads j*G .. j*G+G-1, so its gradient is their sum."""
    (group,) = cache
    B, H, T, Dh = dout.shape
    return {"kv": dout.reshape(B, H // group, group, T, Dh).sum(axis=2)}  # (B, Hkv, T, Dh)


# ---------------------------------------------------------------------------- GQA
class QKVCache(NamedTuple):
    lin_q: tuple
    lin_k: tuple
    lin_v: tuple
    rope_q: tuple  # None without RoPE
    rope_k: tuple
    n_heads: int
    n_kv_heads: int


class GQACache(NamedTuple):
    qkv: QKVCache
    rep: tuple  # repeat_kv cache in gqa_forward_ref; None when sdpa shares the heads itself
    sdpa: SDPACache
    lin_o: tuple


def _resolve_mask(mask, window, T):
    """A mask name ("causal", "sliding" with window, "none"/None) or a bool array."""
    if mask is None or (isinstance(mask, str) and mask == "none"):
        return None
    if isinstance(mask, str) and mask == "causal":
        return causal_mask(T)  # (T, T)
    if isinstance(mask, str) and mask == "sliding":
        if window is None or window < 1:
            raise ValueError(f"gqa: mask='sliding' needs window >= 1, got window={window!r}")
        return sliding_window_mask(T, window)  # (T, T)
    if isinstance(mask, np.ndarray):
        return mask
    raise ValueError(f"gqa: mask must be 'causal', 'sliding', 'none', None or a bool array, "
                     f"got {mask!r}")


def project_qkv(x, wq, wk, wv, n_heads, n_kv_heads, positions, inv_freq, rope_style,
                attention_factor):
    """q, k, v heads of x, with RoPE on q and k when inv_freq is given.

    Inputs:  x (B, T, D), wq (D, H*Dh), wk/wv (D, Hkv*Dh), positions (T,) or (B, T).
    Returns: q (B, H, T, Dh), k and v (B, Hkv, T, Dh), QKVCache.
    """
    expect_float("gqa", "x", x)
    expect_ndim("gqa", "x", x, 3, "(B, T, D)")
    B, T, D = x.shape
    if n_heads % n_kv_heads:
        raise ValueError(f"gqa: n_heads={n_heads} must be a multiple of n_kv_heads="
                         f"{n_kv_heads}")
    if wq.shape[-1] % n_heads:
        raise ValueError(f"gqa: wq has shape {wq.shape}, expected (D, H*Dh) with H={n_heads}")
    Dh = wq.shape[-1] // n_heads
    expect_shape("gqa", "wq", wq, (D, n_heads * Dh), "(D, H*Dh)")
    expect_shape("gqa", "wk", wk, (D, n_kv_heads * Dh), f"(D, Hkv*Dh) = (D, {n_kv_heads}*{Dh})")
    expect_shape("gqa", "wv", wv, (D, n_kv_heads * Dh), f"(D, Hkv*Dh) = (D, {n_kv_heads}*{Dh})")
    q, lin_q = linear_forward(x, wq)  # (B, T, H*Dh)
    k, lin_k = linear_forward(x, wk)  # (B, T, Hkv*Dh)
    v, lin_v = linear_forward(x, wv)  # (B, T, Hkv*Dh)
    q, k, v = split_heads(q, n_heads), split_heads(k, n_kv_heads), split_heads(v, n_kv_heads)
    rope_q = rope_k = None
    if inv_freq is not None:
        pos = np.arange(T) if positions is None else positions
        q, rope_q = rope_forward(q, pos, inv_freq, rope_style, attention_factor)  # (B,H,T,Dh)
        k, rope_k = rope_forward(k, pos, inv_freq, rope_style, attention_factor)  # (B,Hkv,T,Dh)
    return q, k, v, QKVCache(lin_q, lin_k, lin_v, rope_q, rope_k, n_heads, n_kv_heads)


def project_qkv_backward(dq, dk, dv, cache):
    """Reverse of project_qkv: rope backward, merge heads, the three linear backwards."""
    lin_q, lin_k, lin_v, rope_q, rope_k, _, _ = cache
    if rope_q is not None:
        dq = rope_backward(dq, rope_q)["x"]  # fwd: q = rope(q) -> rotate dq by -theta
        dk = rope_backward(dk, rope_k)["x"]  # fwd: k = rope(k)
    g_q = linear_backward(merge_heads(dq), lin_q)  # fwd: q = split_heads(x @ wq)
    g_k = linear_backward(merge_heads(dk), lin_k)  # fwd: k = split_heads(x @ wk)
    g_v = linear_backward(merge_heads(dv), lin_v)  # fwd: v = split_heads(x @ wv)
    return {"x": g_q["x"] + g_k["x"] + g_v["x"], "wq": g_q["W"], "wk": g_k["W"],
            "wv": g_v["W"]}


def gqa_forward(x, wq, wk, wv, wo, *, n_heads, n_kv_heads, positions=None, inv_freq=None,
                rope_style="half", attention_factor=1.0, mask="causal", window=None):
    """Grouped-query self-attention: y = concat_h sdpa(q_h, k_{h//G}, v_{h//G}) @ wo.

    Inputs:  x (B, T, D); wq (D, H*Dh); wk, wv (D, Hkv*Dh); wo (H*Dh, D); positions (T,) or
             (B, T) ints (default arange(T)); inv_freq (Dh/2,) or None for no RoPE; mask
             "causal" | "sliding" (with window) | "none" | bool array broadcastable to
             (B, H, T, T).
    Returns: y (B, T, D).  Cache: GQACache (qkv, sdpa and output-linear caches).
    Fast path: sdpa attends the G query heads of a group to their KV head directly.
    gqa_forward_ref is its twin that copies each KV head G times first (HF repeat_kv).
    """
    return _gqa(x, wq, wk, wv, wo, n_heads, n_kv_heads, positions, inv_freq, rope_style,
                attention_factor, mask, window, expand_kv=False)


def gqa_forward_ref(x, wq, wk, wv, wo, *, n_heads, n_kv_heads, positions=None, inv_freq=None,
                    rope_style="half", attention_factor=1.0, mask="causal", window=None):
    """gqa_forward with K/V explicitly repeated to H heads (repeat_kv), then plain MHA sdpa."""
    return _gqa(x, wq, wk, wv, wo, n_heads, n_kv_heads, positions, inv_freq, rope_style,
                attention_factor, mask, window, expand_kv=True)


def _gqa(x, wq, wk, wv, wo, n_heads, n_kv_heads, positions, inv_freq, rope_style,
         attention_factor, mask, window, expand_kv):
    q, k, v, qkv = project_qkv(x, wq, wk, wv, n_heads, n_kv_heads, positions, inv_freq,
                               rope_style, attention_factor)  # (B,H,T,Dh), (B,Hkv,T,Dh) x2
    expect_shape("gqa", "wo", wo, (wq.shape[1], x.shape[2]), "(H*Dh, D)")
    rep = None
    if expand_kv:
        k, rep = repeat_kv_forward(k, n_heads // n_kv_heads)  # (B, H, T, Dh)
        v, _ = repeat_kv_forward(v, n_heads // n_kv_heads)  # (B, H, T, Dh)
    o, sd = sdpa_forward(q, k, v, _resolve_mask(mask, window, x.shape[1]))  # (B, H, T, Dh)
    y, lin_o = linear_forward(merge_heads(o), wo)  # (B, T, D)
    return y, GQACache(qkv, rep, sd, lin_o)


def gqa_backward(dy, cache):
    """Reverse of gqa_forward (or gqa_forward_ref) through the pairs: linear, sdpa, the
    KV-sharing backward (a sum over each group: inside sdpa, or repeat_kv_backward for the
    ref), rope (rotation by -theta), linear.  Reference: Ainslie et al. 2023; HF repeat_kv."""
    qkv, rep, sd, lin_o = cache
    g_o = linear_backward(dy, lin_o)  # fwd: y = merge_heads(o) @ wo
    do = split_heads(g_o["x"], qkv.n_heads)  # (B, H, T, Dh)
    g_sd = sdpa_backward(do, sd)  # fwd: o = sdpa(q, k, v)
    dk, dv = g_sd["k"], g_sd["v"]  # (B, Hkv, T, Dh), or (B, H, T, Dh) for the ref
    if rep is not None:
        dk = repeat_kv_backward(dk, rep)["kv"]  # fwd: k = repeat(k) -> sum over the group
        dv = repeat_kv_backward(dv, rep)["kv"]  # (B, Hkv, T, Dh)
    grads = project_qkv_backward(g_sd["q"], dk, dv, qkv)
    grads["wo"] = g_o["W"]
    return grads


# ---------------------------------------------------------------------------- module
class Attention(Module):
    """GQA self-attention layer owning wq, wk, wv, wo; calls gqa_forward / gqa_backward.

    RoPE frequencies come from rope_frequencies(head_dim, rope_base, rope_scaling), recomputed
    per call (cheap) so that "dynamic" scaling sees the current length. use_rope=False: none.
    A window (mask "sliding") with n_sink > 0 also keeps the first n_sink tokens (sinks).
    """

    def __init__(self, d_model, n_heads, n_kv_heads, *, rng, head_dim=None, use_rope=True,
                 rope_base=10000.0, rope_scaling=None, rope_style="half", mask="causal",
                 window=None, n_sink=0, dtype=np.float32):
        Dh = head_dim or d_model // n_heads
        self.wq = Param(normal_init(rng, (d_model, n_heads * Dh), d_model ** -0.5, dtype))
        self.wk = Param(normal_init(rng, (d_model, n_kv_heads * Dh), d_model ** -0.5, dtype))
        self.wv = Param(normal_init(rng, (d_model, n_kv_heads * Dh), d_model ** -0.5, dtype))
        self.wo = Param(normal_init(rng, (n_heads * Dh, d_model), (n_heads * Dh) ** -0.5, dtype))
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, Dh
        self.use_rope, self.rope_base, self.rope_scaling = use_rope, rope_base, rope_scaling
        self.rope_style, self.mask, self.window, self.n_sink = rope_style, mask, window, n_sink

    def _rope_kwargs(self, seq_len):
        if not self.use_rope:
            return {}
        inv_freq, af = rope_frequencies(self.head_dim, self.rope_base, self.rope_scaling,
                                        seq_len)
        return {"inv_freq": inv_freq, "attention_factor": af, "rope_style": self.rope_style}

    def _weights(self):
        return self.wq.data, self.wk.data, self.wv.data, self.wo.data

    def forward(self, x, positions=None):
        T = x.shape[1]
        pos = np.arange(T) if positions is None else positions
        mask = attention_sink_mask(T, self.window, self.n_sink) if self.n_sink else self.mask
        return gqa_forward(x, *self._weights(), n_heads=self.n_heads,
                           n_kv_heads=self.n_kv_heads, positions=pos, mask=mask,
                           window=self.window, **self._rope_kwargs(int(np.max(pos)) + 1))

    def backward(self, dy, cache):
        g = gqa_backward(dy, cache)
        for name in ("wq", "wk", "wv", "wo"):
            getattr(self, name).grad += g[name]
        return g["x"]

    def new_cache(self, batch, max_len):
        """The decoding state: a KVCache, or a RollingKVCache(window, n_sink) for a window."""
        from scratchllm.kv_cache import KVCache, RollingKVCache  # kv_cache imports this module
        dt = self.wq.data.dtype
        if self.window is None:
            return KVCache(batch, self.n_kv_heads, self.head_dim, max_len, dt)
        return RollingKVCache(self.window, self.n_sink, batch, self.n_kv_heads, self.head_dim,
                              dt)

    def decode(self, x_t, cache, position):
        """One token (B, D) -> (B, D) with a KVCache / RollingKVCache (see kv_cache.py)."""
        from scratchllm.kv_cache import gqa_decode  # kv_cache imports this module
        return gqa_decode(x_t, *self._weights(), cache, position, n_heads=self.n_heads,
                          n_kv_heads=self.n_kv_heads, **self._rope_kwargs(position + 1))
