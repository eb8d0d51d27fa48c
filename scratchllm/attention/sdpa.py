"""Masked scaled dot-product attention with grouped K/V heads, and the head plumbing.

Math:
    S = q k^T * scale,  S[mask == False] = -inf,  P = softmax(S),  out = P v
Query head h reads KV head h // G (G = H / Hkv), so one function covers multi-head
(Hkv = H), grouped-query (GQA, Ainslie et al. 2023, arXiv 2305.13245) and multi-query
(Hkv = 1) attention. A fully masked row outputs zeros.
Backward: dv = P^T dout, dP = dout v^T, dS = softmax backward, dq = scale dS k,
dk = scale dS^T q; the G query heads of a group sum into their KV head.
Sink logits (gpt-oss, `sinks=`): each head h adds one softmax column of constant logit
sinks[h] that takes probability mass and carries no value, so a row may attend to "nothing";
P = softmax([S, sinks[h]]) with the last column dropped before P v.
Soft-capped scores (Gemma 2, `softcap=c`): S = c tanh(scale q k^T / c) before the mask and
the bias (core/softcap.py's pair; its backward multiplies dS by 1 - tanh^2).

Glossary: B batch, Tq/Tk query/key lengths, H query heads, Hkv KV heads, G = H / Hkv,
Dh head dim, Dv value head dim.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.masks import mask_array
from scratchllm.attention.sdpa_softmax import (FusedSoftmaxCache, softcap_softmax_scores_,
                                               softmax_scores_, softmax_scores_backward_)
from scratchllm.core.twins import use_fused
from scratchllm.core.ops import SoftmaxCache, softmax_backward, softmax_forward
from scratchllm.core.softcap import softcap_backward, softcap_forward
from scratchllm.core.validate import (expect_dout, expect_finite, expect_float, expect_integer,
                                      expect_ndim, expect_shape)


class SDPACache(NamedTuple):
    q: np.ndarray  # grouped: (B, Hkv, G*Tq, Dh)
    k: np.ndarray
    v: np.ndarray
    scale: float
    softmax: SoftmaxCache  # with sinks its y has Tk + 1 columns, the sink last; or a
    #                        FusedSoftmaxCache (sdpa_softmax.py: P of scale q k^T in one pass)
    bias_shape: tuple  # the additive bias's shape (ALiBi, positions.py); None: no bias
    has_sinks: bool
    n_heads: int  # H (the rows of q hold G = H / Hkv heads each)
    fused: bool  # the forward took sdpa_softmax.py's one-pass softmax: so does the backward
    softcap: tuple = None  # SoftcapCache of the capped scores (softcap=c), else None


def _masked_out(fn, mask, B, H, Hkv, Tq, Tk):
    """~mask, checked, as a view that broadcasts against the grouped scores (B,Hkv,G,Tq,Tk)."""
    if not isinstance(mask, np.ndarray) or mask.dtype != bool:
        raise TypeError(f"{fn}: mask.array must be a boolean array (True = may attend), got "
                        f"{getattr(mask, 'dtype', type(mask).__name__)}")
    try:
        np.broadcast_shapes(mask.shape, (B, H, Tq, Tk))
    except ValueError:
        raise ValueError(f"{fn}: mask.array has shape {mask.shape}, expected one broadcastable "
                         f"to (B, H, Tq, Tk) = {(B, H, Tq, Tk)}") from None
    m = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)  # (b, h, tq, tk), h in {1, H}
    heads = (Hkv, H // Hkv) if m.shape[1] == H else (1, 1)
    return ~m.reshape(m.shape[:1] + heads + m.shape[2:])  # (b, Hkv|1, G|1, tq, tk)


def check_heads(fn, q, k, v):
    """Check q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv) with Hkv dividing H;
    return (B, H, Tq, Dh, Hkv, Tk)."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        expect_float(fn, name, a)
        expect_ndim(fn, name, a, 4, "(B, H, T, Dh)")
    B, H, Tq, Dh = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    if Dh < 1:
        raise ValueError(f"{fn}: q has shape {q.shape}: a head dim Dh of 0 (each head needs at "
                         f"least one number; the default scale is Dh^-1/2)")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"{fn}: k has shape {k.shape}, expected (B, Hkv, Tk, Dh) with Hkv "
                         f"dividing H = {H}")
    expect_shape(fn, "k", k, (B, Hkv, None, Dh), "(B, Hkv, Tk, Dh) like q")
    expect_shape(fn, "v", v, (B, Hkv, Tk, None), "(B, Hkv, Tk, Dv) like k")
    return B, H, Tq, Dh, Hkv, Tk


