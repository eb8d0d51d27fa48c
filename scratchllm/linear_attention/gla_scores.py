"""GLA's intra-chunk scores with one gate per key channel (gla.py's hot spot):
    P_ts = Σ_i q_t[i] k_s[i] E_ts[i],   E_ts[i] = exp(b_t[i] − b_s[i]) for s ≤ t, 0 above,
b the in-chunk cumulative log gate. The NumPy pair (`_ref`) builds the whole decay tensor E
(..., C, C, Dk) and contracts it with einsum; its Numba twin never builds E: one task per chunk
walks each key s forward in time and keeps E_ts = E_{t−1,s} ⊙ α_t, α_t = exp(b_t − b_{t−1}),
as a running product (C·Dk exps per chunk instead of C²·Dk, and no (C, C, Dk) array). Every
factor α is exp(g) ≤ 1 for g ≤ 0, so the product underflows at worst, as exp(b_t − b_s) would.

Backward (W_tsi = dP_ts q_ti k_si E_tsi, the gradient of the exponent b_ti − b_si):
    dq_ti = Σ_s dP_ts k_si E_tsi,   dk_si = Σ_t dP_ts q_ti E_tsi,   db_ti = Σ_s W_tsi − Σ_s W_sti

Glossary: M chunks (the flattened leading axes: batch, heads, chunks), C chunk length,
Dk key channels.
"""
from typing import NamedTuple

import numba
import numpy as np

from scratchllm.core.validate import common_float, expect_dout, expect_float, expect_shape
from scratchllm.linear_attention.lanes import run_spans


class ScoresCache(NamedTuple):
    q: np.ndarray
    k: np.ndarray
    b: np.ndarray
    E: np.ndarray  # the decay tensor (..., C, C, Dk) (the reference only; None in the twin)


def _check(fn, q, k, b):
    for name, a in (("q", q), ("k", k), ("b", b)):
        expect_float(fn, name, a, min_ndim=2)
        expect_shape(fn, name, a, q.shape, "(..., C, Dk) like q")


def decay_tensor(b):
    """E_ts = exp(b_t − b_s) for s ≤ t, 0 above the diagonal: (..., C, C, G). Masked before
    exp, so no argument above the diagonal (where b_t − b_s ≥ 0) can overflow."""
    C = b.shape[-2]
    diff = b[..., :, None, :] - b[..., None, :, :]  # (..., C, C, G)
    keep = np.tril(np.ones((C, C), bool))[:, :, None]  # (C, C, 1)
    return np.exp(np.where(keep, diff, -np.inf))  # (..., C, C, G)


# ---------------------------------------------------------------------------- reference
def gla_scores_forward_ref(q, k, b):
    """P (..., C, C) from q, k, b (..., C, Dk), through the whole decay tensor."""
    q, k, b = common_float(q, k, b)
    _check("gla_scores", q, k, b)
    E = decay_tensor(b)  # (..., C, C, Dk)
    return np.einsum("...ti,...si,...tsi->...ts", q, k, E), ScoresCache(q, k, b, E)


def gla_scores_backward_ref(dP, cache):
    """Math: as the module docstring, each sum an einsum over E.
    Reference: Yang et al. 2023, arXiv 2312.06635, section 4 (the backward derived here)."""
    q, k, b, E = cache
    expect_dout("gla_scores_backward_ref", dP, q.shape[:-1] + q.shape[-2:-1], q.dtype, "dP")
    dq = np.einsum("...ts,...si,...tsi->...ti", dP, k, E)  # (..., C, Dk)
    dk = np.einsum("...ts,...ti,...tsi->...si", dP, q, E)  # (..., C, Dk)
    W = dP[..., None] * q[..., :, None, :] * k[..., None, :, :] * E  # (..., C, C, Dk)
    return {"q": dq, "k": dk, "b": W.sum(axis=-2) - W.sum(axis=-3)}


# ---------------------------------------------------------------------------- Numba twins
@numba.njit(cache=True, nogil=True)
def _alphas_(b, alpha):  # pragma: no cover (compiled)
    """alpha (C, Dk): α_t = exp(b_t − b_{t−1}) = exp(g_t) for t ≥ 1 (row 0 unused)."""
    for t in range(1, b.shape[0]):
        for i in range(b.shape[1]):
            alpha[t, i] = np.exp(b[t, i] - b[t - 1, i])


