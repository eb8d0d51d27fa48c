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
from scratchllm.nn import Module, Param, _init
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
    """(T, T) bool: sliding window plus the first n_sink tokens (StreamingLLM, arXiv 2309.17453)."""
    j = np.arange(T)[None, :]
    return sliding_window_mask(T, window) | ((j < n_sink) & causal_mask(T))  # (T, T)


def block_sparse_mask(T, block, global_tokens=0):
    """(T, T) bool, causal: own block and the previous block, plus the leading global tokens."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    local = (i // block - j // block) <= 1
    return (j <= i) & (local | (j < global_tokens))  # (T, T)


# ---------------------------------------------------------------------------- sdpa
class SDPACache(NamedTuple):
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scale: float
    softmax: tuple


def _check_mask(fn, mask, shape):
    if mask.dtype != bool:
        raise TypeError(f"{fn}: mask must be a boolean array (True = may attend), got "
                        f"{mask.dtype}")
    try:
        np.broadcast_shapes(mask.shape, shape)
    except ValueError:
        raise ValueError(f"{fn}: mask has shape {mask.shape}, expected one broadcastable to "
                         f"(B, H, Tq, Tk) = {shape}") from None


def sdpa_forward(q, k, v, mask=None, scale=None):
    """out = softmax(q k^T * scale, masked) v.

    Inputs:  q (B, H, Tq, Dh), k (B, H, Tk, Dh), v (B, H, Tk, Dv); mask bool broadcastable
             to (B, H, Tq, Tk) or None; scale defaults to Dh^-1/2.
    Returns: out (B, H, Tq, Dv); a fully masked query row gives zeros.
    Cache:   (q, k, v, scale, softmax cache holding P).
    """
    for name, a in (("q", q), ("k", k), ("v", v)):
        expect_float("sdpa", name, a)
        expect_ndim("sdpa", name, a, 4, "(B, H, T, Dh)")
    B, H, Tq, Dh = q.shape
    Tk = k.shape[2]
    expect_shape("sdpa", "k", k, (B, H, None, Dh), "(B, H, Tk, Dh) like q")
    expect_shape("sdpa", "v", v, (B, H, Tk, None), "(B, H, Tk, Dv) like k")
    scale = Dh ** -0.5 if scale is None else scale
    s = q @ k.swapaxes(-1, -2)  # (B, H, Tq, Tk)
    s *= np.asarray(scale, dtype=s.dtype)
    if mask is not None:
        _check_mask("sdpa", mask, (B, H, Tq, Tk))
        s = np.where(mask, s, np.asarray(-np.inf, dtype=s.dtype))  # (B, H, Tq, Tk)
    p, sm_cache = softmax_forward(s, axis=-1)  # (B, H, Tq, Tk)
    return p @ v, SDPACache(q, k, v, scale, sm_cache)  # (B, H, Tq, Dv)


def sdpa_backward(dout, cache):
    """Math (P = softmax(S), S = scale q k^T):
        dv = P^T dout,  dP = dout v^T,  dS = P * (dP - rowsum(dP * P)),
        dq = scale dS k,  dk = scale dS^T q.   Masked entries have P = 0, so dS = 0 there.
    Reference: karpathy/llm.c train_gpt2.c attention_backward.
    """
    q, k, v, scale, sm_cache = cache
    p = sm_cache[0]  # (B, H, Tq, Tk)
    dv = p.swapaxes(-1, -2) @ dout  # fwd: out = P v -> dv = P^T dout      (B, H, Tk, Dv)
    dp = dout @ v.swapaxes(-1, -2)  # fwd: out = P v -> dP = dout v^T      (B, H, Tq, Tk)
    ds = softmax_backward(dp, sm_cache)["x"]  # fwd: P = softmax(S)       (B, H, Tq, Tk)
    ds *= np.asarray(scale, dtype=ds.dtype)  # fwd: S = scale q k^T
    dq = ds @ k  # (B, H, Tq, Dh)
    dk = ds.swapaxes(-1, -2) @ q  # (B, H, Tk, Dh)
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
    rep_k: tuple
    rep_v: tuple
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
    Returns: y (B, T, D).  Cache: GQACache (qkv, repeat, sdpa and output-linear caches).
    """
    q, k, v, qkv = project_qkv(x, wq, wk, wv, n_heads, n_kv_heads, positions, inv_freq,
                               rope_style, attention_factor)
    expect_shape("gqa", "wo", wo, (wq.shape[1], x.shape[2]), "(H*Dh, D)")
    G = n_heads // n_kv_heads
    k_all, rep_k = repeat_kv_forward(k, G)  # (B, H, T, Dh)
    v_all, rep_v = repeat_kv_forward(v, G)  # (B, H, T, Dh)
    o, sd = sdpa_forward(q, k_all, v_all, _resolve_mask(mask, window, x.shape[1]))  # (B,H,T,Dh)
    y, lin_o = linear_forward(merge_heads(o), wo)  # (B, T, D)
    return y, GQACache(qkv, rep_k, rep_v, sd, lin_o)


