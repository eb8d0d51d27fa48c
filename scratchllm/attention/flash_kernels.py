"""Flash attention's per-tile elementwise work, one Numba loop per tile (the fused twin's:
attention/flash_lanes.py calls them between its BLAS products; flash.py's NumPy lines are the
readable twin they equal). Each works in place on one head's (R, bk) tile of scores, R = G*bq
grouped query rows, float32 or float64:

    online_block_(s, m, l, acc, ...)   forward: s = scale s, masked to -inf; m' = max(m, rowmax s);
                                       s = exp(s - m'); l = e^(m - m') l + rowsum s;
                                       acc = e^(m - m') acc; m = m'      (acc += s v is BLAS's)
    probs_block_(s, L, ...)            backward: s = exp(scale s - L), masked entries 0
    softmax_grad_(dp, p, d, c)         backward: dp = c p (dp - d)       dS = P (dP - D), scaled

The mask is made from positions inside the loop, as flash._block_keep makes it: row r is query
i = i0 + r mod bq at position pos = i + offset; key j = j0 + c is kept when j <= pos (causal),
and j > pos - W or j < n_sink (window W, n_sink sinks). So a row keeps the columns
[lo, hi) and [0, sh), from _kept; a row with none left gets all -inf (forward) or 0.
exp is exp_lanes (core/exp32.py: vectorised float32 exp, ~1 ulp, an argument below -87
gives 0; float64 keeps np.exp). The row max and row sum are reductions that LLVM vectorises
only when it may reorder them (fastmath reassoc; no NaN arises from finite inputs).

Glossary: R = G * bq grouped rows of one KV head, bk key block size, Dv value head dim, W window.
"""
import numpy as np
from numba import njit

from scratchllm.core.exp32 import exp_lanes

_FAST = {"nnan", "nsz", "reassoc"}  # reorder the row max and sum (vector lanes), no NaN


@njit(cache=True, nogil=True)
def _kept(pos, j0, bk, causal, window, n_sink):
    """The kept columns of a row at position pos in the key block [j0, j0 + bk): [lo, hi)
    and [0, sh) (window < 0: none; not causal: all)."""
    if not causal:
        return 0, bk, 0
    hi = min(bk, max(0, pos + 1 - j0))  # j <= pos
    lo = 0 if window < 0 else min(hi, max(0, pos - window + 1 - j0))  # j > pos - W
    sh = 0 if window < 0 else min(hi, max(0, n_sink - j0))  # j < n_sink (and j <= pos)
    return lo, hi, sh


@njit(cache=True, nogil=True, fastmath=_FAST)
def online_block_(s, m, l, acc, scale, lowest, i0, bq, j0, offset, causal, window, n_sink):
    """In place: the online softmax's step for one tile s (R, bk) of raw q k^T; m, l (R,)
    running max and sum, acc (R, Dv) the running A; scale and lowest (the most negative
    finite number) of s's dtype. Masked entries become exp(-inf) = 0."""
    R, bk = s.shape
    ninf = lowest * 2  # -inf
    for r in range(R):  # (separate loops: each alone becomes vector code)
        lo, hi, sh = _kept(i0 + r % bq + offset, j0, bk, causal, window, n_sink)
        for c in range(bk):
            s[r, c] = s[r, c] * scale if (c < sh) | ((c >= lo) & (c < hi)) else ninf
        mx = m[r]
        for c in range(bk):
            mx = max(mx, s[r, c])
        ref = max(mx, lowest)  # finite: no -inf - -inf for a row with no key yet
        alpha = np.exp(m[r] - ref)  # rescales the earlier blocks (once per row: libm)
        tot = 0 * scale
        for c in range(bk):
            e = exp_lanes(s[r, c] - ref)
            s[r, c] = e
            tot += e
        l[r] = alpha * l[r] + tot
        for d in range(acc.shape[1]):
            acc[r, d] *= alpha
        m[r] = mx


@njit(cache=True, nogil=True, fastmath=_FAST)
def probs_block_(s, L, scale, i0, bq, j0, offset, causal, window, n_sink):
    """In place: s (R, bk) raw q k^T -> P = exp(scale s - L), masked entries 0; L (R,) the
    rows' logsumexp (+inf for a row that sees no key)."""
    R, bk = s.shape
    zero = 0 * scale
    for r in range(R):
        lo, hi, sh = _kept(i0 + r % bq + offset, j0, bk, causal, window, n_sink)
        Lr = L[r]
        for c in range(bk):
            e = exp_lanes(s[r, c] * scale - Lr)
            s[r, c] = e if (c < sh) | ((c >= lo) & (c < hi)) else zero


@njit(cache=True, nogil=True)
def _softmax_grad_rows(dp, p, d, c):
    rows, bk = dp.shape
    for r in range(rows):
        dr = d[r]
        for j in range(bk):
            dp[r, j] = c * p[r, j] * (dp[r, j] - dr)


def softmax_grad_(dp, p, d, c):
    """In place: dp (..., bk) C-contiguous (like p) -> c p (dp - d), d (..., 1) or (...,);
    returns dp."""
    _softmax_grad_rows(dp.reshape(-1, dp.shape[-1]), p.reshape(-1, p.shape[-1]),
                       np.ascontiguousarray(d, dp.dtype).reshape(-1), dp.dtype.type(c))
    return dp
