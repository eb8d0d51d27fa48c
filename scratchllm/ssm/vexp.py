"""Explicit 16-lane float32 vectors for Numba loops that LLVM would leave scalar (the selective
scan's float32 backward), and a re-export of the vectorisable scalar exp (core/exp32.py).

Lanes16: explicit <16 x float> vectors: load16/store16 at a flat offset, + and * per lane,
splat16, fma16, floor16, fold16 (a sum of the 16 lanes in a fixed order) and exp16 (_exp32 on
16 lanes: the same bits as exp_lanes).
"""
import operator

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, models, overload, register_model

from scratchllm.core.exp32 import exp_lanes  # noqa: F401 (re-exported for the scan)


# ---------------------------------------------------------------------------- explicit lanes
# Numba disables LLVM's SLP vectoriser, so short loops over 32 channels often stay scalar.
# Lanes16 is one LLVM <16 x float> value: load16/store16 move 16 adjacent float32 of a
# C-contiguous array at a flat offset, + and * act lane by lane (a float32 scalar operand is
# broadcast). Each op is one AVX-512 instruction.
_VEC = ir.VectorType(ir.FloatType(), 16)


class Lanes16(types.Type):
    """16 float32 lanes held in one vector register."""

    def __init__(self):
        super().__init__(name="Lanes16")


lanes16 = Lanes16()


@register_model(Lanes16)
class _Lanes16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VEC)


def _lane_pointer(context, builder, arrty, arr, i):
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(data, [i]), _VEC.as_pointer())


def _is_f32_c_array(a):
    return isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C"


@intrinsic
def load16(typingctx, a, i):
    """a.flat[i:i + 16] as Lanes16 (a float32, C-contiguous; no bounds check: i + 16 <= a.size)."""
    if not _is_f32_c_array(a):
        return None

    def codegen(context, builder, signature, args):
        return builder.load(_lane_pointer(context, builder, signature.args[0], *args), align=4)
    return lanes16(a, types.intp), codegen


@intrinsic
def store16(typingctx, a, i, v):
    """a.flat[i:i + 16] = v (a float32, C-contiguous; no bounds check)."""
    if not _is_f32_c_array(a) or v != lanes16:
        return None

    def codegen(context, builder, signature, args):
        builder.store(args[2], _lane_pointer(context, builder, signature.args[0], *args[:2]),
                      align=4)
        return context.get_dummy_value()
    return types.none(a, types.intp, lanes16), codegen


@intrinsic
def splat16(typingctx, s):
    """Lanes16 with every lane = float32(s)."""
    def codegen(context, builder, signature, args):
        one = builder.insert_element(_VEC(ir.Undefined), args[0], ir.IntType(32)(0))
        return builder.shuffle_vector(one, _VEC(ir.Undefined), ir.VectorType(ir.IntType(32),
                                                                              16)([0] * 16))
    return lanes16(types.float32), codegen


def _binary(op):
    @intrinsic
    def lanes_op(typingctx, a, b):
        def codegen(context, builder, signature, args):
            return getattr(builder, op)(*args)
        return lanes16(lanes16, lanes16), codegen
    return lanes_op


_add16, _mul16 = _binary("fadd"), _binary("fmul")


def _overload_operator(operator_fn, lanes_op):
    @overload(operator_fn, jit_options={"cache": True}, inline="always")
    def _lanes_operator(a, b):
        if a == lanes16 and b == lanes16:
            return lambda a, b: lanes_op(a, b)
        if a == lanes16 and isinstance(b, types.Float):
            return lambda a, b: lanes_op(a, splat16(b))
        if isinstance(a, types.Float) and b == lanes16:
            return lambda a, b: lanes_op(splat16(a), b)
        return None


_overload_operator(operator.add, _add16)
_overload_operator(operator.mul, _mul16)


@intrinsic
def fold16(typingctx, v):
    """Σ of the 16 lanes in a fixed order: halves added lane by lane (16 -> 8 -> 4), then
    (s0 + s2) + (s1 + s3): float32 scalar."""
    if v != lanes16:
        return None

    def codegen(context, builder, signature, args):
        s, width = args[0], 16
        while width > 4:  # s[w] + s[w + width/2] for w < width/2
            width //= 2
            mask = [ir.VectorType(ir.IntType(32), width)(list(range(k, k + width)))
                    for k in (0, width)]
            s = builder.fadd(*(builder.shuffle_vector(s, s, m) for m in mask))
        lane = [builder.extract_element(s, ir.IntType(32)(k)) for k in range(4)]
        return builder.fadd(builder.fadd(lane[0], lane[2]), builder.fadd(lane[1], lane[3]))
    return types.float32(lanes16), codegen


def _llvm_lanes_call(builder, name, args):
    """llvm.<name>.v16f32 on <16 x float> args."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(_VEC, [_VEC] * len(args)), f"llvm.{name}.v16f32")
    return builder.call(fn, args)


@intrinsic
def fma16(typingctx, a, b, c):
    """a·b + c per lane, rounded once (llvm.fma)."""
    if not a == b == c == lanes16:
        return None
    return lanes16(a, b, c), lambda context, builder, sig, args: _llvm_lanes_call(
        builder, "fma", args)


@intrinsic
def floor16(typingctx, a):
    """floor per lane (llvm.floor)."""
    if a != lanes16:
        return None
    return lanes16(a), lambda context, builder, sig, args: _llvm_lanes_call(
        builder, "floor", args)


@intrinsic
def _lanes_from_bits(typingctx, bits):
    """_float32_from_bits per lane."""
    def codegen(context, builder, signature, args):
        ints = builder.fptosi(args[0], ir.VectorType(ir.IntType(32), 16))
        return builder.bitcast(ints, _VEC)
    return lanes16(lanes16), codegen


@intrinsic
def _exp16_edges(typingctx, v, e):
    """e per lane, replaced by 0 where v < -87 and by inf where v > 88.72 (as _exp32)."""
    def codegen(context, builder, signature, args):
        v, e = args
        e = builder.select(builder.fcmp_ordered("<", v, _VEC([ir.FloatType()(-87.0)] * 16)),
                           _VEC([ir.FloatType()(0.0)] * 16), e)
        return builder.select(builder.fcmp_ordered(">", v, _VEC([ir.FloatType()(88.72)] * 16)),
                              _VEC([ir.FloatType()(np.inf)] * 16), e)
    return lanes16(lanes16, lanes16), codegen


@njit(cache=True, fastmath=False, inline="always")
def exp16(v):
    """_exp32 on 16 lanes: the same operations, so the same bits as exp_lanes per lane."""
    k = floor16(fma16(v, splat16(1.44269504088896341), splat16(0.5)))
    r = fma16(k, splat16(-0.693359375), v)
    r = fma16(k, splat16(2.12194440e-4), r)
    p = splat16(1.9875691500e-4)
    for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
              5.0000001201e-1):
        p = fma16(p, r, splat16(c))
    p = fma16(p * r, r, r) + splat16(1.0)
    bits = fma16(k, splat16(8388608.0), splat16(126.0 * 8388608.0))
    return _exp16_edges(v, p * _lanes_from_bits(bits) * splat16(2.0))
