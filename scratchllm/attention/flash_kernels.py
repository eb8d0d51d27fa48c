"""Flash attention's two elementwise passes per block, fused into one Numba loop each for
float32 (flash.py calls them; float64, the gradient-checked path, and SCRATCHLLM_READABLE use
the NumPy lines beside each call, the readable twin; flash_sdpa_forward chooses once and its
cache carries the choice to the backward):

    exp_shift_(s, ref)        s = exp(s - ref)                    forward P~ and backward P
    softmax_grad_(dp, p, d, c) dp = c * p * (dp - d)              dS = P (dP - D), scaled
The NumPy twins make a temporary and two or three passes over the (rows, bk) block; these
make one pass in place, with exp_lanes (core/exp32.py: vectorised float32 exp, ~1 ulp; an
argument below -87, e.g. -inf for a masked score, gives 0).

Glossary: rows = B * Hkv * G * bq grouped score rows, bk key block size.
"""
import numpy as np
from numba import njit

from scratchllm.core.exp32 import exp_lanes


@njit(cache=True, nogil=True)
def _exp_shift_rows(s, ref):
    rows, bk = s.shape
    for r in range(rows):
        m = ref[r]
        for j in range(bk):
            s[r, j] = exp_lanes(s[r, j] - m)


@njit(cache=True, nogil=True)
def _softmax_grad_rows(dp, p, d, c):
    rows, bk = dp.shape
    for r in range(rows):
        dr = d[r]
        for j in range(bk):
            dp[r, j] = c * p[r, j] * (dp[r, j] - dr)


def exp_shift_(s, ref):
    """In place: s (..., bk) float32 C-contiguous -> exp(s - ref), ref (..., 1); returns s."""
    _exp_shift_rows(s.reshape(-1, s.shape[-1]), np.ascontiguousarray(ref, s.dtype).reshape(-1))
    return s


def softmax_grad_(dp, p, d, c):
    """In place: dp (..., bk) float32 C-contiguous (like p) -> c p (dp - d), d (..., 1);
    returns dp."""
    _softmax_grad_rows(dp.reshape(-1, dp.shape[-1]), p.reshape(-1, p.shape[-1]),
                       np.ascontiguousarray(d, dp.dtype).reshape(-1), dp.dtype.type(c))
    return dp
