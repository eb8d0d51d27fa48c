"""Megatron's tensor-parallel pairs (Shoeybi et al. 2019, arXiv:1909.08053, section 3): a
matrix product split across the P ranks of a group, as forward/backward pairs built from the
linear pair (core/ops.py) and the f/g collectives (collectives.py); and the vocabulary split
the same way: the vocab-parallel embedding and cross-entropy (at the end of this file).

Column-parallel: W (Din, Dout) split by columns, W_r = W[:, cols_r] (Din, Dout/P) on rank r.

    fwd:  x replicated  ->  f (identity)  ->  y_r = x W_r + b_r        (this rank's columns)
    bwd:  dW_r = x^T dy_r,  db_r = sum dy_r,  dx = sum_r dy_r W_r^T   (f's all-reduce)

Row-parallel: W split by rows, W_r = W[rows_r, :] (Din/P, Dout); x split by columns the same way
(the column-parallel layer's output is exactly that shard, so no communication between them).

    fwd:  z_r = x_r W_r  ->  g (all-reduce)  ->  y = sum_r z_r + b    (replicated; b too)
    bwd:  dz_r = dy (g's identity),  dx_r = dy W_r^T,  dW_r = x_r^T dy,  db = sum dy

A Megatron MLP is column then row, y = g(act(f(x) W1_r) W2_r): one all-reduce forward (g) and
one backward (f), whatever the hidden width; the activation acts element-wise on a rank's own
columns. Megatron initialises each shard as a slice of the full matrix; split_columns and
split_rows cut that slice, so a TP layer equals the one-process Linear it was cut from.

Glossary (this file): P ranks, r a rank, cols_r / rows_r rank r's contiguous 1/P.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.ops import linear_backward, linear_forward, linear_out
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_int,
                                      expect_linear, expect_ndim, expect_shape)
from scratchllm.dist.collectives import (all_gather_forward, all_reduce_forward,
                                         copy_to_group_backward, copy_to_group_forward,
                                         reduce_from_group_backward, reduce_from_group_forward,
                                         reduce_scatter_backward, reduce_scatter_forward)


class ColumnCache(NamedTuple):
    f: object          # copy_to_group's cache
    linear: object     # linear's cache


class RowCache(NamedTuple):
    linear: object     # linear's cache (no bias: added after the reduce)
    g: object          # reduce_from_group's cache
    has_bias: bool


def _block(n, P, r, what):
    if n % P:
        raise ValueError(f"tensor parallel: {what} of {n} does not split into {P} equal parts")
    return slice(r * n // P, (r + 1) * n // P)


def split_columns(W, b, group):
    """Rank group.rank's (W[:, cols_r], b[cols_r] or None) of a full (Din, Dout) weight."""
    cols = _block(W.shape[1], group.size, group.rank, "Dout")
    return np.ascontiguousarray(W[:, cols]), None if b is None else b[cols].copy()


def split_rows(W, group):
    """Rank group.rank's W[rows_r, :] of a full (Din, Dout) weight (also the slice of the
    input's last axis that rank gets)."""
    return np.ascontiguousarray(W[_block(W.shape[0], group.size, group.rank, "Din"), :])


def column_linear_forward(x, W, b=None, *, group):
    """y_r = f(x) W_r + b_r.

    Inputs: x (..., Din) replicated; W (Din, Dout/P), b (Dout/P,) or None: rank r's columns.
    Returns: (y_r (..., Dout/P); ColumnCache).
    """
    x, W, b = common_float(x, W, b)
    expect_float("column_linear", "x", x, 1)
    expect_linear("column_linear", x.shape[-1], W, b)
    xr, c_f = copy_to_group_forward(x, group=group)  # fwd: x enters the region (f)
    y, c_lin = linear_forward(xr, W, b)  # fwd: y_r = x W_r + b_r
    return y, ColumnCache(c_f, c_lin)


def column_linear_backward(dout, cache):
    """dW_r, db_r from the linear on this rank's columns; dx = sum_r dy_r W_r^T: the linear's
    dx on each rank is a partial sum, completed by f's backward (an all-reduce)."""
    expect_dout("column_linear_backward", dout, *linear_out(cache.linear))
    g = linear_backward(dout, cache.linear)  # fwd: y_r = x W_r + b_r
    out = {"x": copy_to_group_backward(g["x"], cache.f)["x"], "W": g["W"]}  # fwd: f
    if "b" in g:
        out["b"] = g["b"]
    return out


