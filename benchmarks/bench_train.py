"""Training throughput of the `dense` preset: scratchllm (NumPy, hand-written backward) vs a
PyTorch CPU autograd twin of the same model, same shapes, float32, 2 threads; peak RSS of each.

scratchllm runs the step of `python -m scratchllm train` (Run.train_step): the batch split in
two data-parallel shards on two threads, one BLAS thread each. The twin: token embedding, L pre-norm blocks of [RMSNorm, GQA with RoPE (rotate_half), RMSNorm,
SwiGLU], final RMSNorm, untied head; AdamW(betas 0.9/0.95, wd 0.1 on matrices) and global
grad-norm clipping at 1.0, exactly the step `python -m scratchllm train` takes.

Each framework runs in its own subprocess (so neither's imports inflate the other's RSS);
the two alternate for --rounds rounds and the table reports medians over all timed steps.

    flock /tmp/scratchllm-bench.lock python benchmarks/bench_train.py [--steps 10 --rounds 3]
"""
import argparse
import json
import os
import subprocess
import sys
import time

THREADS = os.environ.get("BENCH_THREADS", "2")


def _env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        env[var] = THREADS
    return env


def worker_numpy(args):
    """The exact step of `python -m scratchllm train`: trainer.Run.train_step (data-parallel threads,
    one shard per thread, AdamW, clipping)."""
    import numpy as np
    from scratchllm.lm import preset
    from scratchllm.train import Run, Settings
    cfg = preset("dense")
    run = Run(cfg, Settings(batch_size=args.batch, seq_len=args.seq, steps=10 ** 6,
                            threads=int(THREADS)))
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 100_000)
    times = []
    for i in range(args.steps + 2):
        t0 = time.perf_counter()
        run.train_step(ids)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return times, run.model.n_params()


def worker_torch(args):
    import torch
    import torch.nn.functional as F
    from scratchllm.lm import preset
    torch.set_num_threads(int(THREADS))
    torch.manual_seed(0)
    cfg = preset("dense")
    D, H, Hkv, Fh, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.d_ff, cfg.vocab_size
    Dh, T = D // H, args.seq
    inv = 1.0 / cfg.rope_base ** (torch.arange(0, Dh, 2).float() / Dh)
    ang = torch.outer(torch.arange(T).float(), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(x):
        x1, x2 = x[..., :Dh // 2], x[..., Dh // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = torch.nn.RMSNorm(D, eps=1e-5), torch.nn.RMSNorm(D, eps=1e-5)
            self.wq = torch.nn.Linear(D, H * Dh, bias=False)
            self.wk = torch.nn.Linear(D, Hkv * Dh, bias=False)
            self.wv = torch.nn.Linear(D, Hkv * Dh, bias=False)
            self.wo = torch.nn.Linear(H * Dh, D, bias=False)
            self.w1 = torch.nn.Linear(D, Fh, bias=False)
            self.w3 = torch.nn.Linear(D, Fh, bias=False)
            self.w2 = torch.nn.Linear(Fh, D, bias=False)

        def forward(self, x):
            B = x.shape[0]
            a = self.n1(x)
            q = rope(self.wq(a).view(B, T, H, Dh).transpose(1, 2))
            k = rope(self.wk(a).view(B, T, Hkv, Dh).transpose(1, 2))
            v = self.wv(a).view(B, T, Hkv, Dh).transpose(1, 2)
            k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.wo(o.transpose(1, 2).reshape(B, T, D))
            b = self.n2(x)
            return x + self.w2(F.silu(self.w1(b)) * self.w3(b))

    class Twin(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, D)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(cfg.n_layers))
            self.norm = torch.nn.RMSNorm(D, eps=1e-5)
            self.head = torch.nn.Linear(D, V, bias=False)

        def forward(self, ids):
            x = self.emb(ids)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    model = Twin()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
    times = []
    for i in range(args.steps + 2):
        ids = torch.randint(0, V, (args.batch, T + 1))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), ids[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return times, sum(p.numel() for p in model.parameters())


def run_worker(name, args):
    cmd = [sys.executable, __file__, "--worker", name, "--steps", str(args.steps),
           "--batch", str(args.batch), "--seq", str(args.seq)]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name} worker failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--worker", choices=("numpy", "torch"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        import resource
        times, n_params = (worker_numpy if args.worker == "numpy" else worker_torch)(args)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
        print(json.dumps({"times": times, "params": n_params, "rss_mib": rss}))
        return
    import numpy as np
    results = {"numpy": [], "torch": []}
    for _ in range(args.rounds):
        for name in results:
            results[name].append(run_worker(name, args))
    tokens = args.batch * args.seq
    print(f"dense preset, batch {args.batch} x seq {args.seq} = {tokens} tokens/step, float32, "
          f"{THREADS} threads, {args.rounds} rounds x {args.steps} steps")
    print(f"{'':<22}{'params':>10}{'median step':>13}{'tokens/s':>10}{'peak RSS':>10}")
    rate = {}
    for name, runs in results.items():
        med = float(np.median([t for r in runs for t in r["times"]]))
        rate[name] = tokens / med
        label = "scratchllm (numpy)" if name == "numpy" else "torch autograd twin"
        print(f"{label:<22}{runs[0]['params']:>10,}{med * 1e3:>10.1f} ms{rate[name]:>10,.0f}"
              f"{max(r['rss_mib'] for r in runs):>7.0f} MiB")
    ratio = rate["numpy"] / rate["torch"]
    print(f"ratio numpy/torch tokens/s: {ratio:.2f} (target >= 0.70: "
          f"{'met' if ratio >= 0.7 else 'NOT met'})")


if __name__ == "__main__":
    main()
