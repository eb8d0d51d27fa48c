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
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import njit

from scratchllm.core.exp32 import exp_linked
from scratchllm.core.fused_sums import dot64_exact, max_lanes, sum64


class FusedSoftmaxCache(NamedTuple):
    """sdpa's softmax cache on the fused path: y = P (rows sum to 1 over the kept keys)."""
    y: np.ndarray  # (B, Hkv, G*Tq, Tk)
    t: np.ndarray = None  # soft-capped scores: tanh(scale s / c), (B, Hkv, G*Tq, Tk); else None


@njit(cache=True, nogil=True)
def _softmax_rows(src, s, starts, ends, n_runs, Tq, scale, zero, minus_inf):
    """s = softmax of scale times each row of src (src may be s itself) over the kept keys;
    row r (position t = r mod Tq) keeps the n_runs[t] runs of keys starts[t, u] <= j <
    ends[t, u] (causal: one run 0..t+1; a window with sinks: two) and nothing else, so a
    masked key costs no exp and the loops carry no mask branch. scale, zero and minus_inf are
    in s's dtype, so that exp_linked runs in it (vectorised for float32)."""
    rows, Tk = s.shape
    for r in range(rows):
        t = r % Tq
        m = minus_inf
        for u in range(n_runs[t]):
            run = s[r, starts[t, u]:ends[t, u]]  # (run length,) kept keys
            _scaled(src[r, starts[t, u]:ends[t, u]], scale, run)
            m = max(m, max_lanes(run, minus_inf))  # NaN skipped: exp(NaN - m) below makes
        _zero_gaps(s[r], starts[t], ends[t], n_runs[t], zero)  # the row NaN, as the
        if m == minus_inf:  # nothing to attend: zeros (only NaN: NaN)  readable path does
            _fill_masked_row(s[r], starts[t], ends[t], n_runs[t], zero)
            continue
        total = 0.0
        for u in range(n_runs[t]):
            run = s[r, starts[t, u]:ends[t, u]]
            _exp_shifted(run, m)
            total += sum64(run)  # float64 lanes (core/fused_sums.py)
        for u in range(n_runs[t]):
            _times(s[r, starts[t, u]:ends[t, u]], 1.0 / total)


@njit(cache=True, nogil=True)
def _zero_gaps(row, starts, ends, n, zero):
    """row <- zero outside the n runs [starts[u], ends[u]) (sorted, disjoint)."""
    j = 0
    for u in range(n):
        row[j:starts[u]] = zero
        j = ends[u]
    row[j:] = zero


@njit(cache=True, nogil=True)
def _fill_masked_row(row, starts, ends, n, zero):
    """The kept keys of a row that has no finite score: zeros, or NaN if any is NaN (loops:
    np.isnan(run).any() compiles a temporary and a reduction of its own)."""
    fill = zero
    for u in range(n):
        for j in range(starts[u], ends[u]):
            if row[j] != row[j]:
                fill = row[j]
    for u in range(n):
        for j in range(starts[u], ends[u]):
            row[j] = fill


@njit(cache=True, nogil=True)
def _exp_shifted(x, m):
    """x <- exp(x - m), in place. A loop of its own over a 1-D slice: LLVM vectorises it
    here (inside _softmax_rows' 2-D loop nest it stayed scalar: 15x slower)."""
    for j in range(x.shape[0]):
        x[j] = exp_linked(x[j] - m)


@njit(cache=True, nogil=True)
def _scaled(src, c, x):
    """x <- src * c (1-D slices, vectorised; src may be x)."""
    for j in range(x.shape[0]):
        x[j] = src[j] * c


@njit(cache=True, nogil=True)
def _times(x, c):
    """x <- x * c, in place (a 1-D slice, vectorised)."""
    for j in range(x.shape[0]):
        x[j] = x[j] * c


@njit(cache=True, nogil=True)
def _softmax_rows_backward(dp, p, scale):
    rows, Tk = p.shape
    for r in range(rows):
        acc = dot64_exact(dp[r], p[r])  # rowsum(dP P) in float64 lanes (core/fused_sums.py)
        for j in range(Tk):
            dp[r, j] = scale * p[r, j] * (dp[r, j] - acc)


@njit(cache=True, nogil=True)
def _softcap_softmax_rows_backward(dp, p, t, scale):
    rows, Tk = p.shape
    for r in range(rows):
        acc = dot64_exact(dp[r], p[r])  # rowsum(dP P)
        for j in range(Tk):  # fwd: logit = c tanh(scale s / c) -> times scale (1 - t^2)
            dp[r, j] = scale * (1 - t[r, j] * t[r, j]) * p[r, j] * (dp[r, j] - acc)


def softmax_scores_(s, keep, scale):
    """In place: s (..., Tq, Tk) scores (C-contiguous) -> P = softmax(scale * s) where keep
    (Tq, Tk) bool (None: no mask) says a query may attend a key; returns s. Each mask row is
    reduced to its runs of kept keys (causal: 0..t), so masked keys cost no exp."""
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
    starts, ends, n_runs = kept_runs(keep)
    _softmax_rows(src.reshape(-1, Tk), s.reshape(-1, Tk), starts, ends, n_runs, keep.shape[0],
                  *(s.dtype.type(c) for c in (scale, 0, -np.inf)))
    return s


def kept_runs(keep):
    """The runs of True in each row of keep (Tq, Tk) bool: (starts, ends (Tq, R) int64,
    n_runs (Tq,)), row t's runs starts[t, u] <= j < ends[t, u] for u < n_runs[t] (R the
    most runs of any row). Causal: one run per row; a sliding window with sinks: two.
    Every layer of every step passes the same mask: the runs are computed once per mask
    (a cache keyed by its bits; read-only arrays)."""
    return _runs_of(keep.shape, np.packbits(keep).tobytes())


@lru_cache(maxsize=32)
def _runs_of(shape, bits):
    """kept_runs of the mask whose packed bits are `bits` (np.packbits of a (Tq, Tk) bool)."""
    keep = np.unpackbits(np.frombuffer(bits, np.uint8), count=shape[0] * shape[1]).reshape(
        shape)  # (Tq, Tk) 0/1
    edges = np.diff(keep.astype(np.int8), axis=1, prepend=0, append=0)  # (Tq, Tk + 1)
    t_up, j_up = np.nonzero(edges == 1)  # a run starts at j (row-major: sorted per row)
    j_down = np.nonzero(edges == -1)[1]  # and ends before j, in the same order
    n_runs = np.bincount(t_up, minlength=keep.shape[0])  # (Tq,)
    R = max(int(n_runs.max(initial=0)), 1)
    starts = np.zeros((keep.shape[0], R), np.int64)  # (Tq, R)
    ends = np.zeros((keep.shape[0], R), np.int64)
    u = np.arange(t_up.size) - np.repeat(np.cumsum(n_runs) - n_runs, n_runs)  # run index
    starts[t_up, u], ends[t_up, u] = j_up, j_down
    for a in (starts, ends, n_runs):
        a.flags.writeable = False  # shared by every later call with this mask
    return starts, ends, n_runs


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