def row_linear_forward(x, W, b=None, *, group):
    """y = g(x_r W_r) + b = sum_r x_r W_r + b, on every rank.

    Inputs: x (..., Din/P), W (Din/P, Dout): rank r's rows; b (Dout,) or None, replicated.
    Returns: (y (..., Dout), replicated; RowCache).
    """
    expect_float("row_linear", "x", x, 1)
    expect_linear("row_linear", x.shape[-1], W, b)
    z, c_lin = linear_forward(x, W)  # fwd: z_r = x_r W_r
    y, c_g = reduce_from_group_forward(z, group=group)  # fwd: y = sum_r z_r (g)
    if b is not None:
        y = y + b  # fwd: + b after the reduce (once, not P times)
    return y, RowCache(c_lin, c_g, b is not None)


def row_linear_backward(dout, cache):
    """dz_r = dy (g's backward, the identity: y is replicated, its loss counted once), then
    the linear on this rank's rows: dx_r = dy W_r^T, dW_r = x_r^T dy; db = sum of dy over rows
    (the same on every rank, as b is)."""
    expect_dout("row_linear_backward", dout, *linear_out(cache.linear))
    dz = reduce_from_group_backward(dout, cache.g)["x"]  # fwd: y = sum_r z_r
    g = linear_backward(dz, cache.linear)  # fwd: z_r = x_r W_r
    out = {"x": g["x"], "W": g["W"]}
    if cache.has_bias:
        out["b"] = dout.reshape(-1, dout.shape[-1]).sum(axis=0)  # fwd: y = ... + b
    return out


# ---------------------------------------------------------------------------- the vocabulary
class VocabEmbedCache(NamedTuple):
    local: np.ndarray  # ids - this rank's first row, clipped into range (...)
    hit: np.ndarray    # (...) bool: the id's row lives on this rank
    V: int             # rows on this rank
    leave: object      # g's (or the reduce-scatter's) cache
    sequence: bool     # the sum was a reduce-scatter along T


class VocabCECache(NamedTuple):
    p: np.ndarray      # (N, V/P) this rank's columns of softmax(logits)
    local: np.ndarray  # (N,) target - this rank's first column, clipped
    hit: np.ndarray    # (N,) bool: the target's column lives on this rank
    shape: tuple       # the logits' shape
    n: int             # rows N


def _check_vocab_ids(fn, name, ids, V_r, group):
    """ids an integer array in [0, V), V = V_r rows on each of the group's ranks."""
    expect_int(fn, name, ids)
    V = V_r * group.size
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        raise ValueError(f"{fn}: {name} must lie in [0, {V}) ({V_r} rows x {group.size} "
                         f"ranks), got values in [{ids.min()}, {ids.max()}]")


def _vocab_rows(ids, V_r, group):
    lo = group.rank * V_r
    hit = (ids >= lo) & (ids < lo + V_r)
    return np.where(hit, ids - lo, 0), hit


def vocab_embedding_forward(ids, E, *, group, sequence=False):
    """Megatron's vocab-parallel embedding: E (V, D) split by rows, rank r holding
    E_r = E[r V/P : (r+1) V/P]. Each rank looks up the ids in its range (zero rows for the
    others) and the partial sums meet in g: y = sum_r part_r = E[ids], replicated. With
    sequence=True (sequence parallelism) the sum is a reduce-scatter along T instead: rank r
    gets tokens r T/P .. (r+1) T/P of E[ids].

    Inputs: ids (B, T) ints in [0, V) (the same on every rank), E (V/P, D).
    Returns: (y (B, T, D), or (B, T/P, D) with sequence; VocabEmbedCache).
    """
    expect_float("vocab_embedding", "E", E)
    expect_ndim("vocab_embedding", "E", E, 2, "(V/P, D)")
    _check_vocab_ids("vocab_embedding", "ids", ids, E.shape[0], group)
    expect_ndim("vocab_embedding", "ids", ids, 2, "(B, T)")
    local, hit = _vocab_rows(ids, E.shape[0], group)
    part = np.where(hit[..., None], E[local], 0).astype(E.dtype)  # (B, T, D); fwd: E_r[ids]
    if sequence:
        y, c = reduce_scatter_forward(part, group=group, axis=1)  # fwd: tokens of rank r
    else:
        y, c = reduce_from_group_forward(part, group=group)  # fwd: y = sum_r part_r (g)
    return y, VocabEmbedCache(local, hit, E.shape[0], c, sequence)


