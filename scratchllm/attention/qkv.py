"""The shared projections of GQA (Ainslie et al. 2023, arXiv 2305.13245) as one pair: q, k, v
heads of x, with optional biases (Qwen2), QK-norm over each head (Qwen3: Dehghani et al. 2023,
arXiv 2302.05442) and RoPE on q and k. gqa.py attends with them; decoding projects one token.

    q = rope(qk_norm(split_heads(x Wq + bq))),  k likewise with Wk, bk,  v = split_heads(x Wv + bv)

Glossary: B batch, T time, D model width, H query heads, Hkv KV heads, Dh head dim.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.rope import rope_backward, rope_forward
from scratchllm.attention.rope_heads import (RopeHeadsCache, rope_heads_backward,
                                             rope_heads_forward)
from scratchllm.attention.sdpa import merge_heads, split_heads
from scratchllm.core.fused import use_fused
from scratchllm.core.ops import (linear_backward, linear_forward, linear_out, rmsnorm_backward,
                                 rmsnorm_forward)
from scratchllm.core.validate import expect_douts, expect_float, expect_ndim, expect_shape


# ---------------------------------------------------------------------------- projections
class QKV(NamedTuple):
    """The output of project_qkv_forward (and the shape of its backward's dout)."""
    q: np.ndarray  # (B, H, T, Dh)
    k: np.ndarray  # (B, Hkv, T, Dh)
    v: np.ndarray  # (B, Hkv, T, Dh)


class QKVCache(NamedTuple):
    lin_q: tuple
    lin_k: tuple
    lin_v: tuple
    rope_q: tuple  # None without RoPE
    rope_k: tuple
    n_heads: int
    n_kv_heads: int
    norm_q: tuple  # RMSNormCache of the QK-norm, None without it
    norm_k: tuple


def project_qkv_forward(x, wq, wk, wv, bq=None, bk=None, bv=None, q_norm=None, k_norm=None,
                        *, n_heads, n_kv_heads, positions=None, inv_freq=None,
                        rope_style="half", attention_factor=1.0, norm_eps=1e-6):
    """q, k, v heads of x, with QK-norm (when q_norm, k_norm are given) and then RoPE on q and
    k (when inv_freq is given).

    Inputs:  x (B, T, D), wq (D, H*Dh), wk/wv (D, Hkv*Dh), bq (H*Dh,), bk/bv (Hkv*Dh,) or
             None, q_norm/k_norm (Dh,) RMSNorm gains over each head vector or None (with
             eps norm_eps), positions (T,) or (B, T) ints (default arange(T)), inv_freq
             (Dh/2,) or None for no RoPE.
    Returns: QKV(q (B, H, T, Dh), k (B, Hkv, T, Dh), v (B, Hkv, T, Dh)).  Cache: QKVCache.
    Fast path (RoPE on, no QK-norm, positions (T,), unless SCRATCHLLM_READABLE): the head
    split and RoPE in one pass (rope_heads.py), the same bits as split_heads then rope.
    """
    expect_float("gqa", "x", x)
    expect_ndim("gqa", "x", x, 3, "(B, T, D)")
    B, T, D = x.shape
    if T < 1:
        raise ValueError(f"gqa: x has shape {x.shape}: no time steps (T must be >= 1)")
    if inv_freq is None and (positions is not None or rope_style != "half"
                             or attention_factor != 1.0):
        raise ValueError("gqa: positions, rope_style and attention_factor act only through "
                         "RoPE, and inv_freq is None (RoPE off); drop them or give inv_freq")
    if n_heads % n_kv_heads:
        raise ValueError(f"gqa: n_heads={n_heads} must be a multiple of n_kv_heads="
                         f"{n_kv_heads}")
    expect_ndim("gqa", "wq", wq, 2, "(D, H*Dh)")
    if wq.shape[-1] % n_heads:
        raise ValueError(f"gqa: wq has shape {wq.shape}, expected (D, H*Dh) with H={n_heads}")
    Dh = wq.shape[-1] // n_heads
    expect_shape("gqa", "wq", wq, (D, n_heads * Dh), "(D, H*Dh)")
    expect_shape("gqa", "wk", wk, (D, n_kv_heads * Dh), f"(D, Hkv*Dh) = (D, {n_kv_heads}*{Dh})")
    expect_shape("gqa", "wv", wv, (D, n_kv_heads * Dh), f"(D, Hkv*Dh) = (D, {n_kv_heads}*{Dh})")
    if (q_norm is None) != (k_norm is None):
        raise ValueError("gqa: QK-norm needs both q_norm and k_norm (or neither)")
    q, lin_q = linear_forward(x, wq, bq)  # (B, T, H*Dh)
    k, lin_k = linear_forward(x, wk, bk)  # (B, T, Hkv*Dh)
    v, lin_v = linear_forward(x, wv, bv)  # (B, T, Hkv*Dh)
    pos = np.arange(T) if positions is None else positions
    if inv_freq is not None and q_norm is None and np.ndim(pos) == 1 and use_fused():
        q, rope_q = rope_heads_forward(q, pos, inv_freq, n_heads=n_heads, style=rope_style,
                                       attention_factor=attention_factor)  # (B, H, T, Dh)
        k, rope_k = rope_heads_forward(k, pos, inv_freq, n_heads=n_kv_heads, style=rope_style,
                                       attention_factor=attention_factor)  # (B, Hkv, T, Dh)
        return QKV(q, k, split_heads(v, n_kv_heads)), QKVCache(
            lin_q, lin_k, lin_v, rope_q, rope_k, n_heads, n_kv_heads, None, None)
    q, k, v = split_heads(q, n_heads), split_heads(k, n_kv_heads), split_heads(v, n_kv_heads)
    norm_q = norm_k = None
    if q_norm is not None:
        q, norm_q = rmsnorm_forward(q, q_norm, norm_eps)  # (B, H, T, Dh)
        k, norm_k = rmsnorm_forward(k, k_norm, norm_eps)  # (B, Hkv, T, Dh)
    rope_q = rope_k = None
    if inv_freq is not None:
        q, rope_q = rope_forward(q, pos, inv_freq, rope_style, attention_factor)  # (B,H,T,Dh)
        k, rope_k = rope_forward(k, pos, inv_freq, rope_style, attention_factor)  # (B,Hkv,T,Dh)
    return QKV(q, k, v), QKVCache(lin_q, lin_k, lin_v, rope_q, rope_k, n_heads, n_kv_heads,
                                  norm_q, norm_k)


def project_qkv_backward(dout, cache):
    """Reverse of project_qkv_forward: rope backward, QK-norm backward, merge heads, the three
    linear backwards. dout is a QKV of gradients (B, H, T, Dh), (B, Hkv, T, Dh), (B, Hkv, T, Dh).
    Math: each step is its own pair (rope: rotation by -theta; QK-norm: rmsnorm_backward over
    the head axis Dh, its gain summing over B, heads and T; linear: dW = x^T dy, db = sum dy).
    Reference: Dehghani et al. 2023 (arXiv 2302.05442); huggingface/transformers
    src/transformers/models/qwen3/modeling_qwen3.py Qwen3Attention."""
    lin_q, lin_k, lin_v, rope_q, rope_k, _, _, norm_q, norm_k = cache
    H, Hkv = cache.n_heads, cache.n_kv_heads
    expect_douts("project_qkv_backward", dout, {
        "q": _heads_out(lin_q, H), "k": _heads_out(lin_k, Hkv), "v": _heads_out(lin_v, Hkv)})
    dq, dk, dv = (np.zeros(*_heads_out(c, n)) if d is None else d
                  for d, c, n in zip(dout, (lin_q, lin_k, lin_v), (H, Hkv, Hkv)))
    grads = {}
    if isinstance(rope_q, RopeHeadsCache):  # the fused path: rope and the head split in one
        dq = split_heads(rope_heads_backward(dq, rope_q)["t"], H)  # fwd: q = rope_heads(x wq)
        dk = split_heads(rope_heads_backward(dk, rope_k)["t"], Hkv)  # (B, Hkv, T, Dh) views
    elif rope_q is not None:
        dq = rope_backward(dq, rope_q)["x"]  # fwd: q = rope(q) -> rotate dq by -theta
        dk = rope_backward(dk, rope_k)["x"]  # fwd: k = rope(k)
    if norm_q is not None:
        g_nq = rmsnorm_backward(dq, norm_q)  # fwd: q = rmsnorm(q) * q_norm
        g_nk = rmsnorm_backward(dk, norm_k)  # fwd: k = rmsnorm(k) * k_norm
        dq, dk = g_nq["x"], g_nk["x"]
        grads.update(q_norm=g_nq["g"], k_norm=g_nk["g"])
    g_q = linear_backward(merge_heads(dq), lin_q)  # fwd: q = split_heads(x @ wq + bq)
    g_k = linear_backward(merge_heads(dk), lin_k)  # fwd: k = split_heads(x @ wk + bk)
    g_v = linear_backward(merge_heads(dv), lin_v)  # fwd: v = split_heads(x @ wv + bv)
    grads.update(x=g_q["x"] + g_k["x"] + g_v["x"], wq=g_q["W"], wk=g_k["W"], wv=g_v["W"])
    for name, g in (("bq", g_q), ("bk", g_k), ("bv", g_v)):
        if "b" in g:
            grads[name] = g["b"]
    return grads


def _heads_out(lin, n_heads):
    """(shape, dtype) of split_heads(linear output, n_heads): (B, n, T, Dh)."""
    (B, T, HD), dtype = linear_out(lin)
    return (B, n_heads, T, HD // n_heads), dtype
