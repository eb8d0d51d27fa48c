"""Decode attention straight from a quantised paged KV cache: one Numba pass per sequence and
KV head walks the sequence's block table, dequantises each cached key and value row as it
reads it (codes times the row's group scales) and folds it into an online softmax, so the
dequantised cache never exists as an array. The readable twin dequantises the whole cache
first (gather the blocks, s * q) and attends (what PagedCache.read and sdpa do on decode).

With one query token per sequence b (q (B, H, Dh)), keys and values of its first
lengths[b] tokens at slot (table[b, j // bs], j % bs) of the pools, KV head c = h // (H/Hkv):
    k_j = s^K_j * q^K_j  (per group of g entries),   v_j likewise
    o_bh = sum_j softmax_j(scale * q_bh . k_j) v_j
online (Milakov & Gimelshein 2018, arXiv 1805.02867): m <- max(m, x_j), l <- l e^(m_old - m)
+ e^(x_j - m), acc <- acc e^(m_old - m) + e^(x_j - m) v_j, o = acc / l. Each key row is
dequantised once for the H/Hkv query heads that read it. Codes: int8 and fp8 (e4m3) one per
byte, read through a 256-entry table of their values; int4 two per byte, (q + 8) of the even
entry in the low nibble (quantize.py). ScoreOptions may be soft-capped (c tanh(x / c), Gemma 2) and
each head may have a sink logit (a softmax column without value, gpt-oss): m and l start at
the sink's (sink, 1) instead of (-inf, 0). Inference only: the codes have no gradient, so both
twins' backwards refuse.
Reference: arXiv 2309.06180 (PagedAttention: attention reading the block table in the kernel).

Glossary: B sequences, H query heads, Hkv KV heads, Dh head dim, Dc code bytes per row (Dh, or
Dh/2 for int4), G groups per row, g group size, bs block size, nb blocks per sequence.
"""
from typing import NamedTuple

import ml_dtypes
import numpy as np
from numba import njit

from scratchllm.core.twins import Twin
from scratchllm.core.validate import expect_float, expect_int, expect_shape
from scratchllm.serve.quantize import FORMATS, dequantize_codes


def _code_values(fmt):
    """The value of each byte 0..255 as a code of `fmt` (int8: the signed byte; fp8: the e4m3
    value, NaN for its two NaN bytes, which quantize never writes; int4: unused, zeros),
    float64 (256,)."""
    byte = np.arange(256, dtype=np.uint8)
    if fmt == "int8":
        return byte.view(np.int8).astype(np.float64)
    if fmt == "fp8":
        return byte.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    return np.zeros(256)


