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
def _softmax_rows(s, lo, hi, keep, holes, Tq, scale, zero, minus_inf):
    """scale times each row, softmax over the kept keys; row r (position t = r mod Tq) keeps
    keys lo[t] <= j < hi[t], and inside that span only those with keep[t, j] when `holes`
    (else the span is all kept: causal and sliding masks, no branch in the loops). scale,
    zero and minus_inf are in s's dtype, so that exp_lanes runs in it (vectorised for
    float32)."""
    rows, Tk = s.shape
    for r in range(rows):
        t = r % Tq
        a, b = lo[t], hi[t]
        s[r, :a] = zero
        s[r, b:] = zero
        m = minus_inf
        for j in range(a, b):
            v = s[r, j] * scale
            if holes and not keep[t, j]:
                v = minus_inf
            s[r, j] = v
            m = max(m, v)
        if m == minus_inf:  # nothing to attend: zeros
            s[r, a:b] = zero
            continue
        total = 0.0
        for j in range(a, b):
            e = exp_lanes(s[r, j] - m)  # exp(-inf) = 0 at the holes
            s[r, j] = e
            total += e
        inv = 1.0 / total
        for j in range(a, b):
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
    (Tq, Tk) bool (None: no mask) says a query may attend a key; returns s. Each mask row is
    reduced to the span of its kept keys (causal: 0..t), so masked keys outside it cost no
    exp."""
    Tk = s.shape[-1]
    if keep is None:
        keep = np.ones((1, Tk), dtype=bool)  # (1, Tk)
    any_kept = keep.any(axis=1)  # (Tq,)
    lo = np.where(any_kept, keep.argmax(axis=1), 0)  # (Tq,) first kept key
    hi = np.where(any_kept, Tk - keep[:, ::-1].argmax(axis=1), 0)  # (Tq,) last kept + 1
    holes = bool(np.any(keep.sum(axis=1) != hi - lo))  # a masked key inside some span
    _softmax_rows(s.reshape(-1, Tk), lo, hi, keep, holes, keep.shape[0],
                  *(s.dtype.type(c) for c in (scale, 0, -np.inf)))
    return s


def softmax_scores_backward_(dp, p, scale):
    """In place: dp (..., Tk) (C-contiguous, like p) -> dS = scale P (dP - rowsum(dP P));
    returns dp."""
    _softmax_rows_backward(dp.reshape(-1, dp.shape[-1]), p.reshape(-1, p.shape[-1]), scale)
    return dp
