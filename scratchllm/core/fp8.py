"""FP8 matmuls for training, as DeepSeek-V3 trains (DeepSeek-AI 2024, arXiv 2412.19437, sec.
3.3): 8-bit floating-point operands with fine-grained scales, higher-precision accumulation.

The formats (OCP FP8; values through ml_dtypes, round to nearest even):
    e4m3   4 exponent, 3 mantissa bits, largest 448     (more precision: weights, activations)
    e5m2   5 exponent, 2 mantissa bits, largest 57344   (more range: gradients)
Quantising with scales over tiles of a 2-D view (R, C) of x (the last axis is C):
    s_t  = max|x_t| / fmax                  one scale per tile t (an r x c block; 1 if all 0)
    q    = fmt(x / s_t)                     the 8-bit codes; |x / s_t| <= fmax by construction
    x^   = q * s_t                          dequantised (what the matmul reads)
tile None is per-tensor scaling (one s); DeepSeek-V3's tiles: activations 1 x 128 (per token,
per 128 channels), weights 128 x 128 blocks. Tiles at the edges may be partial.

The FP8 linear y = x @ W + b:
    forward   x^ = Q_e4m3(x; 1 x 128),  W^ = Q_e4m3(W; 128 x 128),  y = x^ @ W^ + b
              (the product accumulated in x's float dtype: the higher precision)
    dgrad     dx = Q_g(dy; 1 x 128) @ W^T                  (dy quantised along its channels)
    wgrad     dW = Q_e4m3(x^; 128 x 1)^T @ Q_g(dy; 128 x 1) (both along tokens: the wgrad's
              contraction runs over tokens, so its tiles do; DeepSeek-V3 re-quantises the
              cached activation for it, its "1 x 128 to 128 x 1" conversion)
    db        = sum over tokens of dy                      (not quantised)
Q_g is the gradient format: e5m2 by default (the common FP8 recipe's range for gradients),
e4m3 as DeepSeek-V3 does with its fine tiles. Rounding is a step function: its derivative is 0
almost everywhere and undefined at the steps, so the backward uses the straight-through
estimate dQ(x)/dx := I (Bengio et al. 2013, arXiv 1308.3432): every quantiser passes its
gradient through unchanged (the scales' dependence on max|x| included: treated as constants).
So dgrad and wgrad are the float linear's gradients evaluated at the quantised operands, with
the incoming gradient quantised: what grads' custom check compares (finite differences through
the rounding would measure the steps, 0 or huge, not this).

fp8_matmuls(spec) switches every linear_forward (core.ops) to this pair for the duration of a
`with` block (a process-wide switch, seen by the data-parallel threads; the fused Numba twins,
whose matmuls do not go through linear_forward, stand aside meanwhile); the choice travels with
each forward's cache, so a backward run later needs no switch. full_precision() exempts a block
inside it: the LM's output head and the MoE routers' logits (moe/router.py, moe/expert_choice.py),
kept in their original precision as DeepSeek-V3 keeps "the output head, MoE gating modules"
(sec. 3.3.1); embeddings, norms, attention's softmax and the loss never went through
linear_forward.

Glossary: N tokens (rows of x's 2-D view), Din, Dout the linear's widths, r x c a tile.
"""
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import common_float, expect_dout, expect_float, expect_linear

FP8_FORMATS = {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}  # fmt -> its ml_dtypes dtype
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def _fp8_dtype(fmt):
    """The ml_dtypes dtype of fmt. ml_dtypes is imported here, on the first FP8 cast, not with
    the package: its import costs about 0.6 s, which every run that never casts to FP8 (a
    first training run, the tests of other packages) would otherwise pay at startup."""
    import ml_dtypes  # lazily: only FP8 casts need it
    return getattr(ml_dtypes, FP8_FORMATS[fmt])


