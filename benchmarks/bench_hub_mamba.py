"""A Mamba-1 checkpoint in scratchllm vs transformers' pure-torch Mamba path (no mamba-ssm or
causal-conv1d kernels), same weights, float32, batch 1: Mamba-130M's geometry (D 768, L 24,
V 50280, N 16, expand 2, K 4, dt rank 48, tied head), random weights written once as
safetensors by scratchllm.hub.save_pretrained (the bench_hub.py rows of the SSM families).

    decode    greedy decoding through MambaState / transformers' cache, tokens/s (median
              per-token time over --new tokens after a 16-token prompt)
    memory    scratchllm only: RSS (VmRSS) after 512 and after --long decoded tokens; the
              conv and SSM states do not grow with the length, so neither should the RSS

Each framework runs in its own subprocess with 2 threads.

    flock /tmp/scratchllm-bench.lock python benchmarks/bench_hub_mamba.py [--long 4096]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

THREADS = "2"
ROOT = Path(__file__).resolve().parents[1]
MAMBA_130M = dict(model_type="mamba", vocab_size=50280, hidden_size=768, num_hidden_layers=24,
                  state_size=16, expand=2, conv_kernel=4)
PROMPT = 16


def _env():
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = THREADS
    return env


def make_checkpoint(directory):
    import numpy as np
    from scratchllm.hub import config_from_flat, family_named, save_pretrained
    from scratchllm.lm import LM
    cfg = config_from_flat(family_named("mamba").from_hf(MAMBA_130M))
    save_pretrained(LM(cfg, rng=np.random.default_rng(0)), directory)


def _median(xs):
    return sorted(xs)[len(xs) // 2]


def _rss_mib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def worker_numpy(directory, new, long):
    import numpy as np
    from scratchllm.hub import load_pretrained
    model = load_pretrained(directory)
    ids = np.random.default_rng(0).integers(0, MAMBA_130M["vocab_size"], PROMPT)
    state = model.init_state(1, PROMPT + long)
    logits = model.prefill(ids[None], state)[:, -1]  # (1, V)
    steps, rss = [], {}
    for pos in range(PROMPT, PROMPT + max(new, long)):
        t = time.perf_counter()
        logits = model.decode(np.array([int(np.argmax(logits[0]))]), state, pos)
        steps.append(time.perf_counter() - t)
        if pos - PROMPT + 1 in (512, long):
            rss[pos - PROMPT + 1] = _rss_mib()
    return dict(decode=1 / _median(steps[:new]), rss=rss)


def worker_torch(directory, new, long):
    import torch
    import transformers
    torch.set_num_threads(int(THREADS))
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    ids = torch.randint(0, MAMBA_130M["vocab_size"], (1, PROMPT),
                        generator=torch.Generator().manual_seed(0))
    steps = []
    with torch.no_grad():
        out = model(ids, use_cache=True)
        cache, nxt = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(new):
            t = time.perf_counter()
            out = model(nxt, cache=cache, use_cache=True)
            cache, nxt = out.cache, out.logits[:, -1].argmax(-1, keepdim=True)
            steps.append(time.perf_counter() - t)
    return dict(decode=1 / _median(steps))


def _spawn(kind, directory, new, long):
    out = subprocess.run([sys.executable, __file__, "--child", kind, directory, str(new),
                          str(long)], env=_env(), check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", type=int, default=64, help="decode tokens timed")
    ap.add_argument("--long", type=int, default=4096, help="tokens for the RSS row")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        kind, directory, new, long = args.child
        worker = worker_numpy if kind == "numpy" else worker_torch
        return print(json.dumps(worker(directory, int(new), int(long))))
    with tempfile.TemporaryDirectory() as d:
        make_checkpoint(d)
        mine = _spawn("numpy", d, args.new, args.long)  # scratchllm first
        theirs = _spawn("torch", d, args.new, args.long)
    print(f"uptime: {os.popen('uptime').read().strip()}")
    print("| metric | scratchllm | transformers (slow path) | ratio | target |")
    print("|---|---|---|---|---|")
    a, b = mine["decode"], theirs["decode"]
    print(f"| decode (batch 1) | {a:,.1f} tok/s | {b:,.1f} tok/s | {a / b:.2f} | >= 1.0 |")
    r = {int(k): v for k, v in mine["rss"].items()}
    print(f"| RSS after 512 / {args.long:,} tokens | {r[512]:,.0f} / {r[args.long]:,.0f} MiB "
          f"| | {r[args.long] / r[512]:.3f} | constant |")


if __name__ == "__main__":
    main()
