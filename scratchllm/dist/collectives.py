"""The collectives as forward/backward pairs over a process group (comm.Group), each backward
derived from the forward, so a model split across ranks differentiates like any other pair.

Convention (Megatron-LM's, arXiv:1909.08053; the backwards autograd hides in picotron and
PyTorch's torch.distributed.nn): rank r holds x_r and gets y_r; the global loss is the sum of
every rank's part, L = sum_r L_r(y_r), so rank r's upstream gradient is dy_r = dL/dy_r and its
backward must return dx_r = dL/dx_r = sum_s (dy_s/dx_r)^T dy_s, which needs the other ranks'
dy_s: the backward of a collective is again a collective.

    pair                    forward y_r =                   backward dx_r =
    all_reduce              sum_s x_s                       sum_s dy_s          (all_reduce)
    all_gather              [x_0; x_1; ...; x_{P-1}]        sum_s dy_s[block r] (reduce_scatter)
    reduce_scatter          sum_s x_s[block r]              [dy_0; ...][block r's source]
                                                                                (all_gather)
    all_to_all              [x_0[chunk r]; x_1[chunk r]...] the reverse all_to_all
    ring_shift              x_{r - k}                       dy_{r + k}          (shift by -k)
    copy_to_group     (f)   x (replicated)                  sum_s dy_s          (all_reduce)
    reduce_from_group (g)   sum_s x_s (replicated)          dy                  (identity)

f and g are Megatron's pair around a tensor-parallel block: a replicated value is ONE logical
value held by every rank, counted once in the loss; see their docstrings.

Bytes: each call records in group.sent what this rank sends under the bandwidth-optimal ring
algorithms (Patarasuk & Yuan 2009): all-gather of P shards of n bytes sends (P - 1) n per rank,
reduce-scatter of an input of n bytes sends (P - 1) n / P, all-reduce = reduce-scatter +
all-gather sends 2 (P - 1) n / P, all-to-all sends exactly the rows meant for other ranks, a ring
step sends its block. The communication model predicts the same numbers from the config.

Glossary (this file): P ranks in the group, r and s ranks, n bytes.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import expect_dout, expect_float
from scratchllm.dist.comm import contiguous


class GroupCache(NamedTuple):
    group: object        # the comm.Group
    shape: tuple         # the forward output's shape (dout must match)
    dtype: object
    axis: int = 0        # the split/concat axis (all_gather, reduce_scatter)
    counts: tuple = None  # rows per rank of the -v forms (None: equal blocks)


class AllToAllCache(NamedTuple):
    group: object
    shape: tuple
    dtype: object
    send: tuple          # rows this rank sent to each rank
    recv: tuple          # rows it received from each rank


class ShiftCache(NamedTuple):
    group: object
    shape: tuple
    dtype: object
    shift: int


def _expect_axis(fn, x, axis):
    expect_float(fn, "x", x, 1)
    if not isinstance(axis, int) or not -x.ndim <= axis < x.ndim:
        raise ValueError(f"{fn}: axis {axis!r} is not an axis of x (shape {x.shape})")


def _all_reduce(x, group):
    """sum_s x_s on every rank (counted as a ring all-reduce)."""
    x = contiguous(x)
    out = np.empty_like(x)
    group.comm.Allreduce(x, out)
    group.count("all_reduce", 2 * (group.size - 1) * x.nbytes // group.size)
    return out


def _all_gather(x, group, axis, counts=None):
    """Every rank's x concatenated along axis, in rank order (counts: rows per rank, the
    all-gather-v; None: every rank's x has the same length)."""
    P = group.size
    x = contiguous(np.moveaxis(x, axis, 0))
    if counts is None:
        out = np.empty((P,) + x.shape, x.dtype)  # (P, n, ...)
        group.comm.Allgather(x, out)
        group.count("all_gather", (P - 1) * x.nbytes)
        return np.moveaxis(out.reshape((P * x.shape[0],) + x.shape[1:]), 0, axis)
    row = int(np.prod(x.shape[1:], dtype=np.int64))
    sizes = [c * row for c in counts]
    out = np.empty((sum(counts),) + x.shape[1:], x.dtype)
    group.comm.Allgatherv(x, [out, (sizes, _offsets(sizes))])
    # ring all-gather-v: a rank forwards every block but its successor's
    group.count("all_gather", (sum(sizes) - sizes[(group.rank + 1) % P]) * x.itemsize)
    return np.moveaxis(out, 0, axis)


