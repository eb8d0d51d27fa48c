"""Training steps across ranks against one process, in float64, on a tiny dense LM: the ranks
of a data-parallel group (plain, and ZeRO stages 1, 2 and 3) and of a tensor-parallel one
(Megatron, with and without sequence parallelism; and a dp x tp grid on 4 ranks), a context-
parallel one (ring attention over zig-zag chunks), an expert-parallel one (an MoE with capacity
drops) and a pipeline must reach the parameters one process reaches on the whole batch, and
send the bytes the communication model predicts.
Part of `mpiexec -n P python -m grads.mpi` (grads/mpi.py), so the fast test tier's one
2-rank run covers the collectives' gradients and a training equivalence together."""
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from grads.cases.lm import lm_tiny

TOL = 1e-12
STEPS = 3


class TrainResult(NamedTuple):
    name: str
    err: float
    ok: bool


def _train(cfg, settings, ids, grid=None, zero=0, sequence=False, pipeline=("1f1b", 0)):
    """(the run's whole Params after STEPS steps, bytes this rank sent in the last step,
    predicted)."""
    from scratchllm.train import parallel_run
    from scratchllm.train.trainer import Run
    run = Run(cfg, settings, np.float64, grid=grid, zero=zero, sequence=sequence,
              pipeline=pipeline)
    for _ in range(STEPS):
        run.train_step(ids)
    with parallel_run.whole_on_root(run, run.opt.state_dict()) as (model, _):
        # the whole model on rank 0 alone, as a checkpoint gathers it (None elsewhere)
        params = None if model is None else [p.data.copy() for p in model.parameters()]
    return params, run.sent[-1], parallel_run.predicted_sent(run)  # (ep: from the routing)


def _compare(world, name, got, one):
    params, sent, predicted = got  # params: on world rank 0 only
    err = 0.0 if params is None else max(float(np.abs(p - q).max() / np.abs(q).max())
                                         for p, q in zip(params, one))
    err = max(world.comm.allgather(err))
    same = all(world.comm.allgather(sent == predicted))
    return [TrainResult(f"train {name} == one process, {STEPS} steps", err, err <= TOL),
            TrainResult(f"bytes {name}: {sent:,} sent by rank {world.rank}, model "
                        f"{predicted:,}", 0.0, same)]


