"""The softmax of sdpa's scores fused into one Numba pass per row, forward and backward, for
short training lengths where the (B, Hkv, G*Tq, Tk) scores fit in cache. The readable twin is
in sdpa.py: scale, np.copyto of -inf under the mask, then ops.softmax_forward / _backward
(about eight passes forward and five backward, a temporary each).

Math, per score row s of query position t (the G query heads of a group stacked on the rows,
so row r is position r mod Tq):
    P = softmax(scale * s)   over the keys the (Tq, Tk) mask keeps (zero elsewhere; a fully
                             masked row is all zeros)
    dS = scale * P * (dP - rowsum(dP * P))
Both overwrite their input array in place: the forward turns the fresh scores into P, the
backward turns the fresh dP into dS (sdpa owns both arrays).

Glossary: Tq, Tk query and key lengths; rows = B * Hkv * G * Tq.
"""
from typing import NamedTuple

import numpy as np
from numba import njit

from scratchllm.core.exp32 import exp_lanes


class FusedSoftmaxCache(NamedTuple):
    """sdpa's softmax cache on the fused path: y = P (rows sum to 1 over the kept keys)."""
    y: np.ndarray  # (B, Hkv, G*Tq, Tk)


@njit(cache=True, nogil=True)
def _softmax_rows(s, keep, masked, Tq, scale, zero, minus_inf):
    """scale times each row, softmax over the kept keys; scale, zero and minus_inf in s's
    dtype, so that exp_lanes runs in it (vectorised for float32)."""
    rows, Tk = s.shape
    for r in range(rows):
        t = r % Tq
        m = minus_inf
        for j in range(Tk):
            s[r, j] = s[r, j] * scale
            if not masked or keep[t, j]:
                m = max(m, s[r, j])
        if m == minus_inf:  # nothing to attend: zeros
            s[r, :] = 0
            continue
        for j in range(Tk):
            e = exp_lanes(s[r, j] - m)
            s[r, j] = e if not masked or keep[t, j] else zero
        total = 0.0
        for j in range(Tk):
            total += s[r, j]
        inv = 1.0 / total
        for j in range(Tk):
            s[r, j] = s[r, j] * inv


@njit(cache=True, nogil=True)
def _softmax_rows_backward(dp, p, scale):
    rows, Tk = p.shape
    for r in range(rows):
        acc = 0.0
        for j in range(Tk):
            acc += np.float64(dp[r, j]) * p[r, j]
        for j in range(Tk):
            dp[r, j] = scale * p[r, j] * (dp[r, j] - acc)


def softmax_scores_(s, keep, scale):
    """In place: s (..., Tq, Tk) scores (C-contiguous) -> P = softmax(scale * s) where keep
    (Tq, Tk) bool (None: no mask) says a query may attend a key; returns s."""
    Tk = s.shape[-1]
    Tq = keep.shape[0] if keep is not None else 1
    dummy = np.ones((1, 1), dtype=bool)
    _softmax_rows(s.reshape(-1, Tk), dummy if keep is None else keep, keep is not None, Tq,
                  *(s.dtype.type(c) for c in (scale, 0, -np.inf)))
    return s


def softmax_scores_backward_(dp, p, scale):
    """In place: dp (..., Tk) (C-contiguous, like p) -> dS = scale P (dP - rowsum(dP P));
    returns dp."""
    _softmax_rows_backward(dp.reshape(-1, dp.shape[-1]), p.reshape(-1, p.shape[-1]), scale)
    return dp
