"""Training steps across ranks against one process, in float64, on a tiny dense LM: the ranks
of a data-parallel group (plain, and ZeRO stages 1, 2 and 3) must reach the parameters one
process reaches on the whole batch, and send the bytes the communication model predicts.
Part of `mpiexec -n P python -m grads.mpi` (grads/mpi.py), so the fast test tier's one
2-rank run covers the collectives' gradients and a training equivalence together."""
from typing import NamedTuple

import numpy as np

from grads.cases.lm import lm_tiny

TOL = 1e-12
STEPS = 3


class TrainResult(NamedTuple):
    name: str
    err: float
    ok: bool


def _train(cfg, settings, ids, grid=None, zero=0):
    """(the run's Params after STEPS steps, bytes rank 0 sent in the last step, predicted)."""
    from scratchllm.train.trainer import Run
    run = Run(cfg, settings, np.float64, grid=grid, zero=zero)
    for _ in range(STEPS):
        run.train_step(ids)
    if run.shards is not None:
        run.shards.gather_all()
    return run.model.parameters(), run.sent[-1], sum(run.comm_model.values())


def training_checks(world):
    """[TrainResult]: dp=P with ZeRO 0-3 against one process (every rank computes the
    one-process run too), and predicted against counted bytes."""
    from scratchllm import dist
    from scratchllm.train.trainer import Settings
    cfg = lm_tiny("dense")
    s = Settings(steps=STEPS, batch_size=world.size + 1, seq_len=6, warmup=1, threads=1,
                 seed=3)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 400)
    one, _, _ = _train(cfg, s, ids)
    out = []
    for zero in (0, 1, 2, 3):
        grid = dist.RankGrid(dist.GridShape(dp=world.size), world)
        params, sent, predicted = _train(cfg, s, ids, grid, zero)
        err = max(float(np.abs(p.data - q.data).max() / np.abs(q.data).max())
                  for p, q in zip(params, one))
        err = max(world.comm.allgather(err))
        what = f"ZeRO-{zero}" if zero else "plain"
        out.append(TrainResult(f"train dp={world.size} ({what}) == one process, {STEPS} steps "
                               f"of batch {s.batch_size}", err, err <= TOL))
        same = all(world.comm.allgather(sent == predicted))
        out.append(TrainResult(f"bytes dp={world.size} ({what}): {sent:,} sent by rank "
                               f"{world.rank}, model {predicted:,}", 0.0, same))
    return out
