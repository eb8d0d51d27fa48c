"""The distributed gradient check: finite differences of a global loss across ranks, for every
collective pair of scratchllm.dist. Run under MPI:

    mpiexec -n 2 python -m grads.mpi        (or -n 4; `python -m grads --mpi 2` launches it)

Rank r holds x_r and a random upstream gradient dout_r (never ones); the global loss is
L = sum_r <y_r, dout_r>, summed over the ranks. For every element i of every rank q's input,
all ranks run the forward with x_q[i] +- h (only rank q perturbs) and the central difference
(L+ - L-) / 2h must equal the backward's dx_q[i]. A replicated input (Megatron's f) is one
logical value: element i moves on every rank at once and every rank's dx must equal the
difference; a replicated output (g) is counted once in L. With --directions K, K random
directions instead (every rank moving at once). The check also compares the bytes each
collective counted with the ring algorithms' formulas, and (grads/mpi_train.py) trains a tiny
LM data parallel, plain and with ZeRO-1/2/3, against one process. Prints one line per check on
rank 0 and exits 1 (on every rank) if any fails.
"""
import argparse
import sys
from typing import NamedTuple

import numpy as np

from grads.mpi_train import balance_across_checks, expert_parallel_checks, training_checks
from scratchllm import dist

TOL = 1e-9


class Result(NamedTuple):
    name: str
    err: float
    ok: bool


def _loss(forward, arrays, dout, group, world, once, kw):
    y, _ = forward(**arrays, group=group, **kw)
    local = float(np.sum(y * dout))
    if once:  # a replicated output: count it on the group's first rank only
        local = local if group.rank == 0 else 0.0
    return world.sum_scalar(local)


def _probes(x, dx, world, rep_in, directions, rng):
    """(v, [the backward's directional derivatives]) per probe: v this rank's move of x. With
    directions=0, one probe per element of each rank's x (only that rank moves); else that
    many random directions, every rank moving at once. The backward's value is
    sum_r <dx_r, v_r>, or for a replicated x <dx_r, v> on every rank (each must match)."""
    if directions:
        seeds = np.random.default_rng(5)
        for _ in range(directions):
            v = (seeds if rep_in else rng).standard_normal(x.shape)
            local = float(np.sum(dx * v))
            yield v, _all_values(world, local) if rep_in else [world.sum_scalar(local)]
        return
    for q in ([0] if rep_in else range(world.size)):
        for i in range(world.broadcast(x.size, root=q)):
            v = np.zeros_like(x)
            if rep_in or world.rank == q:
                v.flat[i] = 1.0
            local = float(dx.flat[i]) if rep_in or world.rank == q else 0.0
            yield v, _all_values(world, local) if rep_in else [world.sum_scalar(local)]


def _all_values(world, value):
    return list(world.comm.allgather(value))


def dist_check(name, pair, arrays, group, world, *, rng, replicated=(), rep_out=False,
               directions=0, h=1e-3, tol=TOL, **kw):
    """Result of the finite-difference check of pair = (forward, backward) on arrays
    ({argument name: this rank's array}, each checked in turn); replicated: the names of the
    replicated inputs; rep_out: the output is replicated; directions: 0 for every element,
    else that many random directions; h: the step (1e-3 suits the collectives, linear in
    each input, whose difference is exact but for rounding; smaller for a curved loss); tol:
    the largest relative error that passes (1e-9 for the linear collectives; a pair with
    curvature, like the experts' SwiGLU, takes the grads cases' 1e-7).
    Every rank must call it."""
    forward, backward = pair
    y, cache = forward(**arrays, group=group, **kw)
    dout = (np.random.default_rng(7) if rep_out else rng).standard_normal(np.shape(y))
    grads = backward(dout, cache)
    worst = 0.0
    for key, a in arrays.items():
        for v, an in _probes(a, grads[key], world, key in replicated, directions, rng):
            def moved(step):
                return _loss(forward, dict(arrays, **{key: a + step * v}), dout, group, world,
                             rep_out, kw)
            fd = (moved(h) - moved(-h)) / (2 * h)
            worst = max(worst, max(abs(g - fd) for g in an) / max(abs(fd), 1.0))
    worst = world.sum_scalar(worst) / world.size
    return Result(name, worst, worst < tol)