def sdpa_forward(q, k, v, mask=None, scale=None, *, bias=None, sinks=None, softcap=None):
    """out = softmax(q k^T * scale, masked) v, with grouped K/V heads allowed.

    Inputs:  q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv), H a multiple of Hkv
             (query head h reads KV head h // (H/Hkv); Hkv = H is plain multi-head);
             mask a Mask (scratchllm.specs; masks.mask_array makes its boolean array,
             broadcastable to (B, H, Tq, Tk)) or None (attend everywhere);
             scale defaults to Dh^-1/2;
             bias float broadcastable to (B, H, Tq, Tk) added to the scores (ALiBi), or None;
             sinks (H,) or None: per-head sink logits (never masked, no value);
             softcap c or None: the scores become c tanh(scores / c) before mask and bias.
    Returns: out (B, H, Tq, Dv); a fully masked query row gives zeros.
    Cache:   (q grouped as (B, Hkv, G*Tq, Dh), k, v, scale, softmax cache holding P).
    The G query heads of a group are stacked along the rows, so each KV head meets one
    (G*Tq, Dh) @ (Dh, Tk) product: no copies of K/V, and fewer, larger matmuls.
    """
    B, H, Tq, Dh, Hkv, Tk = check_heads("sdpa", q, k, v)
    if Tq < 1 or Tk < 1:
        raise ValueError(f"sdpa: q has {Tq} and k has {Tk} positions; both need >= 1")
    keep = mask_array(mask, Tq, Tk, "sdpa")  # None, (Tq, Tk), or broadcastable to (B,H,Tq,Tk)
    G = H // Hkv
    scale = Dh ** -0.5 if scale is None else expect_finite("sdpa", "scale", scale)
    if softcap is not None:
        softcap = expect_finite("sdpa", "softcap", softcap, 0, open_low=True)
    qg = q.reshape(B, Hkv, G * Tq, Dh)  # (B, Hkv, G*Tq, Dh)
    s = qg @ k.swapaxes(-1, -2)  # (B, Hkv, G*Tq, Tk)
    if _fused_case(keep, bias, sinks, s, Tq) and use_fused():
        if softcap is None:
            p, t = softmax_scores_(s, keep, scale), None  # (B, Hkv, G*Tq, Tk), in place
        else:  # Gemma 2: P = softmax(c t), t = tanh(scale q k^T / c)  (B, Hkv, G*Tq, Tk) x2
            p, t = softcap_softmax_scores_(s, keep, scale, softcap)
        return (p @ v).reshape(B, H, Tq, v.shape[3]), SDPACache(
            qg, k, v, scale, FusedSoftmaxCache(p, t), None, False, H, True)  # (B, H, Tq, Dv)
    s *= np.asarray(scale, dtype=s.dtype)
    cap_cache = None
    if softcap is not None:  # Gemma 2: S = c tanh(scale q k^T / c)
        s, cap_cache = softcap_forward(s, cap=softcap)  # (B, Hkv, G*Tq, Tk)
    if bias is not None:  # S = scale q k^T + bias
        expect_float("sdpa", "bias", bias)
        if bias.ndim > 4 or any(n not in (1, m) for n, m in zip(bias.shape[::-1],
                                                                 (Tk, Tq, H, B))):
            raise ValueError(f"sdpa: bias has shape {bias.shape}, expected one broadcastable "
                             f"to (B, H, Tq, Tk) = {(B, H, Tq, Tk)}")
        s.reshape(B, H, Tq, Tk)[...] += bias
    if keep is not None:
        out_of_mask = _masked_out("sdpa", keep, B, H, Hkv, Tq, Tk)  # (b, Hkv|1, G|1, tq, tk)
        np.copyto(s.reshape(B, Hkv, G, Tq, Tk), np.asarray(-np.inf, s.dtype), where=out_of_mask)
    if sinks is not None:
        s = _with_sink_column(s, sinks, H, Tq)  # (B, Hkv, G*Tq, Tk+1)
    p, sm_cache = softmax_forward(s, axis=-1)  # (B, Hkv, G*Tq, Tk[+1])
    out = (p[..., :Tk] @ v).reshape(B, H, Tq, v.shape[3])  # (B, H, Tq, Dv); no sink value
    return out, SDPACache(qg, k, v, scale, sm_cache,
                          None if bias is None else bias.shape, sinks is not None, H, False,
                          cap_cache)


