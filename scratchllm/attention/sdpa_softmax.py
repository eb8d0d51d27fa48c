"""The softmax of sdpa's scores fused into one Numba pass per row, forward and backward, for
short training lengths where the (B, Hkv, G*Tq, Tk) scores fit in cache. The readable twin is
in sdpa.py: scale, np.copyto of -inf under the mask, then ops.softmax_forward / _backward
(about eight passes forward and five backward, a temporary each).

Math, per score row s of query position t (the G query heads of a group stacked on the rows,
so row r is position r mod Tq):
    P = softmax(scale * s)   over the keys the (Tq, Tk) mask keeps (zero elsewhere; a fully
                             masked row is all zeros)
    dS = scale * P * (dP - rowsum(dP * P))
Soft-capped (Gemma 2, cap c): the row's logits are c tanh(scale s / c), so with
t = tanh(scale s / c) (one NumPy pass, kept for the backward)
    P = softmax(c * t),   dS = scale * (1 - t^2) * P * (dP - rowsum(dP * P))
(the chain rule through c tanh(x / c), whose derivative is 1 - t^2: core/softcap.py).
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
    t: np.ndarray = None  # soft-capped scores: tanh(scale s / c), (B, Hkv, G*Tq, Tk); else None


@njit(cache=True, nogil=True)
def _softmax_rows(src, s, lo, hi, keep, holes, Tq, scale, zero, minus_inf):
    """s = softmax of scale times each row of src (src may be s itself) over the kept keys;
    row r (position t = r mod Tq) keeps keys lo[t] <= j < hi[t], and inside that span only
    those with keep[t, j] when `holes` (else the span is all kept: causal and sliding masks,
    no branch in the loops). scale, zero and minus_inf are in s's dtype, so that exp_lanes
    runs in it (vectorised for float32)."""
    rows, Tk = s.shape
    for r in range(rows):
        t = r % Tq
        a, b = lo[t], hi[t]
        s[r, :a] = zero
        s[r, b:] = zero
        m = minus_inf
        for j in range(a, b):
            v = src[r, j] * scale
            if holes and not keep[t, j]:
                v = minus_inf
            s[r, j] = v
            if v > m or v != v:  # a NaN score makes the row NaN, as the readable path does
                m = v
        if m == minus_inf:  # nothing to attend: zeros
            s[r, a:b] = zero
            continue
        row = s[r, a:b]  # (b - a,) the kept span
        _exp_shifted(row, m)  # exp(-inf) = 0 at the holes
        total = 0.0
        for j in range(b - a):
            total += row[j]
        _times(row, 1.0 / total)


@njit(cache=True, nogil=True)
def _exp_shifted(x, m):
    """x <- exp(x - m), in place. A loop of its own over a 1-D slice: LLVM vectorises it
    here (inside _softmax_rows' 2-D loop nest it stayed scalar: 15x slower)."""
    for j in range(x.shape[0]):
        x[j] = exp_lanes(x[j] - m)


@njit(cache=True, nogil=True)
def _times(x, c):
    """x <- x * c, in place (a 1-D slice, vectorised)."""
    for j in range(x.shape[0]):
        x[j] = x[j] * c


@njit(cache=True, nogil=True)
def _softmax_rows_backward(dp, p, scale):
    rows, Tk = p.shape
    for r in range(rows):
        acc = 0.0
        for j in range(Tk):
            acc += np.float64(dp[r, j]) * p[r, j]
        for j in range(Tk):
            dp[r, j] = scale * p[r, j] * (dp[r, j] - acc)


@njit(cache=True, nogil=True)
def _softcap_softmax_rows_backward(dp, p, t, scale):
    rows, Tk = p.shape
    for r in range(rows):
        acc = 0.0
        for j in range(Tk):
            acc += np.float64(dp[r, j]) * p[r, j]
        for j in range(Tk):  # fwd: logit = c tanh(scale s / c) -> times scale (1 - t^2)
            dp[r, j] = scale * (1 - t[r, j] * t[r, j]) * p[r, j] * (dp[r, j] - acc)


def softmax_scores_(s, keep, scale):
    """In place: s (..., Tq, Tk) scores (C-contiguous) -> P = softmax(scale * s) where keep
    (Tq, Tk) bool (None: no mask) says a query may attend a key; returns s. Each mask row is
    reduced to the span of its kept keys (causal: 0..t), so masked keys outside it cost no
    exp."""
    return _softmax_from(s, s, keep, scale)


def softcap_softmax_scores_(s, keep, scale, cap):
    """In place: s (..., Tq, Tk) scores (C-contiguous) -> P = softmax(cap tanh(scale s / cap))
    under keep as softmax_scores_; returns (P (the array s), t = tanh(scale s / cap), a new
    array of s's shape, for the backward)."""
    np.multiply(s, s.dtype.type(scale / cap), out=s)  # scale s / c
    t = np.tanh(s)  # (..., Tq, Tk)
    return _softmax_from(t, s, keep, cap), t


def _softmax_from(src, s, keep, scale):
    """s = softmax(scale * src) over the keys keep (Tq, Tk) holds (None: all); returns s."""
    Tk = s.shape[-1]
    if keep is None:
        keep = np.ones((1, Tk), dtype=bool)  # (1, Tk)
    any_kept = keep.any(axis=1)  # (Tq,)
    lo = np.where(any_kept, keep.argmax(axis=1), 0)  # (Tq,) first kept key
    hi = np.where(any_kept, Tk - keep[:, ::-1].argmax(axis=1), 0)  # (Tq,) last kept + 1
    holes = bool(np.any(keep.sum(axis=1) != hi - lo))  # a masked key inside some span
    _softmax_rows(src.reshape(-1, Tk), s.reshape(-1, Tk), lo, hi, keep, holes, keep.shape[0],
                  *(s.dtype.type(c) for c in (scale, 0, -np.inf)))
    return s


def softmax_scores_backward_(dp, p, scale, t=None):
    """In place: dp (..., Tk) (C-contiguous, like p) -> dS = scale P (dP - rowsum(dP P)), and
    with the soft-capped forward's t = tanh(scale s / c) (like p) also times (1 - t^2);
    returns dp."""
    rows = (dp.reshape(-1, dp.shape[-1]), p.reshape(-1, p.shape[-1]))
    if t is None:
        _softmax_rows_backward(*rows, scale)
    else:
        _softcap_softmax_rows_backward(*rows, t.reshape(-1, t.shape[-1]), scale)
    return dp