def vocab_embedding_backward(dout, cache):
    """g's backward is the identity (the reduce-scatter's an all-gather along T), so each
    rank's part gets the whole dy; part_r = E_r[ids] on its hits only, so dE_r[v] = sum of
    dy over the positions whose id is row v of this rank (a scatter-add), 0 elsewhere."""
    expect_dout("vocab_embedding_backward", dout, cache.leave.shape, cache.leave.dtype)
    if cache.sequence:
        dpart = reduce_scatter_backward(dout, cache.leave)["x"]  # fwd: reduce-scatter (T)
    else:
        dpart = reduce_from_group_backward(dout, cache.leave)["x"]  # fwd: g
    dE = np.zeros((cache.V, dpart.shape[-1]), dpart.dtype)  # (V/P, D)
    np.add.at(dE, cache.local[cache.hit], dpart[cache.hit])  # fwd: part = E_r[ids] on hits
    return {"E": dE}


def vocab_cross_entropy_forward(logits, targets, *, group):
    """Megatron's vocab-parallel cross-entropy: logits (..., V) split by columns (rank r has
    z_r = logits[..., r V/P : (r+1) V/P], the output of a column-parallel head), the loss
    L = mean_n (log sum_v exp z_nv - z_n,t_n) computed without gathering the logits:

        m_n = max over every rank's z_n       (an all-gather of the P row maxima)
        s_n = sum_r sum_j exp(z_rnj - m_n)    (an all-reduce of N numbers)
        z_t = z_n,t_n from its owner, 0 elsewhere, summed (an all-reduce of N numbers)
        L = mean_n (log s_n + m_n - z_t)       replicated: one value, counted once

    Inputs: logits (..., V/P), targets (...) ints in [0, V) (the same on every rank).
    Returns: (loss 0-d array; VocabCECache).
    """
    expect_float("vocab_cross_entropy", "logits", logits, 1)
    V_r = logits.shape[-1]
    _check_vocab_ids("vocab_cross_entropy", "targets", targets, V_r, group)
    expect_shape("vocab_cross_entropy", "targets", targets, logits.shape[:-1],
                 "the logits' rows (...)")
    z = logits.reshape(-1, V_r)  # (N, V/P)
    t = targets.reshape(-1)  # (N,)
    maxima, _ = all_gather_forward(z.max(axis=1)[None], group=group)  # (P, N)
    m = maxima.max(axis=0)  # (N,): a shift, no gradient (softmax ignores it)
    e = np.exp(z - m[:, None])  # (N, V/P)
    s, _ = all_reduce_forward(e.sum(axis=1), group=group)  # (N,)
    local, hit = _vocab_rows(t, V_r, group)
    zt, _ = all_reduce_forward(np.where(hit, z[np.arange(len(t)), local], 0.0).astype(z.dtype),
                               group=group)  # (N,)
    loss = np.mean(np.log(s) + m - zt)  # fwd: L = mean(log s + m - z_t)
    return np.asarray(loss, z.dtype), VocabCECache(e / s[:, None], local, hit, logits.shape,
                                                   len(t))


def vocab_cross_entropy_backward(dloss, cache):
    """dL/dz_nv = (softmax_nv - [v = t_n]) / N for every column v, and rank r holds the
    softmax of its columns already (e / s with the global s): the backward is local, no
    communication (the loss is replicated: its gradient is the one dloss on every rank)."""
    expect_dout("vocab_cross_entropy_backward", dloss, (), cache.p.dtype, name="dloss")
    dz = cache.p.copy()  # (N, V/P)
    rows = np.nonzero(cache.hit)[0]
    dz[rows, cache.local[rows]] -= 1.0  # fwd: - z_t on the target's owner
    dz *= np.asarray(dloss, dz.dtype) / cache.n  # fwd: mean over the N rows
    return {"logits": dz.reshape(cache.shape)}
