"""Where one training step of a preset spends its time: cProfile over Run.train_step (the step
of `python -m scratchllm train`), one shard on one thread so the profile sees every call.

    flock /tmp/scratchllm-bench.lock python benchmarks/profile_train.py [--preset dense]
        [--steps 10] [--top 30] [--cpu] [--batch 16 --seq 128]     (SCRATCHLLM_READABLE=1: the readable pairs)
        [--first]   (the model and settings of `python -m scratchllm train`:
                     settings.first_run_model, settings.first_run's weight decay, batch 8)

Prints the functions with the most own time (tottime) and the pairs' cumulative times, and
the step's minor page faults and system time (fresh pages the kernel zero-fills: what
core/heap.py keeps away). --cpu times the profile in this process's CPU seconds
(time.process_time) instead of wall seconds: on a shared machine the CPU time of one thread
moves much less with the load. cProfile's own cost per call inflates the share of small
Python functions (a generator's every resume is a call): time those outside it.
"""
import argparse
import cProfile
import os
import pstats
import resource
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="dense")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--cpu", action="store_true", help="profile in CPU seconds, not wall")
    p.add_argument("--batch", type=int, default=None,
                   help="sequences a step (default 16; the first run's 8 with --first)")
    p.add_argument("--seq", type=int, default=128, help="tokens a sequence")
    p.add_argument("--first", action="store_true",
                   help="the first run's model and settings (batch 8 unless --batch)")
    args = p.parse_args()
    import numpy as np
    from scratchllm.lm import preset
    from scratchllm.train import Run, Settings
    from scratchllm.train.settings import first_run, first_run_model
    cfg = first_run_model() if args.first else preset(args.preset)
    batch = args.batch or (8 if args.first else 16)
    wd = first_run().weight_decay if args.first else Settings().weight_decay
    run = Run(cfg, Settings(batch_size=batch, seq_len=args.seq, steps=10 ** 6, threads=1,
                            weight_decay=wd))
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 100_000)
    for _ in range(2):  # compile and warm up
        run.train_step(ids)
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    prof = cProfile.Profile(time.process_time) if args.cpu else cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        run.train_step(ids)
    prof.disable()
    wall = (time.perf_counter() - t0) / args.steps
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / args.steps
    print(f"{'first run' if args.first else args.preset}: {wall * 1e3:.1f} ms per step, {cpu * 1e3:.1f} ms CPU (1 thread, "
          f"under cProfile), readable={os.environ.get('SCRATCHLLM_READABLE', '')!r}; "
          f"{(r1.ru_minflt - r0.ru_minflt) / args.steps:,.0f} minor page faults and "
          f"{(r1.ru_stime - r0.ru_stime) / args.steps * 1e3:.1f} ms system time a step; "
          f"load {os.getloadavg()[0]:.1f}")
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(r"(forward|backward|update|step)", args.top)


if __name__ == "__main__":
    main()
