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

Glossary: T time, D model width, H heads, Tq/Tk query/key lengths.
"""
import math

import numpy as np

from scratchllm.core.validate import expect_positive


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
