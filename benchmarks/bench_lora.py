"""Benchmark: what LoRA fine-tuning spends on the frozen weights' gradients.

Usage:  flock /tmp/scratchllm-bench.lock python benchmarks/bench_lora.py [--reps 10]
            [--d-model 256] [--layers 4] [--batch 8] [--seq 128] [--vocab 4096]

finetune --lora (scratchllm/train/lora.py) runs the model's own backward under
core/frozen.py's frozen_weights, so the linear pair skips the weight gradient x^T dy of every
projection but the targets. This times one LoRA step (merge, forward, backward, the adapters'
gradients; rank 8 on q_proj, v_proj) on a dense preset with every gradient computed and with
the frozen ones skipped, and the frozen weights' dW matmuls alone at the step's shapes (every
projection that is not a target, and the head; float32, one thread; median CPU time, the
two steps in turn): what skipping can save.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from scratchllm.core.frozen import frozen_weights  # noqa: E402
from scratchllm.hub.peft import LoRA  # noqa: E402
from scratchllm.lm import LM, preset  # noqa: E402


def median_s(fns, reps):
    """Median CPU seconds of each function (one thread: CPU time is what a loaded machine
    stretches least), the functions run in turn so that they share the load."""
    for fn in fns:
        fn()  # warm
    times = [[] for _ in fns]
    for _ in range(reps):
        for fn, ts in zip(fns, times):
            t0 = time.process_time()
            fn()
            ts.append(time.process_time() - t0)
    return [float(np.median(ts)) for ts in times]


def main():
    p = argparse.ArgumentParser()
    for flag, default in (("--reps", 10), ("--d-model", 256), ("--layers", 4), ("--batch", 8),
                          ("--seq", 128), ("--vocab", 4096)):
        p.add_argument(flag, type=int, default=default)
    a = p.parse_args()
    cfg = preset("dense", vocab_size=a.vocab, d_model=a.d_model, n_layers=a.layers)
    model = LM(cfg, rng=np.random.default_rng(0), dtype=np.float32)
    lora = LoRA(model, 8, targets=("q_proj", "v_proj"), rng=np.random.default_rng(1))
    rng = np.random.default_rng(2)
    ids = rng.integers(0, a.vocab, (a.batch, a.seq + 1))

    targets = {id(w) for site in lora.sites.values() for w in site.weights}
    frozen_arrays = [p.data for p in model.parameters() if id(p) not in targets]

    def step(frozen=()):
        lora.merge()
        model.zero_grad()
        _, cache = model.loss(ids[:, :-1], ids[:, 1:])
        with frozen_weights(frozen):
            model.loss_backward(1.0, cache)
        lora.backward()
    step_s, skip_s = median_s([step, lambda: step(frozen_arrays)], a.reps)
    frozen = [(n, p.data.shape) for n, p in model.named_parameters()
              if p.data.ndim == 2 and id(p) not in targets and not n.endswith(".E")]
    N = a.batch * a.seq
    dw_s = 0.0
    for _, (d_in, d_out) in frozen:
        x = rng.standard_normal((N, d_in), dtype=np.float32)
        dy = rng.standard_normal((N, d_out), dtype=np.float32)
        dw_s += median_s([lambda: x.T @ dy], a.reps)[0]  # noqa: B023 (timed at once)
    print(f"dense preset: d {a.d_model}, {a.layers} layers, V {a.vocab}, batch "
          f"{a.batch}x{a.seq}; LoRA r 8 on q_proj, v_proj; float32, one thread")
    print(f"LoRA step (merge + forward + backward + adapter grads): {1e3 * step_s:8.1f} ms")
    print(f"frozen weights' dW matmuls ({len(frozen)} weights, the head included): "
          f"{1e3 * dw_s:8.1f} ms = {dw_s / step_s:.0%} of the step")
    print(f"LoRA step with them skipped (frozen_weights):            {1e3 * skip_s:8.1f} ms "
          f"({1 - skip_s / step_s:.0%} less)")


if __name__ == "__main__":
    main()
