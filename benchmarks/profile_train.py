"""Where one training step of a preset spends its time: cProfile over Run.train_step (the step
of `python -m scratchllm train`), one shard on one thread so the profile sees every call.

    flock /tmp/scratchllm-bench.lock python benchmarks/profile_train.py [--preset dense]
        [--steps 10] [--top 30]        (SCRATCHLLM_READABLE=1: the readable pairs)

Prints the functions with the most own time (tottime) and the pairs' cumulative times.
"""
import argparse
import cProfile
import os
import pstats
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="dense")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    import numpy as np
    from scratchllm.lm import preset
    from scratchllm.train import Run, Settings
    cfg = preset(args.preset)
    run = Run(cfg, Settings(steps=10 ** 6, threads=1))
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 100_000)
    for _ in range(2):  # compile and warm up
        run.train_step(ids)
    t0 = time.perf_counter()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        run.train_step(ids)
    prof.disable()
    wall = (time.perf_counter() - t0) / args.steps
    print(f"{args.preset}: {wall * 1e3:.1f} ms per step (1 thread, under cProfile), "
          f"readable={os.environ.get('SCRATCHLLM_READABLE', '')!r}")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(r"(forward|backward|update|step)", args.top)


if __name__ == "__main__":
    main()