@numba.njit(cache=True, nogil=True)
def chunk_scores_(q, k, b, P):  # pragma: no cover (compiled)
    """One chunk: q, k, b (C, Dk) -> P (C, C) written on and below the diagonal (also used by
    gla_chunks.py's lane kernels)."""
    C, Dk = q.shape
    alpha, e = np.empty((C, Dk), q.dtype), np.empty(Dk, q.dtype)  # (C, Dk), (Dk,)
    _alphas_(b, alpha)
    for s in range(C):
        for i in range(Dk):
            e[i] = k[s, i]  # k_s ⊙ E_ss (E_ss = 1)
        for t in range(s, C):
            if t > s:
                for i in range(Dk):
                    e[i] *= alpha[t, i]  # k_s ⊙ E_ts
            acc = q.dtype.type(0)
            for i in range(Dk):
                acc += q[t, i] * e[i]
            P[t, s] = acc


@numba.njit(cache=True, nogil=True)
def chunk_scores_backward_(dP, q, k, b, dq, dk, db):  # pragma: no cover (compiled)
    """One chunk: adds the scores' (dq, dk, db) (C, Dk) for dP (C, C) (read on and below the
    diagonal) into dq, dk, db."""
    C, Dk = q.shape
    alpha, e = np.empty((C, Dk), q.dtype), np.empty(Dk, q.dtype)  # (C, Dk), (Dk,)
    _alphas_(b, alpha)
    for s in range(C):
        for i in range(Dk):
            e[i] = 1  # E_ts for this s, walking t forward
        for t in range(s, C):
            if t > s:
                for i in range(Dk):
                    e[i] *= alpha[t, i]
            d = dP[t, s]
            for i in range(Dk):
                de = d * e[i]
                dq[t, i] += de * k[s, i]
                dk[s, i] += de * q[t, i]
                w = de * q[t, i] * k[s, i]
                db[t, i] += w
                db[s, i] -= w


@numba.njit(cache=True, nogil=True)
def _forward_kernel(q, k, b, P, lo, hi):  # pragma: no cover (compiled)
    """The chunks lo .. hi − 1 (a span per thread: lanes.run_spans)."""
    for m in range(lo, hi):
        chunk_scores_(q[m], k[m], b[m], P[m])


@numba.njit(cache=True, nogil=True)
def _backward_kernel(dP, q, k, b, dq, dk, db, lo, hi):  # pragma: no cover (compiled)
    for m in range(lo, hi):
        chunk_scores_backward_(dP[m], q[m], k[m], b[m], dq[m], dk[m], db[m])


def _flat(a):
    """(..., C, X) -> (M, C, X), C-contiguous."""
    return np.ascontiguousarray(a.reshape((-1,) + a.shape[-2:]))


def gla_scores_forward(q, k, b):
    """The Numba twin of gla_scores_forward_ref (no decay tensor is built)."""
    q, k, b = common_float(q, k, b)
    _check("gla_scores", q, k, b)
    P = np.zeros(q.shape[:-1] + q.shape[-2:-1], q.dtype)  # (..., C, C), 0 above the diagonal
    args = (_flat(q), _flat(k), _flat(b), P.reshape((-1,) + P.shape[-2:]))
    run_spans(lambda lo, hi: _forward_kernel(*args, lo, hi), len(args[0]), P.size)
    return P, ScoresCache(q, k, b, None)


def gla_scores_backward(dP, cache):
    """The Numba twin of gla_scores_backward_ref.
    Reference: Yang et al. 2023, arXiv 2312.06635, section 4 (the backward derived here)."""
    q, k, b, _ = cache
    expect_dout("gla_scores_backward", dP, q.shape[:-1] + q.shape[-2:-1], q.dtype, "dP")
    grads = [np.zeros(q.shape, q.dtype) for _ in range(3)]  # dq, dk, db (..., C, Dk)
    args = (_flat(dP), _flat(q), _flat(k), _flat(b),
            *(g.reshape((-1,) + q.shape[-2:]) for g in grads))
    run_spans(lambda lo, hi: _backward_kernel(*args, lo, hi), len(args[0]), dP.size)
    return dict(zip("qkb", grads))