def _reduce_scatter(x, group, axis, counts=None):
    """Block r (of P equal blocks along axis; counts: rows per block, the reduce-scatter-v)
    of sum_s x_s, on rank r."""
    P = group.size
    if counts is None and x.shape[axis] % P:
        raise ValueError(f"reduce_scatter: axis {axis} of length {x.shape[axis]} does not split "
                         f"into {P} equal blocks (one per rank)")
    x = contiguous(np.moveaxis(x, axis, 0))
    if counts is None:
        out = np.empty((x.shape[0] // P,) + x.shape[1:], x.dtype)
        group.comm.Reduce_scatter_block(x, out)
        group.count("reduce_scatter", (P - 1) * x.nbytes // P)
        return np.moveaxis(out, 0, axis)
    row = int(np.prod(x.shape[1:], dtype=np.int64))
    out = np.empty((counts[group.rank],) + x.shape[1:], x.dtype)
    group.comm.Reduce_scatter(x, out, [c * row for c in counts])
    # ring reduce-scatter-v: a rank sends every block but its own once
    group.count("reduce_scatter", (x.shape[0] - counts[group.rank]) * row * x.itemsize)
    return np.moveaxis(out, 0, axis)


def _expect_counts(fn, counts, P, total=None):
    """counts as a tuple of P non-negative ints (summing to total when given)."""
    counts = tuple(int(c) for c in counts)
    if len(counts) != P or min(counts) < 0 or (total is not None and sum(counts) != total):
        want = f" summing to {total}" if total is not None else ""
        raise ValueError(f"{fn}: counts {counts} must be {P} non-negative row counts{want} "
                         f"(one per rank)")
    return counts


def _all_to_all(x, group, send):
    """Rows x[chunk j] (send[j] rows each, in order) to rank j; returns the rows received,
    concatenated in rank order, and the receive counts."""
    recv = tuple(int(c) for c in group.comm.alltoall([int(c) for c in send]))
    x = contiguous(x)
    row = int(np.prod(x.shape[1:], dtype=np.int64))
    out = np.empty((sum(recv),) + x.shape[1:], x.dtype)
    s_counts, r_counts = [c * row for c in send], [c * row for c in recv]
    group.comm.Alltoallv([x, (s_counts, _offsets(s_counts))],
                         [out, (r_counts, _offsets(r_counts))])
    mine = group.rank
    group.count("all_to_all", (sum(send) - send[mine]) * row * x.itemsize)
    return out, recv


def _offsets(counts):
    return [int(v) for v in np.concatenate([[0], np.cumsum(counts)[:-1]])]


def _shift(x, group, k):
    """x_{r - k} on rank r: send to r + k, receive from r - k (one ring step)."""
    P, r = group.size, group.rank
    x = contiguous(x)
    out = np.empty_like(x)
    group.comm.Sendrecv(x, dest=(r + k) % P, recvbuf=out, source=(r - k) % P)
    if (r + k) % P != r:
        group.count("ring_shift", x.nbytes)
    return out


# ---------------------------------------------------------------------------- the pairs
def all_reduce_forward(x, *, group):
    """y_r = sum_s x_s on every rank r of the group.

    Inputs: x (any shape), this rank's summand. Returns: (y, same shape; GroupCache).
    """
    expect_float("all_reduce", "x", x)
    y = _all_reduce(x, group)  # fwd: y_r = sum_s x_s
    return y, GroupCache(group, y.shape, y.dtype)


def all_reduce_backward(dout, cache):
    """dx_r = sum_s (dy_s/dx_r)^T dy_s = sum_s dy_s, since dy_s/dx_r = I for every s: the
    backward of an all-reduce is an all-reduce (of the upstream gradients)."""
    expect_dout("all_reduce_backward", dout, cache.shape, cache.dtype)
    return {"x": _all_reduce(dout, cache.group)}  # fwd: y_r = sum_s x_s


def all_gather_forward(x, *, group, axis=0, counts=None):
    """y_r = concat(x_0, ..., x_{P-1}) along axis, on every rank r.

    Inputs: x (..., n, ...), this rank's shard (n along axis, equal on every rank; with
    counts, n = counts[r] on rank r: the all-gather-v, as ZeRO-3 gathers whole Params).
    Returns: (y (..., P n or sum(counts), ...); GroupCache).
    """
    _expect_axis("all_gather", x, axis)
    if counts is not None:
        counts = _expect_counts("all_gather", counts, group.size)
        if counts[group.rank] != x.shape[axis]:
            raise ValueError(f"all_gather: counts[{group.rank}] = {counts[group.rank]}, but this "
                             f"rank's x has {x.shape[axis]} rows along axis {axis}")
    y = _all_gather(x, group, axis, counts)  # fwd: y_r = [x_0; ...; x_{P-1}]
    return y, GroupCache(group, y.shape, y.dtype, axis, counts)


def all_gather_backward(dout, cache):
    """x_r appears in every y_s as block r, so dx_r = sum_s dy_s[block r]: sum the upstream
    gradients over ranks and keep block r on rank r, a reduce-scatter (-v with the counts)."""
    expect_dout("all_gather_backward", dout, cache.shape, cache.dtype)
    # fwd: all-gather
    return {"x": _reduce_scatter(dout, cache.group, cache.axis, cache.counts)}


def reduce_scatter_forward(x, *, group, axis=0, counts=None):
    """y_r = sum_s x_s[block r], block r the r-th of P equal blocks along axis (with counts,
    block r has counts[r] rows: the reduce-scatter-v, as ZeRO-2 hands each rank the summed
    gradients of its Params).

    Inputs: x (..., P n or sum(counts), ...). Returns: (y (..., n or counts[r], ...);
    GroupCache).
    """
    _expect_axis("reduce_scatter", x, axis)
    if counts is not None:
        counts = _expect_counts("reduce_scatter", counts, group.size, x.shape[axis])
    y = _reduce_scatter(x, group, axis, counts)  # fwd: y_r = sum_s x_s[block r]
    return y, GroupCache(group, y.shape, y.dtype, axis, counts)


def reduce_scatter_backward(dout, cache):
    """Block b of x_r feeds only y_b (with weight 1), so dx_r[block b] = dy_b: every rank
    needs every rank's dy, concatenated in rank order, an all-gather (-v with the counts)."""
    expect_dout("reduce_scatter_backward", dout, cache.shape, cache.dtype)
    # fwd: reduce-scatter
    return {"x": _all_gather(dout, cache.group, cache.axis, cache.counts)}


def all_to_all_forward(x, *, group, counts=None):
    """Rank r sends rows x_r[chunk j] to rank j (chunk j: counts[j] rows, in order; None:
    P equal chunks) and gets y_r = concat_s x_s[chunk r] in rank order: the MoE dispatch and
    combine (all-to-all-v when the counts differ).

    Inputs: x (n, ...) rows. Returns: (y (sum of received counts, ...); AllToAllCache).
    """
    expect_float("all_to_all", "x", x, 1)
    P = group.size
    if counts is None:
        if x.shape[0] % P:
            raise ValueError(f"all_to_all: {x.shape[0]} rows do not split into {P} equal chunks; "
                             f"pass counts")
        counts = [x.shape[0] // P] * P
    counts = _expect_counts("all_to_all", counts, P, x.shape[0])
    y, recv = _all_to_all(x, group, counts)  # fwd: y_r = [x_0[chunk r]; ...; x_{P-1}[chunk r]]
    return y, AllToAllCache(group, y.shape, y.dtype, counts, recv)


def all_to_all_backward(dout, cache):
    """Row i of y_r is one row of some x_s, copied: its gradient goes back to where it came
    from. The rows of dy_r from rank s (recv[s] of them) return to rank s, which puts them at
    its chunk r: the same all-to-all with send and receive counts swapped."""
    expect_dout("all_to_all_backward", dout, cache.shape, cache.dtype)
    dx, _ = _all_to_all(dout, cache.group, cache.recv)  # fwd: the all-to-all, reversed
    return {"x": dx}


def ring_shift_forward(x, *, group, shift=1):
    """One step around the ring: y_r = x_{r - shift} (rank r sends x_r to r + shift and
    receives from r - shift; ring attention passes key/value blocks this way).

    Inputs: x (any shape, the same on every rank). Returns: (y, same shape; ShiftCache).
    """
    expect_float("ring_shift", "x", x)
    y = _shift(x, group, shift)  # fwd: y_r = x_{r - k}
    return y, ShiftCache(group, y.shape, y.dtype, shift)


def ring_shift_backward(dout, cache):
    """x_r lands only in y_{r + k}, so dx_r = dy_{r + k}: shift the gradients back, by -k."""
    expect_dout("ring_shift_backward", dout, cache.shape, cache.dtype)
    return {"x": _shift(dout, cache.group, -cache.shift)}  # fwd: y_r = x_{r - k}


def _hop(x, group, k):
    """x_{r - k} on rank r, zeros where r - k is not a rank: one step along the line of ranks
    (no wrap-around). Each rank first receives (if it has a source), then sends (if it has a
    destination), so the chain starts at the end that has no source."""
    P, r = group.size, group.rank
    x, out = contiguous(x), np.zeros_like(x)
    if 0 <= r - k < P and k:
        group.comm.Recv(out, source=r - k, tag=7)
    if 0 <= r + k < P and k:
        group.comm.Send(x, dest=r + k, tag=7)
        group.count("send", x.nbytes)
    return out


def pipeline_hop_forward(x, *, group):
    """A pipeline's point-to-point step: stage r + 1 receives stage r's activation, y_r =
    x_{r-1} (y_0 = 0: the first stage receives nothing; the last stage's x goes nowhere).

    Inputs: x (any shape, the same on every rank). Returns: (y, same shape; ShiftCache).
    """
    expect_float("pipeline_hop", "x", x)
    y = _hop(x, group, 1)  # fwd: y_r = x_{r - 1}
    return y, ShiftCache(group, y.shape, y.dtype, 1)


def pipeline_hop_backward(dout, cache):
    """x_r lands only in y_{r+1}, so dx_r = dy_{r+1}, and dx_{P-1} = 0: the gradient takes the
    step back, from stage r + 1 to stage r (the stage's backward sends dx the reverse way)."""
    expect_dout("pipeline_hop_backward", dout, cache.shape, cache.dtype)
    return {"x": _hop(dout, cache.group, -1)}  # fwd: y_r = x_{r - 1}


def copy_to_group_forward(x, *, group):
    """Megatron's f, entering a tensor-parallel region: y_r = x, the identity.

    x is replicated: one logical value that every rank holds, each rank then computing its own
    part from it (its columns of a weight), so L = sum_r L_r(y_r) with every y_r = x, and
    dL/dx = sum_r dy_r: the backward all-reduces (and returns the same dx on every rank).
    Inputs: x (any shape). Returns: (y = x copied; GroupCache).
    """
    expect_float("copy_to_group", "x", x)
    return np.array(x, copy=True), GroupCache(group, x.shape, x.dtype)  # fwd: y_r = x


def copy_to_group_backward(dout, cache):
    """dx = sum_r dy_r (an all-reduce): see copy_to_group_forward."""
    expect_dout("copy_to_group_backward", dout, cache.shape, cache.dtype)
    return {"x": _all_reduce(dout, cache.group)}  # fwd: y_r = x (replicated)


def reduce_from_group_forward(x, *, group):
    """Megatron's g, leaving a tensor-parallel region: y = sum_s x_s, replicated.

    x_s are partial sums (rank s's rows of a weight); y is one logical value that every rank
    then holds and feeds to the same replicated computation, so the loss counts it once,
    L = L(y), and every rank's dy is that one dL/dy. With dy/dx_s = I, dx_s = dy: the backward
    is the identity (an all-reduce here would count the loss P times). f and g are duals: each
    one's forward is the other's backward.
    Inputs: x (any shape). Returns: (y, same shape; GroupCache).
    """
    expect_float("reduce_from_group", "x", x)
    y = _all_reduce(x, group)  # fwd: y = sum_s x_s
    return y, GroupCache(group, y.shape, y.dtype)


def reduce_from_group_backward(dout, cache):
    """dx_s = dy (the identity): see reduce_from_group_forward."""
    expect_dout("reduce_from_group_backward", dout, cache.shape, cache.dtype)
    return {"x": np.array(dout, copy=True)}  # fwd: y = sum_s x_s (replicated)