def training_checks(world):
    """[TrainResult]: dp=P with ZeRO 0-3 against one process (every rank computes the
    one-process run too), and predicted against counted bytes."""
    from scratchllm import dist
    from scratchllm.train.settings import Settings
    cfg = lm_tiny("dense", vocab_size=24)
    P = world.size
    s = Settings(steps=STEPS, batch_size=P + 1, seq_len=8, warmup=1, threads=1, seed=3)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 400)
    one, _, _ = _train(cfg, s, ids)
    out = []
    for zero in (0, 1, 2, 3):
        grid = dist.RankGrid(dist.GridShape(dp=P), world)
        what = f"ZeRO-{zero}" if zero else "plain"
        out += _compare(world, f"dp={P} ({what})", _train(cfg, s, ids, grid, zero), one)
    # the tiny model's 2 KV heads split over 2 ranks at most: tp=2, and dp x tp=2 beyond
    shapes = [dist.GridShape(dp=P // 2, tp=2)] if P % 2 == 0 else []
    for shape in shapes:
        for sequence in (False, True):
            grid = dist.RankGrid(shape, world)
            name = shape.describe() + (" (sequence parallel)" if sequence else "")
            out += _compare(world, name, _train(cfg, s, ids, grid, sequence=sequence), one)
    out += _balance_across_training(world, s, ids)
    grid = dist.RankGrid(dist.GridShape(cp=P), world)  # zig-zag chunks of T = 8 (2P | 8)
    out += _compare(world, f"cp={P} (ring attention)", _train(cfg, s, ids, grid), one)
    two = _train(cfg, replace(s, threads=2), ids)[0]  # (each thread's ring on its own twin
    out += _compare(world, f"cp={P}, 2 threads", _train(cfg, replace(s, threads=2), ids, grid),
                    two)  # of the group)
    for shape, zero in ([(dist.GridShape(dp=2, cp=P // 2), 1),
                         (dist.GridShape(dp=2, tp=P // 2), 1)] if P >= 4 else []):
        out += _compare(world, f"{shape.describe()} (ZeRO-{zero})",
                        _train(cfg, s, ids, dist.RankGrid(shape, world), zero), one)
    if P >= 4:  # ZeRO-1 over the data-parallel ranks of each pipeline stage
        shape = dist.GridShape(dp=2, pp=P // 2)
        out += _compare(world, f"{shape.describe()} (ZeRO-1, 1f1b, 2 micro-batches)",
                        _train(cfg, s, ids, dist.RankGrid(shape, world), 1, pipeline=("1f1b",
                                                                                       2)), one)
    out += _expert_parallel_training(world, s, ids)
    for shape in [dist.GridShape(dp=P // 2, pp=2)] + ([dist.GridShape(tp=2, pp=P // 2)]
                                                      if P >= 4 else []) if P % 2 == 0 else []:
        for schedule in ("gpipe", "1f1b"):
            grid = dist.RankGrid(shape, world)
            out += _compare(world, f"{shape.describe()} ({schedule}, 2 micro-batches)",
                            _train(cfg, s, ids, grid, pipeline=(schedule, 2)), one)
    return out


def expert_parallel_checks(world, rng, check):
    """[TrainResult]: the expert-parallel experts pair (2 experts per rank, uneven rows per
    expert, one expert with none) through the distributed check (`check`: grads.mpi's
    dist_check), and against the one-process experts pair with every expert's weights."""
    from scratchllm.moe.experts import experts_backward, experts_forward
    from scratchllm.train.expert_parallel import (expert_parallel_backward,
                                                  expert_parallel_forward)
    P, r, std = world.size, world.rank, rng.standard_normal
    E = 2 * P
    counts = (np.arange(E) + r) % 3  # rows per expert on this rank (some 0)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    xs = std((int(bounds[-1]), 3))
    out = [check("expert_parallel (dispatch, experts, combine)",
                 (expert_parallel_forward, expert_parallel_backward),
                 {"xs": xs, "w1": std((2, 3, 4)), "w3": std((2, 3, 4)), "w2": std((2, 4, 3))},
                 world, world, rng=rng, h=1e-5, tol=1e-7, bounds=bounds)]
    shared = np.random.default_rng(23)
    W = [shared.standard_normal(s) for s in ((E, 3, 4), (E, 3, 4), (E, 4, 3))]
    mine = slice(2 * r, 2 * r + 2)
    ys, cache = expert_parallel_forward(xs, bounds, *(w[mine] for w in W), group=world)
    want, ref = experts_forward(xs, bounds, *W)
    dys = std(ys.shape)
    g, g_ref = expert_parallel_backward(dys, cache), experts_backward(dys, ref)
    err = max(float(np.abs(ys - want).max()), float(np.abs(g["xs"] - g_ref["xs"]).max()))
    for name in ("w1", "w3", "w2"):  # every rank's rows reach the owner's experts
        total = np.asarray(world.comm.allreduce(g_ref[name]))
        err = max(err, float(np.abs(g[name] - total[mine]).max()))
    err = max(world.comm.allgather(err))
    return out + [TrainResult(f"expert_parallel == the one-process experts ({E} experts on {P} "
                              f"ranks: outputs, dxs, every expert's weight gradients)", err,
                              err < 1e-12)]


def _expert_parallel_training(world, s, ids):
    """ep=P on the tiny MoE (4 experts; capacity factor 0.6, so slots are dropped) against
    one process on one data shard: the parameters, and the bytes sent against the model's
    with the all-to-alls and gathers sized from the step's routing (expert_bytes)."""
    from scratchllm import dist
    cfg = lm_tiny("moe", vocab_size=24)
    cfg = replace(cfg, layers=tuple(replace(ls, ffn=replace(ls.ffn, capacity_factor=0.6))
                                    for ls in cfg.layers))
    one, _, _ = _train(cfg, s, ids)
    grid = dist.RankGrid(dist.GridShape(ep=world.size), world)
    out = _compare(world, f"ep={world.size} (capacity drops)", _train(cfg, s, ids, grid),
                   one)
    # two data-parallel threads per rank, each on its twin of the group: one process on
    # two threads (two shards' aux losses and capacities)
    two, _, _ = _train(cfg, replace(s, threads=2), ids)
    out += _compare(world, f"ep={world.size}, 2 threads", _train(cfg, replace(s, threads=2),
                                                              ids, grid), two)
    if world.size >= 4:  # dp x ep: ep=P/2 ranks of each rank's slice equal one process on
        # two shards (the aux losses per data-parallel rank)
        grid2 = dist.RankGrid(dist.GridShape(dp=2, ep=world.size // 2), world)
        out += _compare(world, f"dp=2 x ep={world.size // 2} (ZeRO-1; 2 shards)",
                        _train(cfg, s, ids, grid2, 1), two)
    return out + [_drops(world, cfg, grid)]


def _drops(world, cfg, grid):
    """The slots each MoE layer drops at capacity, counted on every expert-parallel rank, are
    the one-process layer's (and some are dropped), the loss the same."""
    from scratchllm.lm import LM
    from scratchllm.train.parallel_moe import ExpertParallelLM
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, cfg.vocab_size, (2, 2, 8))
    ep = ExpertParallelLM(cfg, grid.groups["ep"], rng=np.random.default_rng(3),
                          dtype=np.float64)
    (a, c_a), (b, c_b) = ep.loss(x, y), LM(cfg, rng=np.random.default_rng(3),
                                            dtype=np.float64).loss(x, y)
    drops = [c.ffn.inner.n_dropped for c in c_a.lm.blocks]
    want = [c.ffn.inner.n_dropped for c in c_b.lm.blocks]
    same = all(world.comm.allgather(drops == want)) and sum(want) > 0
    err = max(world.comm.allgather(float(abs(a - b) / abs(b))))
    return TrainResult(f"ep={world.size} drops {drops} slots per layer at capacity factor "
                       f"0.6, one process {want}", err, same and err < 1e-12)


def _balance_across_training(world, s, ids):
    """dp=P with the balance loss across the ranks (--balance-across-ranks) against one
    process on one data shard (whose balance loss is over the whole batch): equal, and its
    all-reduces in the communication model."""

    from scratchllm import dist
    cfg = lm_tiny("moe", vocab_size=24)
    one, _, _ = _train(cfg, s, ids)
    grid = dist.RankGrid(dist.GridShape(dp=world.size), world)
    across = replace(s, balance_across=True)
    return _compare(world, f"dp={world.size} (MoE, balance loss across the ranks; one "
                    f"process on one shard)", _train(cfg, across, ids, grid), one)


def balance_across_checks(world, check):
    """[TrainResult]: the across-ranks balance loss pair through the distributed check, and
    the chapters' point in numbers: rank r's tokens prefer experts 2r and 2r + 1, so the
    batch is balanced as a whole (the loss across ranks near 1) while every micro-batch uses
    half the experts (its own loss near 2)."""
    from scratchllm.moe.losses import balance_loss_forward
    from scratchllm.train.parallel_moe import (balance_loss_across_backward,
                                               balance_loss_across_forward)
    P, r = world.size, world.rank
    E = 2 * P
    rng = np.random.default_rng([31, r])
    s = rng.standard_normal((8, E))
    s[:, 2 * r:2 * r + 2] += 4.0  # this rank's favourites
    probs = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    top = np.argsort(-probs, axis=1)[:, :2]
    out = [check("balance_loss_across (counts and probabilities all-reduced)",
                 (balance_loss_across_forward, balance_loss_across_backward),
                 {"probs": probs}, world, world, rng=rng, h=1e-6, tol=1e-7, topk_idx=top)]
    mine = float(balance_loss_forward(probs, top)[0])
    whole = float(balance_loss_across_forward(probs, top, group=world)[0])
    mean_mine = world.sum_scalar(mine) / P
    ok = mean_mine > 1.5 and whole < 1.1
    return out + [TrainResult(f"balance loss per micro-batch {mean_mine:.2f} (mean over {P} "
                              f"ranks) vs across the ranks {whole:.2f}: only the per-shard "
                              f"loss sees each rank using {2} of {E} experts", 0.0, ok)]