@njit(cache=True, nogil=True)
def _attend_quantised(q, kc, ks, vc, vs, table, lengths, lut, int4, g, scale, cap, sinks,
                      out):
    """out[b, h] = softmax(scale q[b, h] . k) v over the first lengths[b] cached tokens,
    k and v dequantised row by row from codes kc, vc (n_blocks, Hkv, bs, Dc) uint8 and scales
    ks, vs (n_blocks, Hkv, bs, G); cap > 0: scores c tanh(x / c); sinks (H,) logits of a
    column without value (-inf: none)."""
    B, H, Dh = q.shape
    Hkv, bs = kc.shape[1], kc.shape[2]
    rep = H // Hkv
    k = np.empty(Dh)
    v = np.empty(Dh)
    m = np.empty(rep)
    l = np.empty(rep)
    acc = np.empty((rep, Dh))
    for b in range(B):
        for c in range(Hkv):
            for r in range(rep):  # the sink column first: e^(sink - m) with m = sink
                m[r] = sinks[c * rep + r]
                l[r] = 1.0 if sinks[c * rep + r] > -np.inf else 0.0
            acc[:] = 0.0
            for j in range(lengths[b]):
                blk, off = table[b, j // bs], j % bs
                for d in range(Dh):
                    if int4:
                        byte_k, byte_v = kc[blk, c, off, d // 2], vc[blk, c, off, d // 2]
                        sh = 4 * (d % 2)
                        ck = ((byte_k >> sh) & 15) - 8.0
                        cv = ((byte_v >> sh) & 15) - 8.0
                    else:
                        ck, cv = lut[kc[blk, c, off, d]], lut[vc[blk, c, off, d]]
                    k[d] = ck * ks[blk, c, off, d // g]
                    v[d] = cv * vs[blk, c, off, d // g]
                for r in range(rep):
                    h = c * rep + r
                    x = 0.0
                    for d in range(Dh):
                        x += q[b, h, d] * k[d]
                    x *= scale
                    if cap > 0:
                        x = cap * np.tanh(x / cap)
                    m_new = max(m[r], x)
                    decay, w = np.exp(m[r] - m_new), np.exp(x - m_new)
                    l[r] = l[r] * decay + w
                    for d in range(Dh):
                        acc[r, d] = acc[r, d] * decay + w * v[d]
                    m[r] = m_new
            for r in range(rep):
                for d in range(Dh):
                    out[b, c * rep + r, d] = acc[r, d] / l[r]


def _check(q, k_pool, v_pool, table, lengths, fmt, group_size):
    name = "quantized_paged_attention"
    expect_float(name, "q", q, min_ndim=3)
    if fmt not in FORMATS:
        raise ValueError(f"{name}: fmt must be one of {FORMATS}, got {fmt!r}")
    kc, ks = k_pool
    expect_shape(name, "v codes", v_pool[0], kc.shape, "the key codes' shape")
    expect_shape(name, "v scales", v_pool[1], ks.shape, "the key scales' shape")
    Dh = kc.shape[3] * (2 if fmt == "int4" else 1)
    if q.shape[2] != Dh or q.shape[1] % kc.shape[1] or Dh != ks.shape[3] * group_size:
        raise ValueError(f"{name}: q {q.shape} needs (B, H, Dh) with H a multiple of the "
                         f"pools' Hkv = {kc.shape[1]} and Dh = {Dh} = G * group_size "
                         f"({ks.shape[3]} * {group_size})")
    expect_int(name, "table", table)
    expect_int(name, "lengths", lengths)
    expect_shape(name, "lengths", lengths, q.shape[:1], "(B,)")
    if lengths.min() < 1 or lengths.max() > table.shape[1] * kc.shape[2]:
        raise ValueError(f"{name}: lengths must be 1 .. nb * bs = "
                         f"{table.shape[1] * kc.shape[2]}, got {lengths.tolist()}")


class ScoreOptions(NamedTuple):
    """How the scores are made: x = scale q . k, then c tanh(x / c) with softcap c (None:
    none); sinks (H,) per-head logits of a column without value (gpt-oss's), or None."""
    scale: float
    softcap: float = None
    sinks: np.ndarray = None


def quantized_paged_attention(q, k_pool, v_pool, table, lengths, *, fmt, group_size, scores):
    """The fused twin: decode attention reading the quantised pools (module docstring).

    Inputs:  q (B, H, Dh) one query per sequence; k_pool, v_pool (codes (n_blocks, Hkv, bs,
             Dc), scales (n_blocks, Hkv, bs, G) float32) as PagedCache holds a layer's keys
             and values; table (B, nb) ints, each sequence's blocks; lengths (B,) its cached
             tokens (>= 1); fmt "int8" | "fp8" | "int4"; group_size g (G g = Dh); scores a
             ScoreOptions (scale, softcap, sinks).
    Returns: (o (B, H, Dh) in q's dtype, None).
    """
    _check(q, k_pool, v_pool, table, lengths, fmt, group_size)
    out = np.empty(q.shape, np.float64)
    (kc, ks), (vc, vs) = k_pool, v_pool
    sinks = np.full(q.shape[1], -np.inf) if scores.sinks is None else \
        np.asarray(scores.sinks, np.float64)  # (H,)
    _attend_quantised(q.astype(np.float64), kc.view(np.uint8), ks, vc.view(np.uint8), vs,
                      np.asarray(table, np.int64), np.asarray(lengths, np.int64),
                      _code_values(fmt), fmt == "int4", group_size, float(scores.scale),
                      float(scores.softcap or 0.0), sinks, out)
    return out.astype(q.dtype), None


def quantized_paged_attention_ref(q, k_pool, v_pool, table, lengths, *, fmt, group_size,
                                  scores):
    """The readable twin: gather every block of the table, dequantise the whole cache, then
    attend with a length mask (quantized_paged_attention's inputs and output)."""
    _check(q, k_pool, v_pool, table, lengths, fmt, group_size)
    B, H, Dh = q.shape
    L = int(lengths.max())
    K, V = (_dequantised(codes, scales, table, L, fmt, group_size, q.dtype)
            for codes, scales in (k_pool, v_pool))  # (B, Hkv, L, Dh) each
    rep = H // K.shape[1]
    K, V = np.repeat(K, rep, axis=1), np.repeat(V, rep, axis=1)  # (B, H, L, Dh)
    s = scores.scale * np.einsum("bhd,bhld->bhl", q, K)  # (B, H, L)
    if scores.softcap is not None:
        s = scores.softcap * np.tanh(s / scores.softcap)
    s = np.where(np.arange(L) < lengths[:, None, None], s, -np.inf)
    if scores.sinks is not None:  # a last column of logit sinks[h] and no value
        s = np.concatenate([s, np.broadcast_to(np.asarray(scores.sinks, s.dtype)[:, None],
                                               (B, H, 1))], axis=-1)  # (B, H, L + 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhl,bhld->bhd", p[..., :L], V).astype(q.dtype), None  # (B, H, Dh)


def _dequantised(codes, scales, table, L, fmt, g, dtype):
    """The first L tokens of each sequence's blocks, dequantised: (B, Hkv, L, Dh)."""
    B, nb = table.shape
    c = codes[table].transpose(0, 2, 1, 3, 4)  # (B, Hkv, nb, bs, Dc)
    s = scales[table].transpose(0, 2, 1, 3, 4)  # (B, Hkv, nb, bs, G)
    shape = (B, codes.shape[1], nb * codes.shape[2])
    c, s = c.reshape(shape + c.shape[-1:])[:, :, :L], s.reshape(shape + s.shape[-1:])[:, :, :L]
    return dequantize_codes(c, s, fmt, g, dtype)


def _inference_only(dout, cache):
    raise NotImplementedError("quantized_paged_attention: inference only (the cache's codes "
                              "have no gradient)")


QUANTIZED_PAGED_ATTENTION = Twin((quantized_paged_attention, _inference_only),
                                 (quantized_paged_attention_ref, _inference_only))
