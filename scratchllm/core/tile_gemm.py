"""out = a @ b (gemm_) and out += a @ b (gemm_add_) on 2-D tiles inside a Numba kernel: one
BLAS gemm call each, nothing around it.

np.dot(a, b, out) in a kernel compiles, per layout of its operands (a transposed view `a.T`
is another layout), a function with shape checks and their error messages, a copy path for
non-contiguous operands and a gemv / dot path for a (1, k) or (k, 1) operand around its gemm
call; every kernel that calls it re-optimises that code at each call site. A kernel that
multiplies many small tiles pays seconds of compilation for it (GLA's lane kernels). gemm_
emits only the call np.dot makes in its matrix-matrix case: Numba's own wrapper numba_xxgemm
(SciPy's cython_blas sgemm / dgemm) with the same arguments, so a product has the same bits as
np.dot's (np.dot's gemv / dot path for a single row or column may round differently).

BLAS is column-major: a C-contiguous out (m, n) is out^T to it, so the call is
out^T = op(b)^T op(a)^T, b passed first; a transposed view (layout 'F') is passed as the
array it views with the transpose flag set (no copy).
The caller guarantees the shapes: a (m, k), b (k, n), out (m, n); nothing is checked at run
time. A zero size is fine (BLAS returns at once, or writes zeros when k = 0).

Glossary: m, n out's rows and columns, k the summed axis; ld a leading dimension (the length
of a row in memory).
"""
from llvmlite import ir
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.extending import intrinsic
from numba.np.linalg import check_blas_return, ensure_blas, get_blas_kind, make_constant_slot

ensure_blas()  # SciPy's cython_blas, as np.dot in a kernel needs

_CHAR, _INTP, _PTR = ir.IntType(8), ir.IntType(64), cgutils.voidptr_t
_XXGEMM = ir.FunctionType(ir.IntType(32), [  # numba_xxgemm, as numba.np.linalg declares it
    _CHAR, _CHAR, _CHAR, _INTP, _INTP, _INTP, _PTR, _PTR, _INTP, _PTR, _INTP, _PTR, _PTR, _INTP])


def _check(a, b, out):
    """Typing: 2-D arrays of one float dtype; a, b 'C' or 'F' (a transposed view), out 'C'."""
    arrays = (a, b, out)
    if not all(isinstance(x, types.Array) and x.ndim == 2 for x in arrays):
        raise TypingError(f"gemm_: a, b, out must be 2-D arrays, got {arrays}")
    if a.dtype not in (types.float32, types.float64) or b.dtype != a.dtype or out.dtype != a.dtype:
        raise TypingError(f"gemm_: a, b, out must share float32 or float64, got {arrays}")
    if a.layout not in "CF" or b.layout not in "CF" or out.layout != "C" or not out.mutable:
        raise TypingError(f"gemm_: a, b must be 'C' or 'F' and out writable 'C', got {arrays}")


def _operand(builder, ty, array):
    """(trans flag, leading dimension, data pointer) of a or b for column-major BLAS: a 'C'
    array x (r, s) is x^T to BLAS (no transpose, ld = s); an 'F' view is the transpose of the
    'C' array it views (transpose, ld = r)."""
    rows, cols = cgutils.unpack_tuple(builder, array.shape)
    ld = cols if ty.layout == "C" else rows
    one = ir.Constant(_INTP, 1)
    ld = builder.select(builder.icmp_signed("<", ld, one), one, ld)  # BLAS wants ld >= 1
    flag = ir.Constant(_CHAR, ord("n" if ty.layout == "C" else "t"))
    return flag, ld, builder.bitcast(array.data, _PTR)


def _codegen(beta):
    """The code of out = a @ b + beta out: one call of numba_xxgemm, as np.dot's (alpha 1)."""
    def codegen(context, builder, sig, args):
        x, y, z = (context.make_array(t)(context, builder, v) for t, v in zip(sig.args, args))
        m, k = cgutils.unpack_tuple(builder, x.shape)
        n = cgutils.unpack_tuple(builder, z.shape)[1]
        trans_b, ld_b, data_b = _operand(builder, sig.args[1], y)
        trans_a, ld_a, data_a = _operand(builder, sig.args[0], x)
        _, ld_out, data_out = _operand(builder, sig.args[2], z)
        dtype = sig.args[0].dtype
        alpha_, beta_ = (builder.bitcast(make_constant_slot(context, builder, dtype, v), _PTR)
                         for v in (1.0, beta))
        kind = ir.Constant(_CHAR, ord(get_blas_kind(dtype)))
        fn = cgutils.get_or_insert_function(builder.module, _XXGEMM, "numba_xxgemm")
        res = builder.call(fn, (kind, trans_b, trans_a, n, m, k, alpha_, data_b, ld_b, data_a,
                                ld_a, beta_, data_out, ld_out))
        check_blas_return(context, builder, res)
        return context.get_dummy_value()
    return codegen


@intrinsic
def gemm_(typingctx, a, b, out):
    """out (m, n) = a (m, k) @ b (k, n), overwritten (beta = 0)."""
    _check(a, b, out)
    return types.none(a, b, out), _codegen(0.0)


@intrinsic
def gemm_add_(typingctx, a, b, out):
    """out (m, n) += a (m, k) @ b (k, n) (beta = 1: BLAS adds the product's sum over k to out,
    no temporary tile and no loop to add it)."""
    _check(a, b, out)
    return types.none(a, b, out), _codegen(1.0)