def sdpa_backward(dout, cache):
    """Math (P = softmax(S), S = scale q k^T), per KV group with the G query heads stacked:
        dv = P^T dout,  dP = dout v^T,  dS = P * (dP - rowsum(dP * P)),
        dq = scale dS k,  dk = scale dS^T q.   Masked entries have P = 0, so dS = 0 there.
        With a bias (S += bias): dbias = dS summed over the axes the bias was broadcast along.
    The products over the stacked G*Tq rows sum the gradients of the G query heads that
    share a KV head (the KV-sharing backward, as repeat_kv_backward does explicitly).
    Sinks: the sink column c of row r has logit sinks[h] and no value, so dP_c = 0 and the
    softmax backward gives dS_c = P_c (0 - sum_j P_j dP_j); every row of head h shares the
    logit, so dsinks[h] = -sum over (b, t) of P_c sum_j P_j dP_j.
    Reference: karpathy/llm.c train_gpt2.c attention_backward; Ainslie et al. 2023
    (arXiv 2305.13245); gpt-oss sinks: huggingface/transformers
    src/transformers/models/gpt_oss/modeling_gpt_oss.py eager_attention_forward.
    """
    qg, k, v, scale, sm_cache, bias_shape, has_sinks, H, fused, cap_cache = cache
    B, Hkv, GTq, _ = qg.shape
    Tk = k.shape[2]
    Tq, Dv = GTq * Hkv // H, v.shape[3]
    expect_dout("sdpa_backward", dout, (B, H, Tq, Dv), np.result_type(qg, k, v))
    p = sm_cache.y[..., :Tk]  # (B, Hkv, G*Tq, Tk)
    dog = dout.reshape(qg.shape[:3] + (Dv,))  # (B, Hkv, G*Tq, Dv)
    dv = p.swapaxes(-1, -2) @ dog  # fwd: out = P v -> dv = P^T dout      (B, Hkv, Tk, Dv)
    dp = dog @ v.swapaxes(-1, -2)  # fwd: out = P v -> dP = dout v^T      (B, Hkv, G*Tq, Tk)
    if fused:  # the forward's one-pass softmax: dS = scale P (dP - rowsum(dP P)), one pass
        #        (soft-capped: times 1 - t^2, t = tanh(scale q k^T / c))
        ds = softmax_scores_backward_(dp, p, scale, sm_cache.t)  # (B, Hkv, G*Tq, Tk), in place
        return {"q": (ds @ k).reshape(B, H, Tq, qg.shape[3]), "k": ds.swapaxes(-1, -2) @ qg,
                "v": dv}
    if has_sinks:  # fwd: the sink column carries no value -> its dP is 0
        dp = np.concatenate([dp, np.zeros(dp.shape[:3] + (1,), dp.dtype)], axis=-1)
    ds = softmax_backward(dp, sm_cache)["x"]  # fwd: P = softmax(S)      (B, Hkv, G*Tq, Tk[+1])
    grads = {}
    if has_sinks:  # fwd: S[..., Tk] = sinks[h] on every row of head h -> sum the rows
        grads["sinks"] = ds[..., Tk].reshape(B, H, Tq).sum(axis=(0, 2))  # (H,)
        ds = ds[..., :Tk]  # (B, Hkv, G*Tq, Tk)
    if bias_shape is not None:  # fwd: S += bias -> dbias = dS summed over its broadcast axes
        grads["bias"] = _sum_to(ds.reshape(B, H, Tq, -1), bias_shape)
    if cap_cache is not None:  # fwd: S = c tanh(S0 / c) -> dS0 = dS (1 - tanh^2)
        ds = softcap_backward(ds, cap_cache)["x"]  # (B, Hkv, G*Tq, Tk)
    ds *= np.asarray(scale, dtype=ds.dtype)  # fwd: S = scale q k^T
    dq = (ds @ k).reshape(B, H, Tq, qg.shape[3])  # (B, H, Tq, Dh)
    dk = ds.swapaxes(-1, -2) @ qg  # (B, Hkv, Tk, Dh)
    return {"q": dq, "k": dk, "v": dv, **grads}


