"""The reductions of the fused kernels (core/fused.py, attention/sdpa_softmax.py) written so
that LLVM vectorises them: float64 sums and dot products of float32 rows, and a row's max.

    acc = 0.0
    for j in range(n): acc += float64(a[j]) * b[j]      # one chain of dependent adds

runs one add per ~4 cycles (each waits for the last), whatever the SIMD width. With
fastmath={"reassoc"} (this function only: no other fast-math license, so NaN and inf
behave as IEEE says) LLVM may reorder the additions: it keeps several partial sums in
the lanes of a vector register and adds them at the end. The same float64 terms, summed in
another fixed order: a 128-long row of float32 products went 54 -> 15 us per 512 rows
(3.5x, AVX-512 here). The order depends on the compiled code (SIMD width), not on the data
or the thread: results stay deterministic on a machine, and differ from the sequential sum
by float64 round-off (~1e-16 relative), far below float32's resolution.
A max has no order to change, but `m = max(m, x[j])` also runs as one chain (a compare and a
select each step) that LLVM does not vectorise: `max_lanes` keeps 8 running maxima (the
chains overlap) and returns exactly the row's max. A NaN is left to the caller's next pass
(exp(NaN - m) is NaN).

Reference: llvm/llvm-project llvm/docs/LangRef.rst ("Fast-Math Flags": reassoc);
numba/numba docs/source/user/performance-tips.rst (fastmath).
"""
import numpy as np
from numba import njit


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def sum64(x):
    """sum_j x[j] of a 1-D array, accumulated in float64 (lanes: module docstring)."""
    acc = 0.0
    for j in range(x.shape[0]):
        acc += np.float64(x[j])
    return acc


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def dot64_exact(a, b):
    """sum_j float64(a[j]) float64(b[j]): the products in float64 (exact for float32
    inputs), accumulated in float64 (lanes)."""
    acc = 0.0
    for j in range(a.shape[0]):
        acc += np.float64(a[j]) * np.float64(b[j])
    return acc


@njit(cache=True, nogil=True)
def max_lanes(x, lowest):
    """max_j x[j] of a 1-D array, `lowest` for an empty one; NaN entries are skipped (the
    caller's exp pass turns them into NaN). Give `lowest` in x's dtype (-inf as np.float32
    for float32 rows): the result takes its type, and a float64 max would turn the caller's
    float32 exp_lanes into the scalar float64 exp."""
    n = x.shape[0]
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = lowest
    j = 0
    while j + 8 <= n:  # 8 independent chains
        m0 = x[j] if x[j] > m0 else m0
        m1 = x[j + 1] if x[j + 1] > m1 else m1
        m2 = x[j + 2] if x[j + 2] > m2 else m2
        m3 = x[j + 3] if x[j + 3] > m3 else m3
        m4 = x[j + 4] if x[j + 4] > m4 else m4
        m5 = x[j + 5] if x[j + 5] > m5 else m5
        m6 = x[j + 6] if x[j + 6] > m6 else m6
        m7 = x[j + 7] if x[j + 7] > m7 else m7
        j += 8
    while j < n:
        m0 = x[j] if x[j] > m0 else m0
        j += 1
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    m4 = m5 if m5 > m4 else m4
    m6 = m7 if m7 > m6 else m6
    m0 = m2 if m2 > m0 else m0
    m4 = m6 if m6 > m4 else m4
    return m4 if m4 > m0 else m0
