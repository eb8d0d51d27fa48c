"""Tokens/s of the dense preset (float32, batch 16 x 128, median of steps 6-40) trained three
ways on a 2-core machine: one process on one thread (BLAS too), one process on two data-parallel
threads, and two MPI ranks of one thread each:

    python benchmarks/bench_dp.py t1 DATA
    python benchmarks/bench_dp.py t2 DATA
    mpiexec -n 2 python benchmarks/bench_dp.py dp2 DATA
    mpiexec -n 2 python benchmarks/bench_dp.py tp2 DATA     (tensor parallel: heads, SwiGLU
                                                             units and the vocabulary split)
    mpiexec -n 2 python benchmarks/bench_dp.py cp2 DATA     (context parallel: ring attention)
    python benchmarks/bench_dp.py m1 DATA                   (the moe preset, one thread)
    mpiexec -n 2 python benchmarks/bench_dp.py ep2 DATA     (the moe preset, experts split)

Peak memory per rank (the line `train` prints under MPI) on a preset widened by flat-name
overrides, so that the weights outweigh the interpreter's ~250 MiB:

    mpiexec -n 2 python benchmarks/bench_dp.py mem dense d_model=768,d_ff=2048,n_layers=8 \
        --dp 2 --zero 3 --steps 2 ...        (every other argument is `train`'s)
"""
import sys

import numpy as np

from scratchllm import dist
from scratchllm.lm import preset
from scratchllm.train import corpus, set_blas_threads
from scratchllm.train.settings import Settings
from scratchllm.train.trainer import Run


def main(mode, data):
    shapes = {"dp2": dist.GridShape(dp=2), "tp2": dist.GridShape(tp=2),
              "cp2": dist.GridShape(cp=2), "ep2": dist.GridShape(ep=2)}
    grid = dist.RankGrid(shapes[mode], dist.Group.world()) if mode in shapes else None
    if mode in ("t1", "m1"):
        set_blas_threads(1)
    _, ids, _ = corpus.prepare(data, 1024, "runs/cache")
    s = Settings(steps=40, batch_size=16, seq_len=128, threads=2 if mode == "t2" else 1,
                 warmup=5)
    run = Run(preset("moe" if mode in ("m1", "ep2") else "dense"), s, np.float32, grid=grid)
    for _ in range(s.steps):
        run.train_step(ids)
    med = float(np.median(run.step_seconds[5:]))
    if grid is None or grid.is_first():
        print(f"{mode}: median step {med * 1000:.0f} ms, {16 * 128 / med:,.0f} tokens/s")


def memory(name, overrides, flags):
    """`train --preset name flags` with the preset's flat-name overrides ("k=v,k=v")."""
    from scratchllm.cli import train
    widened = dict((k, int(v)) for k, v in (kv.split("=") for kv in overrides.split(",")))
    train.preset = lambda n: preset(n, **widened)  # the command reads its config from here
    return train.main(["--preset", name, *flags])


if __name__ == "__main__":
    if sys.argv[1] == "mem":
        sys.exit(memory(sys.argv[2], sys.argv[3], sys.argv[4:]))
    main(sys.argv[1], sys.argv[2])