def _fused_case(keep, bias, sinks, s, Tq):
    """The cases the fused softmax (sdpa_softmax.py) covers: float32/64 scores s (.., Tk),
    no bias, no sinks, and no mask or one (Tq, Tk) bool mask shared by all rows and heads."""
    plain = keep is None or (isinstance(keep, np.ndarray) and keep.dtype == bool
                             and keep.shape == (Tq, s.shape[-1]))
    return plain and bias is None and sinks is None and s.dtype in (np.float32, np.float64)


def _sum_to(a, shape):
    """Sum a over the axes a broadcast (of shape `shape`) was stretched along."""
    lead = a.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1)
    return a.sum(axis=axes, keepdims=True).reshape(shape)  # fwd: S += bias (broadcast)


def _with_sink_column(s, sinks, H, Tq):
    """[S, sinks[h]]: the grouped scores (B, Hkv, G*Tq, Tk) with one more column per row
    holding its head's sink logit (gpt-oss); checks sinks is a float (H,) array."""
    expect_float("sdpa", "sinks", sinks)
    expect_shape("sdpa", "sinks", sinks, (H,), "(H,): one sink logit per query head")
    B, Hkv, GT, Tk = s.shape
    col = np.broadcast_to(sinks.astype(s.dtype).reshape(1, Hkv, H // Hkv, 1, 1),
                          (B, Hkv, H // Hkv, Tq, 1)).reshape(B, Hkv, GT, 1)  # (B, Hkv, G*Tq, 1)
    return np.concatenate([s, col], axis=-1)  # (B, Hkv, G*Tq, Tk+1)


# ---------------------------------------------------------------------------- head plumbing
def split_heads(t, n_heads):
    """(B, T, n*Dh) -> (B, n, T, Dh). Its backward is merge_heads, and vice versa."""
    B, T, HD = t.shape
    return t.reshape(B, T, n_heads, HD // n_heads).transpose(0, 2, 1, 3)  # (B, n, T, Dh)


def merge_heads(t):
    """(B, n, T, Dh) -> (B, T, n*Dh), contiguous."""
    B, n, T, Dh = t.shape
    return np.ascontiguousarray(t.transpose(0, 2, 1, 3)).reshape(B, T, n * Dh)  # (B, T, n*Dh)


class RepeatKVCache(NamedTuple):
    group: int
    shape: tuple  # kv's (B, Hkv, T, Dh)
    dtype: np.dtype


def repeat_kv_forward(kv, group):
    """Share each KV head with `group` query heads: head h reads KV head h // group.

    Inputs: kv (B, Hkv, T, Dh).  Returns: (B, Hkv*group, T, Dh).  Cache: (group,).
    """
    expect_float("repeat_kv", "kv", kv, 4)
    expect_integer("repeat_kv", "group", group, 1)
    return np.repeat(kv, group, axis=1), RepeatKVCache(group, kv.shape, kv.dtype)  # (B, H, T, Dh)


def repeat_kv_backward(dout, cache):
    """Math: KV head j fed query heads j*G .. j*G+G-1, so its gradient is their sum."""
    group, (B, Hkv, T, Dh) = cache.group, cache.shape
    expect_dout("repeat_kv_backward", dout, (B, Hkv * group, T, Dh), cache.dtype)
    return {"kv": dout.reshape(B, Hkv, group, T, Dh).sum(axis=2)}  # (B, Hkv, T, Dh)
