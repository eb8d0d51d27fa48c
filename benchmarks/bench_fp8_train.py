"""FP8 training against float32: the same preset, seed, batches and steps, one run with every
Linear but the head in FP8 matmuls (core/fp8.py: e4m3 on 1 x 128 / 128 x 128 scales, e5m2
gradients, float32 master weights), one in float32; both loss curves on one plot.

    flock /tmp/scratchllm-bench.lock python benchmarks/bench_fp8_train.py \
        [--preset dense] [--steps 600] [--out runs/fp8_vs_fp32.png] [--cache runs/cache]

Prints per run: the final train loss (mean of the last 20 steps), the validation loss, the
median step time; and the largest gap between the two curves (smoothed over 20 steps).
"""
import argparse
import os
import sys

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

from scratchllm.lm import preset  # noqa: E402
from scratchllm.train import corpus  # noqa: E402
from scratchllm.train.settings import Settings  # noqa: E402
from scratchllm.train.trainer import Run, fit  # noqa: E402


def smooth(x, n=20):
    x = np.asarray(x, float)
    return np.convolve(x, np.ones(n) / n, mode="valid") if len(x) >= n else x


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="dense")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--out", default="runs/fp8_vs_fp32.png")
    p.add_argument("--cache", default="runs/cache")
    args = p.parse_args(argv)
    cfg = preset(args.preset)
    tok, ids, _ = corpus.prepare(corpus.DEFAULT_CORPUS, cfg.vocab_size, args.cache)
    train_ids, val_ids = corpus.split(ids)
    curves = {}
    for label, fp8 in (("float32", False), ("fp8", True)):
        s = Settings(steps=args.steps, eval_every=args.steps, fp8=fp8)
        run = Run(cfg, s)
        eval_set = corpus.eval_batches(val_ids, s.batch_size, s.seq_len, s.eval_tokens)
        fit(run, train_ids, None, progress=True, eval_set=eval_set, log=print)
        val = run.evaluate(eval_set)
        run.dp.close()
        curves[label] = run.losses
        print(f"{label:8s} train {np.mean(run.losses[-20:]):.4f}  val {val:.4f}  "
              f"median step {1e3 * np.median(run.step_seconds):.0f} ms", flush=True)
    gap = np.abs(smooth(curves["fp8"]) - smooth(curves["float32"]))
    print(f"largest gap of the 20-step means: {gap.max():.4f} nats (at step {gap.argmax() + 20})")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (label, losses) in enumerate(curves.items()):
        ax.plot(np.arange(1, len(losses) + 1), losses, color=f"C{i}", alpha=0.2)
        ax.plot(np.arange(20, len(losses) + 1), smooth(losses), color=f"C{i}",
                label=f"{label} (20-step mean)")
    ax.set(xlabel="step", ylabel="train loss (nats/token)",
           title=f"{args.preset}: FP8 matmuls against float32, same seed and batches")
    ax.legend()
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    fig.savefig(args.out, dpi=120, bbox_inches="tight")
    print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