def gqa_backward(dy, cache):
    """Reverse of gqa_forward through the pairs: linear, sdpa, repeat_kv (sum over the group),
    rope (rotation by -theta), linear.  Reference: Ainslie et al. 2023; HF repeat_kv."""
    qkv, rep_k, rep_v, sd, lin_o = cache
    g_o = linear_backward(dy, lin_o)  # fwd: y = merge_heads(o) @ wo
    do = split_heads(g_o["x"], qkv.n_heads)  # (B, H, T, Dh)
    g_sd = sdpa_backward(do, sd)  # fwd: o = sdpa(q, k_all, v_all)
    dk = repeat_kv_backward(g_sd["k"], rep_k)["kv"]  # fwd: k_all = repeat(k) -> sum group
    dv = repeat_kv_backward(g_sd["v"], rep_v)["kv"]  # (B, Hkv, T, Dh)
    grads = project_qkv_backward(g_sd["q"], dk, dv, qkv)
    grads["wo"] = g_o["W"]
    return grads


# ---------------------------------------------------------------------------- module
class Attention(Module):
    """GQA self-attention layer owning wq, wk, wv, wo; calls gqa_forward / gqa_backward.

    RoPE frequencies come from rope_frequencies(head_dim, rope_base, rope_scaling), recomputed
    per call (cheap) so that "dynamic" scaling sees the current length. use_rope=False: none.
    """

    def __init__(self, d_model, n_heads, n_kv_heads, *, rng, head_dim=None, use_rope=True,
                 rope_base=10000.0, rope_scaling=None, rope_style="half", mask="causal",
                 window=None, dtype=np.float32):
        Dh = head_dim or d_model // n_heads
        self.wq = Param(_init(rng, (d_model, n_heads * Dh), d_model ** -0.5, dtype))
        self.wk = Param(_init(rng, (d_model, n_kv_heads * Dh), d_model ** -0.5, dtype))
        self.wv = Param(_init(rng, (d_model, n_kv_heads * Dh), d_model ** -0.5, dtype))
        self.wo = Param(_init(rng, (n_heads * Dh, d_model), (n_heads * Dh) ** -0.5, dtype))
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, Dh
        self.use_rope, self.rope_base, self.rope_scaling = use_rope, rope_base, rope_scaling
        self.rope_style, self.mask, self.window = rope_style, mask, window

    def _rope_kwargs(self, seq_len):
        if not self.use_rope:
            return {}
        inv_freq, af = rope_frequencies(self.head_dim, self.rope_base, self.rope_scaling,
                                        seq_len)
        return {"inv_freq": inv_freq, "attention_factor": af, "rope_style": self.rope_style}

    def _weights(self):
        return self.wq.data, self.wk.data, self.wv.data, self.wo.data

    def forward(self, x, positions=None):
        pos = np.arange(x.shape[1]) if positions is None else positions
        return gqa_forward(x, *self._weights(), n_heads=self.n_heads,
                           n_kv_heads=self.n_kv_heads, positions=pos, mask=self.mask,
                           window=self.window, **self._rope_kwargs(int(np.max(pos)) + 1))

    def backward(self, dy, cache):
        g = gqa_backward(dy, cache)
        for name in ("wq", "wk", "wv", "wo"):
            getattr(self, name).grad += g[name]
        return g["x"]

    def decode(self, x_t, cache, position):
        """One token (B, D) -> (B, D) with a KVCache / RollingKVCache (see kv_cache.py)."""
        from scratchllm.kv_cache import gqa_decode  # kv_cache imports this module
        return gqa_decode(x_t, *self._weights(), cache, position, n_heads=self.n_heads,
                          n_kv_heads=self.n_kv_heads, **self._rope_kwargs(position + 1))
