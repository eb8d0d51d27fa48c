"""One BLAS gemm that accumulates into an existing array: out += a @ b with beta = 1.

A backward that adds a product into a Param's gradient (dW = x^T dy, a tied head's
dE = dlogits^T h) would otherwise form the product in a fresh array and add it after: a pass
over out's M*N numbers, and fresh pages to fault in (113 MB for a 49,152-word tied head).
BLAS's gemm computes C = alpha op(A) op(B) + beta C in place; NumPy's matmul has no beta, so
this calls scipy.linalg.blas's sgemm / dgemm. BLAS is column-major: a C-contiguous out (M, N)
is out^T (N, M) to it, so the call is out^T += b^T a^T with every operand passed as a view
(a C-contiguous array is its own transpose column-major, an F-contiguous one is itself with
trans = 1): no copies.

Glossary: M, N out's rows and columns, K the summed axis.
"""
import numpy as np
from scipy.linalg.blas import dgemm, sgemm

_GEMM = {np.dtype(np.float32): sgemm, np.dtype(np.float64): dgemm}


def _blas_operand(a):
    """(array, trans) such that BLAS's column-major op(array) is a^T, or None: a
    C-contiguous a is a^T read column-major (trans 0), an F-contiguous a is a itself (trans 1:
    a transposed view needs no copy)."""
    if a.flags.c_contiguous:
        return a.T, 0
    if a.flags.f_contiguous:
        return a, 1
    return None


def matmul_add(out, a, b):
    """out += a @ b in place, out (M, N), a (M, K), b (K, N): one BLAS gemm with beta = 1
    accumulating straight into out (a Param's grad), instead of a temporary a @ b added
    after (a pass over M*N numbers and their fresh pages: 113 MB for a 49,152-word tied
    head). Column-major BLAS sees out^T += b^T a^T, every operand a view (no copy).
    Other dtypes or layouts take the readable `out += a @ b`. Returns out."""
    gemm = _GEMM.get(out.dtype)
    ops_a, ops_b = _blas_operand(b), _blas_operand(a)  # BLAS's A = b^T, B = a^T
    if (gemm is None or a.dtype != out.dtype or b.dtype != out.dtype or not out.size
            or not a.shape[1] or not out.flags.c_contiguous or ops_a is None or ops_b is None):
        out += a @ b  # (M, N)
        return out
    res = gemm(1.0, ops_a[0], ops_b[0], beta=1.0, c=out.T, trans_a=ops_a[1],
               trans_b=ops_b[1], overwrite_c=1)  # out^T (N, M) in place
    if not np.shares_memory(res, out):  # BLAS wrapper copied (not expected): write it back
        out[...] = res.T
    return out
