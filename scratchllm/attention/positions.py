"""Absolute and relative positions besides RoPE: sinusoidal embeddings (Vaswani et al. 2017,
arXiv 1706.03762) and ALiBi's linear biases (Press et al. 2021, arXiv 2108.12409). NoPE (no
positional signal at all; causal attention still orders the tokens, Kazemnejad et al. 2023,
arXiv 2305.19466) is the absence of both, a ModelConfig switch.

Math:
    sinusoidal: PE[t, 2i] = sin(t / base^(2i/D)),  PE[t, 2i+1] = cos(t / base^(2i/D))
    ALiBi:      S[h, i, j] += -m_h |i - j|, one fixed slope m_h per head; for H a power of two
                m_h = 2^(-8 h / H), h = 1..H (the geometric sequence starting at 2^(-8/H));
                otherwise the slopes of the largest power of two n < H, then every other slope
                of the 2n sequence, until there are H (the paper's section 3 and its code).
    In a causal row -m_h (i - j) differs from the official code's m_h j by the constant m_h i,
    which softmax ignores; -|i - j| also covers bidirectional (encoder) attention.
The bias is linear in the slopes, so a learned variant's slope gradient is
dm_h = sum_{b,i,j} dbias[b, h, i, j] * (-|i - j|) (flash_sdpa_backward returns it directly).
    T5's relative bias (Raffel et al. 2019, arXiv 1910.10683, 2.1): S[h, i, j] += R[b(j - i), h],
    R (num_buckets, H) learned; the bucket b of an offset n = key - query position
    (RelativeBiasSpec: nb buckets, max_distance M):
        bidirectional: nb' = nb / 2, b = nb' [n > 0] + b'(|n|);  causal: b = b'(max(-n, 0))
        b'(m) = m for m < e = nb' / 2 (exact), else min(e + floor(log(m / e) / log(M / e)
                (nb' - e)), nb' - 1)  (log-spaced), computed in float32 as transformers does
    Its backward is a scatter-add: dR[b, h] = sum over (i, j) with bucket b of dS[h, i, j].

Glossary: T time, D model width, H heads, Tq/Tk query/key lengths.
"""
import math
from typing import NamedTuple

import numpy as np

from scratchllm.core import ops
from scratchllm.core.validate import expect_dout, expect_float, expect_positive, expect_shape


def sinusoidal_positions(T, D, base=10000.0):
    """(T, D) float64: Vaswani et al.'s fixed position embedding, added to the token embedding.

    Even columns 2i hold sin(t w_i), odd columns cos(t w_i), w_i = base^(-2i/D); D even.
    """
    expect_positive("sinusoidal_positions", "T", T)
    if not isinstance(D, int) or D < 2 or D % 2:
        raise ValueError(f"sinusoidal_positions: D must be an even integer >= 2, got {D!r}")
    w = base ** (-np.arange(0, D, 2) / D)  # (D/2,)
    angle = np.arange(T)[:, None] * w[None, :]  # (T, D/2)
    pe = np.empty((T, D))  # (T, D)
    pe[:, 0::2], pe[:, 1::2] = np.sin(angle), np.cos(angle)
    return pe


def alibi_slopes(H):
    """(H,) float64: ALiBi's head slopes, 2^(-8h/H) for H a power of two, interpolated else.

    Reference: ofirpress/attention_with_linear_biases fairseq/models/transformer.py
    get_slopes; Press et al. 2021 (arXiv 2108.12409) section 3.
    """
    if not isinstance(H, int) or H < 1:
        raise ValueError(f"alibi_slopes: H must be a positive integer, got {H!r}")
    n = 2 ** int(math.floor(math.log2(H)))  # largest power of two <= H
    ratio = 2.0 ** (-8.0 / n)
    slopes = ratio ** np.arange(1, n + 1)  # (n,)
    if n == H:
        return slopes
    return np.concatenate([slopes, alibi_slopes(2 * n)[0::2][:H - n]])  # (H,)


