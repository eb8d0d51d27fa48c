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

from scratchllm.ops import softmax_backward, softmax_forward
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