@dataclass(frozen=True)
class FP8Spec:
    """How an FP8 linear quantises: fmt for weights and activations, grad_fmt for the incoming
    gradient, act_tile channels per activation tile (1 x act_tile), weight_block the side of a
    weight block (weight_block x weight_block); a tile of None scales per tensor."""
    fmt: str = "e4m3"
    grad_fmt: str = "e5m2"
    act_tile: int = 128
    weight_block: int = 128

    def __post_init__(self):
        for name in ("fmt", "grad_fmt"):
            if getattr(self, name) not in FP8_FORMATS:
                raise ValueError(f"FP8Spec: {name} must be one of {sorted(FP8_FORMATS)}, got "
                                 f"{getattr(self, name)!r}")
        for name in ("act_tile", "weight_block"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise ValueError(f"FP8Spec: {name} must be a positive int or None, got {v!r}")


class FP8Tensor(NamedTuple):
    """Codes (R, C) in an 8-bit float dtype, one float32 scale per tile (R/r, C/c) (ceil), the
    tile (r, c) and the array's shape and dtype before its 2-D view."""
    codes: np.ndarray
    scales: np.ndarray
    tile: tuple
    shape: tuple
    dtype: np.dtype


def _tile_of(tile, R, C):
    """(r, c) of a tile argument: None -> the whole (R, C) view."""
    if tile is None:
        return max(R, 1), max(C, 1)
    r, c = tile
    if not (isinstance(r, (int, np.integer)) and isinstance(c, (int, np.integer))
            and r >= 1 and c >= 1):
        raise ValueError(f"fp8_quantize: tile must be (r, c) positive ints or None, got {tile!r}")
    return int(r), int(c)


def _tiles_view(a, r, c):
    """(R, C) -> zero-padded (R/r, r, C/c, c) blocks (ceil)."""
    R, C = a.shape
    pr, pc = -R % r, -C % c
    if pr or pc:
        a = np.pad(a, ((0, pr), (0, pc)))
    return a.reshape((R + pr) // r, r, (C + pc) // c, c)


def fp8_quantize(x, fmt="e4m3", tile=None):
    """x (..., C) float, viewed as (R, C) -> FP8Tensor: codes fmt(x / s), s = max|x_tile| / fmax
    per tile (r, c) of that view (tile None: one scale)."""
    expect_float("fp8_quantize", "x", x)
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fp8_quantize: fmt must be one of {sorted(FP8_FORMATS)}, got {fmt!r}")
    a = np.asarray(x).reshape(-1, x.shape[-1] if x.ndim else 1)  # (R, C)
    r, c = _tile_of(tile, *a.shape)
    blocks = _tiles_view(a, r, c)  # (R/r, r, C/c, c)
    amax = np.abs(blocks).max(axis=(1, 3)).astype(np.float32)  # (R/r, C/c)
    scales = np.where(amax > 0, amax / np.float32(FP8_MAX[fmt]), np.float32(1))  # (R/r, C/c)
    full = np.repeat(np.repeat(scales, r, axis=0), c, axis=1)[:a.shape[0], :a.shape[1]]
    ratio = np.clip(a / full, -FP8_MAX[fmt], FP8_MAX[fmt])  # (R, C) |.| <= fmax
    return FP8Tensor(ratio.astype(_fp8_dtype(fmt)), scales, (r, c), x.shape, x.dtype)


def fp8_dequantize(q):
    """FP8Tensor -> x^ = codes * s per tile, in the original shape and dtype."""
    r, c = q.tile
    R, C = q.codes.shape
    full = np.repeat(np.repeat(q.scales, r, axis=0), c, axis=1)[:R, :C]  # (R, C)
    return (q.codes.astype(q.dtype) * full.astype(q.dtype)).reshape(q.shape)


def fp8_round(x, fmt="e4m3", tile=None):
    """x^ = dequantize(quantize(x)): x rounded to fmt on its tiles' scales (same shape)."""
    return fp8_dequantize(fp8_quantize(x, fmt, tile))


def fp8_cast_forward(x, *, fmt="e4m3", tile=None):
    """The quantiser as a pair: x -> (x^ = fp8_round(x, fmt, tile), cache)."""
    expect_float("fp8_cast", "x", x)
    return fp8_round(x, fmt, tile), (x.shape, x.dtype)


def fp8_cast_backward(dx_hat, cache):
    """Straight-through: dx = dx^ (dQ/dx := I; the rounding's true derivative is 0 a.e.)."""
    expect_dout("fp8_cast_backward", dx_hat, *cache, name="dx_hat")
    return {"x": dx_hat}  # fwd: x^ = Q(x), taken as x^ = x for the gradient


class FP8LinearCache(NamedTuple):
    x: np.ndarray   # x^ (..., Din): the quantised activation the forward read
    W: np.ndarray   # W^ (Din, Dout): the quantised weight
    has_bias: bool
    spec: FP8Spec


def fp8_linear_forward(x, W, b=None, *, spec=FP8Spec()):
    """y = Q(x) @ Q(W) + b (module docstring), accumulated in x's float dtype.

    Inputs:  x (..., Din), W (Din, Dout), b (Dout,) or None; spec an FP8Spec.
    Returns: y (..., Dout).  Cache: FP8LinearCache(x^, W^, has_bias, spec).
    """
    x, W, b = common_float(x, W, b)
    expect_float("fp8_linear", "x", x, 1)
    expect_float("fp8_linear", "W", W)
    expect_linear("fp8_linear", x.shape[-1], W, b)
    a = spec.act_tile
    x_hat = fp8_round(x, spec.fmt, None if a is None else (1, a))  # (..., Din) 1 x 128 tiles
    w = spec.weight_block
    W_hat = fp8_round(W, spec.fmt, None if w is None else (w, w))  # (Din, Dout) 128 blocks
    y = x_hat @ W_hat  # (..., Dout)
    if b is not None:
        y = y + b
    return y, FP8LinearCache(x_hat, W_hat, b is not None, spec)


def fp8_linear_backward(dy, cache):
    """Math (module docstring; straight-through at every quantiser):
        dx = Q_g(dy; 1 x a) @ W^T                       dgrad
        dW = Q(x^; a x 1)^T @ Q_g(dy; a x 1)            wgrad, tiles along tokens
        db = sum over tokens of dy
    """
    x_hat, W_hat, has_bias, spec = cache
    Din, Dout = W_hat.shape
    expect_dout("fp8_linear_backward", dy, x_hat.shape[:-1] + (Dout,),
                np.result_type(x_hat, W_hat), name="dy")
    a = spec.act_tile
    dy_d = fp8_round(dy, spec.grad_fmt, None if a is None else (1, a))  # (..., Dout)
    dx = dy_d @ W_hat.T  # (..., Din)   fwd: y = x^ @ W^, x^ = Q(x) (straight through)
    rows = None if a is None else (a, 1)
    x_w = fp8_round(x_hat.reshape(-1, Din), spec.fmt, rows)  # (N, Din) tiles along tokens
    dy_w = fp8_round(dy.reshape(-1, Dout), spec.grad_fmt, rows)  # (N, Dout)
    dW = x_w.T @ dy_w  # (Din, Dout)   fwd: y = x^ @ W^, W^ = Q(W) (straight through)
    grads = {"x": dx, "W": dW}
    if has_bias:
        grads["b"] = dy.reshape(-1, Dout).sum(axis=0)  # (Dout,)   fwd: y = ... + b
    return grads


_ACTIVE = []  # the FP8Spec of the innermost fp8_matmuls block, if any


@contextmanager
def fp8_matmuls(spec=FP8Spec()):
    """Inside the block every core.ops.linear_forward is fp8_linear_forward with spec (and
    core.twins.use_fused() is False, so the fused twins' own matmuls stand aside)."""
    if not isinstance(spec, FP8Spec):
        raise TypeError(f"fp8_matmuls: spec must be an FP8Spec, got {type(spec).__name__}")
    _ACTIVE.append(spec)
    try:
        yield spec
    finally:
        _ACTIVE.pop()


@contextmanager
def full_precision():
    """Inside fp8_matmuls, a block whose matmuls stay in the float dtype (the output head, as
    DeepSeek-V3 keeps it); outside, nothing changes."""
    _ACTIVE.append(None)
    try:
        yield
    finally:
        _ACTIVE.pop()


def fp8_active():
    """The FP8Spec in force (inside fp8_matmuls), else None."""
    return _ACTIVE[-1] if _ACTIVE else None
