"""RoPE on a projection's output, fused with the split into heads: one Numba pass reads
t = x @ W (B, T, n*Dh) and writes the rotated heads (B, n, T, Dh), the layout sdpa wants, and
the backward writes the gradient straight back in the projection's layout. The readable twin
is split_heads then rope_forward (rope.py, sdpa.py): a transposed view, four temporaries of
half the size, and the copy into a new array.

Math (rope.py): pair i of head h at position p is rotated by the angle p * inv_freq[i],
    (y1, y2) = (x1 cos - x2 sin, x2 cos + x1 sin)   (cos, sin times the attention factor)
Backward: the rotation by -theta, (dx1, dx2) = (dy1 cos + dy2 sin, dy2 cos - dy1 sin), then
merge_heads. The same float operations per element as the readable pair: the same bits.
ROPE_HEADS (core/twins.py) picks one of the two twins per forward (the fused one unless
SCRATCHLLM_READABLE=1); its cache carries the matching backward.

Glossary: B batch, T time, n heads of the projection (H or Hkv), Dh head dim, P = Dh/2 pairs.
"""
from typing import NamedTuple

import numpy as np
from numba import njit

from scratchllm.attention.rope import check_rope, rope_angles, rope_backward, rope_forward
from scratchllm.attention.sdpa import merge_heads, split_heads
from scratchllm.core.twins import Twin
from scratchllm.core.validate import expect_dout, expect_float, expect_ndim, expect_shape


class RopeHeadsCache(NamedTuple):
    cos: np.ndarray  # (T, P)
    sin: np.ndarray
    half: bool  # style "half" (pairs i, i + P), else "interleaved" (2i, 2i + 1)
    shape: tuple  # (B, n, T, Dh) of the heads


@njit(cache=True, nogil=True)
def _rotate_into_heads(t, cos, sin, half, out):
    """out[b, h, i] = rotation of t[b, i, h] by the angles of position i."""
    B, T, n, Dh = t.shape
    P = Dh // 2
    for b in range(B):
        for h in range(n):
            for i in range(T):
                for j in range(P):
                    j1, j2 = (j, j + P) if half else (2 * j, 2 * j + 1)
                    x1, x2, c, s = t[b, i, h, j1], t[b, i, h, j2], cos[i, j], sin[i, j]
                    out[b, h, i, j1] = x1 * c - x2 * s
                    out[b, h, i, j2] = x2 * c + x1 * s


@njit(cache=True, nogil=True)
def _rotate_back_from_heads(dy, cos, sin, half, dt):
    """dt[b, i, h] = dy[b, h, i] rotated by minus the angles of position i."""
    B, n, T, Dh = dy.shape
    P = Dh // 2
    for b in range(B):
        for i in range(T):
            for h in range(n):
                for j in range(P):
                    j1, j2 = (j, j + P) if half else (2 * j, 2 * j + 1)
                    y1, y2, c, s = dy[b, h, i, j1], dy[b, h, i, j2], cos[i, j], sin[i, j]
                    dt[b, i, h, j1] = y1 * c + y2 * s
                    dt[b, i, h, j2] = y2 * c - y1 * s


def _check(t, rope, n_heads):
    """The inputs of either twin; returns (B, T, Dh)."""
    expect_float("rope_heads", "t", t)
    expect_ndim("rope_heads", "t", t, 3, "(B, T, n*Dh)")
    B, T, HD = t.shape
    if HD % n_heads or (HD // n_heads) % 2:
        raise ValueError(f"rope_heads: t.shape[-1] must be n_heads * (an even Dh), got t "
                         f"{t.shape}, n_heads={n_heads}")
    check_rope("rope_heads", rope, HD // n_heads)
    expect_shape("rope_heads", "rope.positions", rope.positions, (T,), "(T,) = t.shape[1:2]")
    return B, T, HD // n_heads


def rope_heads_forward(t, rope, n_heads):
    """rope_forward(split_heads(t, n_heads), rope) in one pass.

    Inputs:  t (B, T, n*Dh) float, a projection's output; rope a Rope (rope.py) with
             positions (T,) and inv_freq (Dh/2,); n_heads n.
    Returns: heads (B, n, T, Dh), C-contiguous.  Cache: (cos, sin (T, P), half, shape).
    """
    B, T, Dh = _check(t, rope, n_heads)
    cos, sin = rope_angles(rope, 4, t.dtype)  # (T, P)
    heads = np.empty((B, n_heads, T, Dh), t.dtype)  # (B, n, T, Dh)
    t4 = np.ascontiguousarray(t).reshape(B, T, n_heads, Dh)  # (B, T, n, Dh) view
    _rotate_into_heads(t4, cos, sin, rope.style == "half", heads)
    return heads, RopeHeadsCache(cos, sin, rope.style == "half", heads.shape)


def rope_heads_backward(dout, cache):
    """Math: fwd heads = R(theta) split_heads(t) -> dt = merge_heads(R(-theta) dheads).
    Reference: Su et al. 2021 (arXiv 2104.09864) §3.4; scratchllm/attention/rope.py."""
    expect_dout("rope_heads_backward", dout, cache.shape, cache.cos.dtype)
    B, n, T, Dh = dout.shape
    dt = np.empty((B, T, n, Dh), dout.dtype)  # (B, T, n, Dh)
    _rotate_back_from_heads(np.ascontiguousarray(dout), cache.cos, cache.sin, cache.half, dt)
    return {"t": dt.reshape(B, T, n * Dh)}  # (B, T, n*Dh)


def rope_heads_forward_ref(t, rope, n_heads):
    """The readable twin: split_heads, then rope_forward (a new contiguous array)."""
    _check(t, rope, n_heads)
    return rope_forward(split_heads(t, n_heads), rope)


def rope_heads_backward_ref(dout, cache):
    """The readable twin: rope_backward (rotation by -theta), then merge_heads."""
    expect_dout("rope_heads_backward_ref", dout, cache.shape, cache.cos.dtype)
    return {"t": merge_heads(rope_backward(dout, cache)["x"])}  # (B, T, n*Dh)


ROPE_HEADS = Twin((rope_heads_forward, rope_heads_backward),
                  (rope_heads_forward_ref, rope_heads_backward_ref))
