"""exp that LLVM can vectorise inside Numba loops (used by the selective scan's kernels).

Numba lowers np.exp to a libm call, which stops the loop vectoriser (no SVML here). For
float32, `exp_lanes` is instead written in plain arithmetic (Cephes expf, as in
sse_mathfun), so a loop over 16 channels becomes AVX-512 code:
    v = k ln2 + r,  k = floor(v log2(e) + 1/2),  |r| <= ln2/2   (ln2 split in two parts)
    e^r ≈ 1 + r + r² P(r)                        (P of degree 5: ~1 ulp)
    e^v = e^r · 2^(k-1) · 2                      (2^(k-1) built from its exponent bits)
    v < -87 -> 0 (instead of a denormal), v > 88.72 -> inf.
float64 (the gradient-checked path) keeps np.exp. Max relative error vs np.exp: < 1e-7
on [-87, 88.7] (tests/test_scan.py).
"""
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

f32 = np.float32


@intrinsic
def _float32_from_bits(typingctx, bits):
    """Reinterpret int32(bits) as float32, for an integer-valued float32 `bits`: fptosi then
    bitcast, inline (np.int32(...) would be a call with an error check, which stops the loop
    vectoriser)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptosi(args[0], ir.IntType(32)), ir.FloatType())
    return types.float32(types.float32), codegen


def exp_lanes(v):
    """e^v; inside @njit code, float32 gets the vectorisable version below."""
    return np.exp(v)


@overload(exp_lanes, jit_options={"cache": True}, inline="always")
def _exp_lanes_overload(v):
    if v != types.float32:
        return lambda v: np.exp(v)
    return _exp32


def _exp32(v):
    k = np.floor(v * f32(1.44269504088896341) + f32(0.5))
    r = v - k * f32(0.693359375) - k * f32(-2.12194440e-4)  # v - k ln2, in two parts
    p = f32(1.9875691500e-4)
    p = p * r + f32(1.3981999507e-3)
    p = p * r + f32(8.3334519073e-3)
    p = p * r + f32(4.1665795894e-2)
    p = p * r + f32(1.6666665459e-1)
    p = p * r + f32(5.0000001201e-1)
    p = p * r * r + r + f32(1.0)
    k = f32(-125.0) if k < f32(-125.0) else k  # (no min/max: calls stop the vectoriser)
    k = f32(128.0) if k > f32(128.0) else k
    bits = (k + f32(126.0)) * f32(8388608.0)  # (k + 126) << 23 (exact: < 2^31)
    e = p * _float32_from_bits(bits) * f32(2.0)
    if v < f32(-87.0):
        e = f32(0.0)
    if v > f32(88.72):
        e = f32(np.inf)
    return e