def byte_checks(world):
    """[Result] comparing the counted bytes with the ring formulas, for a float64 array of
    n = 8 P elements on P ranks."""
    P, n = world.size, 8 * world.size
    x = np.ones(n)
    out = []
    for name, pair, want in (
            ("all_reduce", (dist.all_reduce_forward,), 2 * (P - 1) * x.nbytes // P),
            ("all_gather", (dist.all_gather_forward,), (P - 1) * x.nbytes),
            ("reduce_scatter", (dist.reduce_scatter_forward,), (P - 1) * x.nbytes // P),
            ("all_to_all", (dist.all_to_all_forward,), (P - 1) * x.nbytes // P),
            ("ring_shift", (dist.ring_shift_forward,), x.nbytes if P > 1 else 0),
            ("send", (dist.pipeline_hop_forward,), x.nbytes if world.rank < P - 1 else 0)):
        g = dist.Group(world.comm.Split(0, world.rank), "bytes")
        pair[0](x, group=g)
        got = g.sent[name]
        out.append(Result(f"bytes {name}: {got} sent, ring formula {want}", 0.0, got == want))
    return out


def run_checks(world, directions=0, seed=0):
    """[Result] of every collective pair on the world group (and on a sub-group of a 2-axis
    grid when the world splits in two)."""
    P, r = world.size, world.rank
    rng = np.random.default_rng([seed, r])
    std = rng.standard_normal
    # all-to-all-v: rank r sends (r + j) % 3 rows to rank j
    counts = [(r + j) % 3 for j in range(P)]
    vcounts = [(j + 1) % 3 for j in range(P)]  # rows per rank of the -v gathers (some 0)
    checks = [
        ("all_reduce", dist.all_reduce_forward, dist.all_reduce_backward, std((2, 3)), {}),
        ("all_gather (axis 1)", dist.all_gather_forward, dist.all_gather_backward,
         std((2, 3)), {"axis": 1}),
        ("reduce_scatter", dist.reduce_scatter_forward, dist.reduce_scatter_backward,
         std((2 * P, 3)), {}),
        ("all_gather (v: uneven counts)", dist.all_gather_forward, dist.all_gather_backward,
         std((vcounts[r], 2)), {"counts": vcounts}),
        ("reduce_scatter (v: uneven counts)", dist.reduce_scatter_forward,
         dist.reduce_scatter_backward, std((sum(vcounts), 2)), {"counts": vcounts}),
        ("all_to_all", dist.all_to_all_forward, dist.all_to_all_backward, std((P, 3)), {}),
        ("all_to_all (v: uneven counts)", dist.all_to_all_forward, dist.all_to_all_backward,
         std((sum(counts), 2)), {"counts": counts}),
        ("ring_shift (+1)", dist.ring_shift_forward, dist.ring_shift_backward, std((2, 3)), {}),
        ("ring_shift (-1)", dist.ring_shift_forward, dist.ring_shift_backward, std((3,)),
         {"shift": -1}),
        ("pipeline_hop (a pipeline's point-to-point step)", dist.pipeline_hop_forward,
         dist.pipeline_hop_backward, std((2, 3)), {}),
    ]
    out = [dist_check(name, (f, b), {"x": x}, world, world, rng=rng, directions=directions,
                      **kw) for name, f, b, x, kw in checks]
    shared = np.random.default_rng([seed, 99]).standard_normal((2, 3))
    out.append(dist_check("copy_to_group (f)", (dist.copy_to_group_forward,
                                                dist.copy_to_group_backward), {"x": shared},
                          world, world, rng=rng, replicated=("x",), directions=directions))
    out.append(dist_check("reduce_from_group (g)", (dist.reduce_from_group_forward,
                                                    dist.reduce_from_group_backward),
                          {"x": std((2, 3))}, world, world, rng=rng, rep_out=True,
                          directions=directions))
    if P % 2 == 0 and P > 2:
        grid = dist.RankGrid(dist.GridShape(dp=2, tp=P // 2), world)
        for axis in ("dp", "tp"):
            g = grid.groups[axis]
            out.append(dist_check(f"all_gather on the {axis} group of dp=2 x tp={P // 2}",
                                  (dist.all_gather_forward, dist.all_gather_backward),
                                  {"x": std((2, 3))}, g, world, rng=rng,
                                  directions=directions))
    return (out + tensor_parallel_checks(world, rng, directions) +
            ring_attention_checks(world, rng, directions) + cp_attention_checks(world, rng)
            + byte_checks(world))


def cp_attention_checks(world, rng):
    """[Result]: the context-parallel attention layer's distributed check on x (every rank's
    tokens move in turn; the weights the same on every rank), against GQA attention on the
    whole sequence (out and dx)."""
    from grads.cases.dist import cp_attention_inputs
    from scratchllm.attention import gqa_backward, gqa_forward
    from scratchllm.train.parallel_context import cp_attention_backward, cp_attention_forward
    P, r = world.size, world.rank
    x, w, spec = cp_attention_inputs(np.random.default_rng([19, r]), T=2)
    _, w, _ = cp_attention_inputs(np.random.default_rng(19), T=2)  # replicated
    out = [dist_check("cp_attention (GQA, RoPE at zig-zag positions, ring)",
                      (cp_attention_forward, cp_attention_backward), {"x": x}, world, world,
                      rng=rng, h=1e-5, tol=1e-7, w=w, spec=spec)]
    full, _, _ = cp_attention_inputs(np.random.default_rng(23), T=2 * P)
    dy = np.random.default_rng(29).standard_normal(full.shape)
    want, c_want = gqa_forward(full, w, spec=spec)
    dx_want = gqa_backward(dy, c_want)["x"]
    pos = dist.ring_positions(2 * P, P, zigzag=True)[r]
    got, c = cp_attention_forward(full[:, pos], w, spec=spec, group=world)
    dx = cp_attention_backward(dy[:, pos], c)["x"]
    err = max(float(np.abs(got - want[:, pos]).max()), float(np.abs(dx - dx_want[:, pos]).max()))
    err = max(world.comm.allgather(err))
    return out + [Result("cp_attention == gqa on the whole sequence (out, dx)", err,
                         err < 1e-12)]


def ring_attention_checks(world, rng, directions):
    """[Result]: ring attention's distributed gradient check (plain, causal, causal zig-zag),
    and its output and every gradient against one-process sdpa on the whole sequence."""
    from scratchllm.attention import sdpa_backward, sdpa_forward
    from scratchllm.specs import Mask
    P, r, std = world.size, world.rank, rng.standard_normal
    out = []
    for causal, zigzag in ((False, False), (True, False), (True, True)):
        what = "causal" if causal else "not causal"
        what += ", zig-zag" if zigzag else ""
        out.append(dist_check(f"ring_attention ({what})", (dist.ring_attention_forward,
                                                          dist.ring_attention_backward),
                              {"q": std((1, 2, 2, 3)), "k": std((1, 2, 2, 3)),
                               "v": std((1, 2, 2, 3))}, world, world, rng=rng,
                              directions=directions, h=1e-5, causal=causal, zigzag=zigzag))
        shared = np.random.default_rng(17)
        T = 4 * P
        full = {n: shared.standard_normal((2, 2, T, 3)) for n in ("q", "k", "v")}
        dout = shared.standard_normal((2, 2, T, 3))
        want, cache = sdpa_forward(full["q"], full["k"], full["v"],
                                   Mask(causal=True) if causal else None)
        grads = sdpa_backward(dout, cache)
        pos = dist.ring_positions(T, P, zigzag)[r]
        got, c = dist.ring_attention_forward(*(full[n][:, :, pos] for n in ("q", "k", "v")),
                                             group=world, causal=causal, zigzag=zigzag)
        back = dist.ring_attention_backward(dout[:, :, pos], c)
        err = max([float(np.abs(got - want[:, :, pos]).max())] +
                  [float(np.abs(back[n] - grads[n][:, :, pos]).max()) for n in ("q", "k", "v")])
        err = max(world.comm.allgather(err))
        out.append(Result(f"ring_attention ({what}) == sdpa on the whole sequence (out, dq, "
                          f"dk, dv)", err, err < 1e-12))
    return out


def tensor_parallel_checks(world, rng, directions):
    """[Result] of the column- and row-parallel Linear pairs (x, W, b each), and of column
    then row (a Megatron MLP without its activation) against the one-process linear."""
    P, std = world.size, rng.standard_normal
    shared = np.random.default_rng(11)  # the replicated arrays: the same on every rank
    x, b_row = shared.standard_normal((2, 3)), shared.standard_normal(4)
    out = [dist_check("column_linear", (dist.column_linear_forward,
                                         dist.column_linear_backward),
                      {"x": x, "W": std((3, 2)), "b": std(2)}, world, world, rng=rng,
                      replicated=("x",), directions=directions),
           dist_check("row_linear", (dist.row_linear_forward, dist.row_linear_backward),
                      {"x": std((2, 2)), "W": std((2, 4)), "b": b_row}, world, world, rng=rng,
                      replicated=("b",), rep_out=True, directions=directions)]
    ids = shared.integers(0, 3 * P, (2, 2 * P))  # a vocabulary of 3 rows per rank
    out += [dist_check("vocab_embedding", (dist.vocab_embedding_forward,
                                           dist.vocab_embedding_backward),
                       {"E": std((3, 4))}, world, world, rng=rng, rep_out=True,
                       directions=directions, ids=ids),
            dist_check("vocab_embedding (sequence parallel: reduce-scatter along T)",
                       (dist.vocab_embedding_forward, dist.vocab_embedding_backward),
                       {"E": std((3, 4))}, world, world, rng=rng, directions=directions,
                       ids=ids, sequence=True),
            dist_check("vocab_cross_entropy", (dist.vocab_cross_entropy_forward,
                                               dist.vocab_cross_entropy_backward),
                       {"logits": std((2, 3, 3))}, world, world, rng=rng, rep_out=True,
                       directions=directions, h=1e-5, targets=shared.integers(0, 3 * P, (2, 3)))]
    W1, W2 = shared.standard_normal((3, 2 * P)), shared.standard_normal((2 * P, 4))
    h, _ = dist.column_linear_forward(x, *dist.split_columns(W1, None, world), group=world)
    y, _ = dist.row_linear_forward(h, dist.split_rows(W2, world), b_row, group=world)
    err = float(np.abs(y - (x @ W1 @ W2 + b_row)).max())
    out.append(Result("column then row == the one-process x W1 W2 + b", err, err < 1e-12))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(prog="mpiexec -n P python -m grads.mpi",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--directions", type=int, default=0, help="random directions per "
                        "check instead of every element (cheaper on many ranks)")
    args = parser.parse_args(argv)
    world = dist.Group.world()
    results = (run_checks(world, args.directions) + training_checks(world) +
               expert_parallel_checks(world, np.random.default_rng([3, world.rank]),
                                      dist_check) + balance_across_checks(world, dist_check))
    if world.rank == 0:
        for res in results:
            print(f"{'ok  ' if res.ok else 'FAIL'}  {res.name}  (max rel err {res.err:.1e}, "
                  f"{world.size} ranks)")
        print(f"{sum(r.ok for r in results)}/{len(results)} distributed checks pass")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
