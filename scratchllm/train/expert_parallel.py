"""Expert parallelism (GShard, Lepikhin et al. 2020, arXiv:2006.16668; Switch Transformer,
Fedus et al. 2021, arXiv:2101.03961): the E experts of an MoE layer split over the P ranks of a
group, rank r owning experts r E/P .. (r+1) E/P - 1, each rank routing its own tokens. The
experts pair of moe/experts.py runs on rows sorted by expert; across ranks the same rows take
two all-to-alls:

    dispatch   rows for the experts of rank j (a contiguous run, being sorted) go to rank j
               (all_to_all_forward with those counts); rank j regroups what it received by
               its local expert (from every source) and runs them
    combine    the outputs go back to where their rows came from: the reverse all-to-all

The backward of each all-to-all is the reverse all-to-all (collectives.py), so the gradients of
the outputs take the dispatch's path and the inputs' gradients the combine's: two all-to-alls
again. The experts' weight gradients stay with their owner, summed over every rank's tokens.
The capacity cut happens before (moe/experts.py's dispatch keeps at most C rows per expert),
so dropped slots never travel.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_int,
                                      expect_ndim, expect_shape)
from scratchllm.dist import all_to_all_backward, all_to_all_forward
from scratchllm.moe.experts import experts_backward, experts_forward


class ExpertParallelCache(NamedTuple):
    send: object     # the dispatch all-to-all's cache
    order: np.ndarray  # received rows -> grouped by local expert
    experts: object  # experts_forward's cache
    back: object     # the combine all-to-all's cache


def _plan(bounds, E_local, group):
    """(rows sent to each rank, this rank's received rows regrouped by local expert: the
    permutation, and the local experts' slice edges)."""
    P = group.size
    counts = np.diff(bounds)  # (E,) rows per expert on this rank
    send = [int(counts[j * E_local:(j + 1) * E_local].sum()) for j in range(P)]
    mine = [counts[j * E_local:(j + 1) * E_local].tolist() for j in range(P)]
    got = np.array(group.comm.alltoall(mine), dtype=np.int64).reshape(P, E_local)  # (src, e)
    # received rows are source-major (each source's rows expert-sorted): regroup expert-major
    starts = np.concatenate(([0], np.cumsum(got.ravel())[:-1])).reshape(P, E_local)
    order = np.concatenate([np.arange(starts[s, e], starts[s, e] + got[s, e])
                            for e in range(E_local) for s in range(P)] or
                           [np.zeros(0, np.int64)]).astype(np.int64)
    local_bounds = np.concatenate(([0], np.cumsum(got.sum(axis=0)))).astype(np.int64)
    return send, order, local_bounds


def _check(fn, xs, bounds, weights, group):
    """xs (M, D) float; w1, w3 (E/P, D, F), w2 (E/P, F, D) float; bounds (E+1,) ints from 0
    to M, non-decreasing, E = E/P x the group's ranks. Returns E/P."""
    w1, w3, w2 = weights
    expect_float(fn, "xs", xs)
    expect_ndim(fn, "xs", xs, 2, "(M, D)")
    for name, w in (("w1", w1), ("w3", w3), ("w2", w2)):
        expect_float(fn, name, w)
    expect_shape(fn, "w1", w1, (None, xs.shape[1], None), "(E/P, D, F)")
    E_local, _, F = w1.shape
    expect_shape(fn, "w3", w3, w1.shape, "(E/P, D, F) like w1")
    expect_shape(fn, "w2", w2, (E_local, F, xs.shape[1]), "(E/P, F, D)")
    expect_int(fn, "bounds", bounds)
    expect_shape(fn, "bounds", bounds, (E_local * group.size + 1,),
                 f"(E + 1,): {E_local} experts per rank x {group.size} ranks, + 1")
    if bounds[0] != 0 or bounds[-1] != len(xs) or (np.diff(bounds) < 0).any():
        raise ValueError(f"{fn}: bounds must rise from 0 to the {len(xs)} rows of xs, got "
                         f"{bounds.tolist()}")
    return E_local


def expert_parallel_forward(xs, bounds, w1, w3, w2, *, group):
    """experts_forward across the ranks of group: this rank's rows xs (M, D) sorted by
    (global) expert with bounds (E+1,), its experts' weights w1/w3 (E/P, D, F), w2 (E/P, F, D).
    Returns: (ys (M, D), the rows' outputs in xs's order; ExpertParallelCache)."""
    xs, w1, w3, w2 = common_float(xs, w1, w3, w2)
    E_local = _check("expert_parallel", xs, bounds, (w1, w3, w2), group)
    send, order, local_bounds = _plan(np.asarray(bounds), E_local, group)
    recv, c_send = all_to_all_forward(xs, group=group, counts=send)  # fwd: dispatch
    ys_local, c_exp = experts_forward(recv[order], local_bounds, w1, w3, w2)  # fwd: experts
    back = np.empty_like(ys_local)
    back[order] = ys_local  # fwd: undo the regrouping
    ys, c_back = all_to_all_forward(back, group=group, counts=c_send.recv)  # fwd: combine
    return ys, ExpertParallelCache(c_send, order, c_exp, c_back)


def expert_parallel_backward(dys, cache):
    """The combine's backward (the reverse all-to-all) brings each output's gradient to its
    expert's owner, the experts' backward runs there (weight gradients summed over every
    rank's rows), and the dispatch's backward takes the inputs' gradients home."""
    expect_dout("expert_parallel_backward", dys, cache.back.shape, cache.back.dtype,
                name="dys")
    d_back = all_to_all_backward(dys, cache.back)["x"]  # fwd: combine
    g = experts_backward(d_back[cache.order], cache.experts)  # fwd: experts on regrouped rows
    d_recv = np.empty_like(g["xs"])
    d_recv[cache.order] = g["xs"]  # fwd: recv[order]
    dxs = all_to_all_backward(d_recv, cache.send)["x"]  # fwd: dispatch
    return {"xs": dxs, "w1": g["w1"], "w3": g["w3"], "w2": g["w2"]}
