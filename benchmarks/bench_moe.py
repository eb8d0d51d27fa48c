"""Benchmark: scratchllm's MoE layer (forward + backward) vs the same math in PyTorch autograd.

Usage:  flock /tmp/scratchllm-bench.lock python benchmarks/bench_moe.py [--reps 7] [--quick]

Both sides: float32, 2 threads, softmax router, top-k = 2 gates renormalised over the chosen
k, capacity ceil(1.25 N k / E) keeping the earliest tokens, SwiGLU experts on contiguous
argsort-dispatched slices, balance loss and z-loss in the backward. Targets:
  1. fwd+bwd at E=8, k=2, D=256, F=512, N=2048 takes <= 1.5x torch's time;
  2. at E = 8, 16, 32, 64 (k, N fixed) the time grows far less than E: under 2x from 8 to 64.
Prints medians, ratios, and the largest difference between the two sides' outputs.
"""
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "2"

import argparse  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from scratchllm.moe import MoEWeights, moe_backward, moe_forward  # noqa: E402
from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec  # noqa: E402

CAPACITY = 1.25


def torch_moe(x, w_router, w1, w3, w2, k, capacity_factor):
    """The torch twin: same router, capacity rule, dispatch and losses, autograd for backward."""
    N, D = x.shape
    E = w_router.shape[1]
    logits = x @ w_router  # (N, E)
    probs = torch.softmax(logits, dim=-1)  # (N, E)
    top_p, idx = torch.topk(probs, k, dim=-1)  # (N, K)
    gates = top_p / top_p.sum(-1, keepdim=True)  # (N, K)
    flat = idx.reshape(-1)  # (NK,)
    order = torch.argsort(flat, stable=True)  # (NK,)
    counts = torch.bincount(flat, minlength=E)  # (E,)
    starts = torch.cumsum(counts, 0) - counts  # (E,)
    rank = torch.arange(flat.numel()) - starts[flat[order]]  # (NK,)
    C = math.ceil(capacity_factor * N * k / E)
    slots = order[rank < C]  # (M,)
    kept = torch.clamp(counts, max=C).tolist()
    xs = x[slots // k]  # (M, D)
    outs, a = [], 0
    w1s, w3s, w2s = w1.unbind(0), w3.unbind(0), w2.unbind(0)  # views; backward is one stack
    for i, m in enumerate(kept):
        xi = xs[a:a + m]
        outs.append((torch.nn.functional.silu(xi @ w1s[i]) * (xi @ w3s[i])) @ w2s[i])
        a += m
    ys = torch.cat(outs) * gates.reshape(-1)[slots, None]  # (M, D)
    slot_out = torch.zeros(N * k, D).index_copy(0, slots, ys)  # (NK, D)
    y = slot_out.reshape(N, k, D).sum(1)  # (N, D)
    f = counts.to(x.dtype) / (N * k)  # (E,)
    aux = E * (f * probs.mean(0)).sum()
    z = torch.logsumexp(logits, -1).pow(2).mean()
    return y, aux, z


def inputs(E, N=2048, D=256, F=512, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((N, D), dtype=np.float32),
            "w_router": (rng.standard_normal((D, E)) * D ** -0.5).astype(np.float32),
            "w1": (rng.standard_normal((E, D, F)) * D ** -0.5).astype(np.float32),
            "w3": (rng.standard_normal((E, D, F)) * D ** -0.5).astype(np.float32),
            "w2": (rng.standard_normal((E, F, D)) * F ** -0.5).astype(np.float32)}


def run_numpy(arrs, dy, k):
    x, w = arrs["x"], MoEWeights(arrs["w_router"], None, arrs["w1"], arrs["w3"], arrs["w2"])
    E, F = arrs["w1"].shape[0], arrs["w1"].shape[2]
    spec = MoESpec(RouterSpec(E, k), ExpertsSpec(d_ff=F), capacity_factor=CAPACITY)
    (y, aux, z), cache = moe_forward(x, w, spec=spec)
    g = moe_backward((dy, np.float32(0.01), np.float32(0.001)), cache)
    return y, {"x": g["x"], **g["w"]._asdict()}


def run_torch(arrs, dy, k):
    t = {n: torch.from_numpy(a).requires_grad_() for n, a in arrs.items()}
    y, aux, z = torch_moe(**t, k=k, capacity_factor=CAPACITY)
    (y * torch.from_numpy(dy)).sum().add(0.01 * aux + 0.001 * z).backward()
    return y.detach().numpy(), {n: v.grad.numpy() for n, v in t.items()}


def interleaved_times(fns, reps):
    """Seconds of each fn over `reps` rounds; every round runs every fn once, so the noise of
    a shared machine falls on all of them alike. Round 0 is a warm-up and is not kept. A short
    untimed pause before each call lets the other library's spinning worker threads (OpenBLAS
    pthreads, torch's OpenMP) go idle, so neither side pays for the other's thread pool."""
    times = [[] for _ in fns]
    for rep in range(reps + 1):
        for fn, ts in zip(fns, times):
            time.sleep(0.05)
            t0 = time.perf_counter()
            fn()
            if rep:
                ts.append(time.perf_counter() - t0)
    return np.array(times)  # (len(fns), reps)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="E = 8 only")
    args = parser.parse_args()
    torch.set_num_threads(2)
    k, Es = 2, ([8] if args.quick else [8, 16, 32, 64])
    fns, agree = [], {}
    for E in Es:
        arrs = inputs(E)
        dy = np.random.default_rng(1).standard_normal(arrs["x"].shape, dtype=np.float32)
        y_np, g_np = run_numpy(arrs, dy, k)
        y_t, g_t = run_torch(arrs, dy, k)
        agree[E] = (np.abs(y_np - y_t).max(),
                    max(np.abs(g_np[n] - g_t[n]).max() / np.abs(g_t[n]).max() for n in g_t))
        fns += [lambda a=arrs, d=dy: run_numpy(a, d, k), lambda a=arrs, d=dy: run_torch(a, d, k)]
    t = interleaved_times(fns, args.reps).reshape(len(Es), 2, args.reps)  # (E, side, rep)
    med, best = np.median(t, axis=-1), t.min(axis=-1)  # (E, side)
    print(f"MoE fwd+bwd, float32, 2 threads, N=2048 D=256 F=512 k={k}, capacity {CAPACITY}; "
          f"{args.reps} interleaved rounds")
    print(f"{'E':>3}  {'numpy med':>9}  {'torch med':>9}  {'ratio':>5}  {'numpy min':>9}  "
          f"{'torch min':>9}  {'ratio':>5}  {'max|dy|':>7}  {'rel dW':>7}   (ms)")
    for i, E in enumerate(Es):
        print(f"{E:>3}  {1e3 * med[i, 0]:>9.1f}  {1e3 * med[i, 1]:>9.1f}  "
              f"{med[i, 0] / med[i, 1]:>5.2f}  {1e3 * best[i, 0]:>9.1f}  {1e3 * best[i, 1]:>9.1f}  "
              f"{best[i, 0] / best[i, 1]:>5.2f}  {agree[E][0]:>7.1e}  {agree[E][1]:>7.1e}")
    r8 = med[0, 0] / med[0, 1]
    print(f"\ntarget 1: numpy/torch at E=8 (medians) = {r8:.2f} (<= 1.5): "
          f"{'met' if r8 <= 1.5 else 'NOT met'}")
    if len(Es) > 1:
        g_med, g_min = med[-1, 0] / med[0, 0], best[-1, 0] / best[0, 0]
        print(f"target 2: numpy E=64 / E=8 = {g_med:.2f} (medians), {g_min:.2f} (mins) "
              f"(< 2 while E grew 8x): {'met' if g_med < 2 else 'NOT met'}; "
              f"torch {med[-1, 1] / med[0, 1]:.2f}")


if __name__ == "__main__":
    main()
