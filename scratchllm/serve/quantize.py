"""Round-to-nearest quantisation of an array over groups of its last axis, with one scale per
group: what a quantised KV cache (one group per token per head: the head dim) and group-wise
weight quantisation store.

    int8   q = clip(round(x / s), -127, 127),  s = max|x_group| / 127     |x - s q| <= s / 2
    fp8    q = e4m3(x / s),                    s = max|x_group| / 448     (e4m3: 4 exponent
           bits, 3 mantissa bits, largest finite 448, no infinities; the cast rounds to
           nearest even, as ml_dtypes.float8_e4m3fn does)
                                               |x - s q| <= 2^-4 |x| + 2^-10 s
           (a relative half-step of 3 mantissa bits; 2^-10 s below the smallest normal 2^-6)
    int4   q = clip(round(x / s), -8, 7),      s = max|x_group| / 7        |x - s q| <= s / 2
           stored two per byte: (q + 8) of the even element in the low nibble, of the odd
           element in the high one
A group whose entries are all zero gets s = 1 (q = 0). Scales are float32; dequantize()
returns the input's dtype.
Reference: arXiv 2209.05433 (the FP8 formats); arXiv 2402.02750 (KV caches quantised per
token and per channel).

Glossary: G groups per row, g group size, n the last axis.
"""
from typing import NamedTuple

import ml_dtypes
import numpy as np

from scratchllm.core.validate import expect_float, expect_integer

FORMATS = ("int8", "fp8", "int4")
_QMAX = {"int8": 127.0, "fp8": 448.0, "int4": 7.0}  # the largest code magnitude
E4M3 = ml_dtypes.float8_e4m3fn


class Quantized(NamedTuple):
    """A quantised array: codes (int8; float8_e4m3fn; uint8 holding two int4 codes) of shape
    (..., n) (int4: (..., n / 2)), scales (..., G) float32, over groups of group_size along the
    last axis of the original shape; dtype the original's."""
    codes: np.ndarray
    scales: np.ndarray
    fmt: str
    group_size: int
    dtype: np.dtype

    def dequantize(self):
        """The array s * q, (..., n) in the original dtype."""
        return dequantize_codes(self.codes, self.scales, self.fmt, self.group_size, self.dtype)

    @property
    def nbytes(self):
        """Bytes held: the codes plus the float32 scales."""
        return self.codes.nbytes + self.scales.nbytes


def default_group_size(fmt, n):
    """The group when none is given: the whole last axis for int8 and fp8 (per-row or, for a
    (B, Hkv, T, Dh) KV slice, per token per head); 32 for int4 when it divides n, else n."""
    if fmt == "int4" and n % 32 == 0:
        return 32
    return n


def quantize(x, fmt, *, group_size=None):
    """Quantise x (..., n) over groups of `group_size` entries of its last axis.

    Inputs:  x a float array (..., n); fmt "int8", "fp8" or "int4"; group_size dividing n
             (int4: even), default default_group_size(fmt, n).
    Returns: a Quantized; .dequantize() gives the array back within the format's bound.
    """
    expect_float("quantize", "x", x, min_ndim=1)
    if fmt not in FORMATS:
        raise ValueError(f"quantize: fmt must be one of {FORMATS}, got {fmt!r}")
    n = x.shape[-1]
    g = default_group_size(fmt, n) if group_size is None else group_size
    expect_integer("quantize", "group_size", g, 1)
    if n % g or (fmt == "int4" and g % 2):
        raise ValueError(f"quantize: group_size={g} must divide the last axis ({n})"
                         + (" and be even (two int4 codes per byte)" if fmt == "int4" else ""))
    xg = x.reshape(x.shape[:-1] + (n // g, g))  # (..., G, g)
    amax = np.abs(xg).max(axis=-1)  # (..., G)
    scales = np.where(amax > 0, amax / _QMAX[fmt], 1.0).astype(np.float32)  # (..., G)
    y = xg / scales[..., None]  # (..., G, g) in the model's dtype
    if fmt == "fp8":
        codes = y.astype(E4M3)  # (..., G, g) round to nearest even
    elif fmt == "int8":
        codes = np.clip(np.rint(y), -127, 127).astype(np.int8)
    else:
        q = (np.clip(np.rint(y), -8, 7) + 8).astype(np.uint8)  # (..., G, g) in 0..15
        codes = q[..., 0::2] | (q[..., 1::2] << 4)  # (..., G, g/2) low nibble = even entry
    codes = codes.reshape(x.shape[:-1] + (-1,))  # (..., n) or (..., n/2)
    return Quantized(codes, scales, fmt, g, x.dtype)


def e4m3_to_float16(codes):
    """e4m3 codes -> their values as float16, by moving bits: an e4m3 byte s eeee mmm placed
    as float16 s 0eeee mmm0000000 reads 2^(e-15) (1 + m/8) (subnormals 2^-14 m/8), which is
    the e4m3 value 2^(e-7) (1 + m/8) (2^-6 m/8) times 2^-8; the caller scales by 2^8 (exact).
    Exact for every finite code (the two NaN bytes read as +-480/256; quantize never makes
    them), and faster than ml_dtypes' element-wise cast."""
    c = codes.view(np.uint8).astype(np.uint16)  # (..., n)
    return (((c & 0x80) << 8) | ((c & 0x7F) << 7)).view(np.float16)  # (..., n)


def dequantize_codes(codes, scales, fmt, group_size, dtype):
    """s * q from the stored arrays (any leading shape): codes (..., n or n/2), scales (..., G)
    -> (..., n) in `dtype`."""
    if fmt == "int4":
        lo = (codes & 0x0F).view(np.int8) - 8  # (..., n/2) the even entries
        hi = (codes >> 4).view(np.int8) - 8  # (..., n/2) the odd entries
        q = np.stack([lo, hi], axis=-1).reshape(codes.shape[:-1] + (-1,))  # (..., n)
    elif fmt == "fp8":
        q = e4m3_to_float16(codes)  # (..., n) the values times 2^-8
        scales = scales * np.float32(256.0)  # (..., G) undo the 2^-8
    else:
        q = codes
    G = scales.shape[-1]
    qg = q.reshape(q.shape[:-1] + (G, group_size)).astype(dtype)  # (..., G, g)
    return (qg * scales[..., None].astype(dtype)).reshape(q.shape)  # (..., n)


def error_bound(x, quantized):
    """The elementwise bound |x - dequantize()| may reach for this format, (..., n)."""
    s = np.repeat(quantized.scales.astype(np.float64), quantized.group_size, axis=-1)  # (..., n)
    if quantized.fmt == "fp8":
        return 2.0 ** -4 * np.abs(x) + 2.0 ** -10 * s
    return s / 2
