"""Megatron's tensor-parallel Linear pair (Shoeybi et al. 2019, arXiv:1909.08053, section 3):
a matrix product split across the P ranks of a group, as forward/backward pairs built from the
linear pair (core/ops.py) and the f/g collectives (collectives.py).

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

from scratchllm.core.ops import expect_linear, linear_backward, linear_forward, linear_out
from scratchllm.core.validate import common_float, expect_dout, expect_float
from scratchllm.dist.collectives import (copy_to_group_backward, copy_to_group_forward,
                                         reduce_from_group_backward, reduce_from_group_forward)


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