def alibi_bias(slopes, Tq, Tk):
    """(H, Tq, Tk): -slope_h |pos_i - j|, query i at position i + Tk - Tq (as flash_sdpa).

    Add it to the scores (sdpa_forward's bias); flash_sdpa_forward(alibi_slopes=...) builds
    the same bias block by block.
    """
    pos = np.arange(Tq)[:, None] + (Tk - Tq)  # (Tq, 1)
    dist = -np.abs(pos - np.arange(Tk)[None, :])  # (Tq, Tk)
    return np.asarray(slopes)[:, None, None] * dist  # (H, Tq, Tk)


def relative_position_buckets(Tq, Tk, *, spec, offset=0):
    """(Tq, Tk) int64: the bucket of key j for query i at position offset + i (decoding: the
    query's position in the sequence; keys at 0..Tk-1), by spec (a RelativeBiasSpec).

    Reference: huggingface/transformers src/transformers/models/t5/modeling_t5.py
    (T5Attention._relative_position_bucket, compute_bias), after Mesh TensorFlow.
    """
    expect_positive("relative_position_buckets", "Tq", Tq)
    expect_positive("relative_position_buckets", "Tk", Tk)
    n = np.arange(Tk)[None, :] - (offset + np.arange(Tq))[:, None]  # (Tq, Tk) key - query
    return relative_offset_buckets(n, spec=spec)  # (Tq, Tk)


def relative_offset_buckets(n, *, spec):
    """The buckets (int64, n's shape) of the offsets n = key position - query position (any
    shape of ints), by spec (a RelativeBiasSpec): the rule above."""
    nb, buckets = spec.num_buckets, np.zeros(np.shape(n), np.int64)  # (...)
    if spec.bidirectional:
        nb //= 2
        buckets += (n > 0) * nb
        m = np.abs(n)  # (Tq, Tk)
    else:
        m = -np.minimum(n, 0)  # (Tq, Tk)
    exact = nb // 2
    far = np.maximum(m, exact)  # (...): the log-spaced rule is used for m >= exact only
    ratio = np.log((far / exact).astype(np.float32)) / np.float32(
        math.log(spec.max_distance / exact))  # (...) float32
    large = exact + (ratio * np.float32(nb - exact)).astype(np.int64)  # truncation, as .long()
    return buckets + np.where(m < exact, m, np.minimum(large, nb - 1))  # (...)


class RelativeBiasCache(NamedTuple):
    lookup: tuple  # the table lookup's cache (core.ops.embedding)
    shape: tuple   # the bias's shape (1, H, Tq, Tk)
    dtype: object  # the table's dtype


def relative_bias_forward(table, *, spec, Tq, Tk, offset=0):
    """bias (1, H, Tq, Tk) = R[b(j - i), h] for sdpa_forward's bias, from the table R
    (num_buckets, H) of a RelativeBiasSpec; queries at offset + i, keys at j.
    Returns (bias, RelativeBiasCache)."""
    expect_float("relative_bias", "table", table)
    expect_shape("relative_bias", "table", table, (spec.num_buckets, None), "(num_buckets, H)")
    buckets = relative_position_buckets(Tq, Tk, spec=spec, offset=offset)  # (Tq, Tk)
    values, c = ops.embedding_forward(buckets, table)  # (Tq, Tk, H)
    bias = values.transpose(2, 0, 1)[None]  # (1, H, Tq, Tk)
    return bias, RelativeBiasCache(c, bias.shape, table.dtype)


def relative_bias_backward(dbias, cache):
    """Math: bias[0, h, i, j] = R[b(i, j), h], a lookup, so dR[b, h] = sum over the (i, j)
    of bucket b of dbias[0, h, i, j] (the embedding's scatter-add, on dbias moved to
    (Tq, Tk, H)). Returns {"table": dR (num_buckets, H)}."""
    expect_dout("relative_bias_backward", dbias, cache.shape, cache.dtype, name="dbias")
    g = ops.embedding_backward(dbias[0].transpose(1, 2, 0), cache.lookup)  # fwd: R[b] (Tq,Tk,H)
    return {"table": g["E"]}
