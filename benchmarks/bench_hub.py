"""A Hugging Face checkpoint in scratchllm vs transformers (eager, CPU), same weights, float32,
random weights written once as safetensors by scratchllm.hub.save_pretrained:

    --family llama   (default) SmolLM-135M's geometry (D 576, L 30, H 9, Hkv 3, F 1536,
                     V 49152, tied head)
    --family gemma2  a Gemma 2 at the same size (D 576, L 30, H 9, Hkv 3, head_dim 64,
                     F 1536 GeGLU-tanh, V 49152, tied head) with Gemma 2's options: sandwich
                     norms with 1 + w gains, embeddings scaled by sqrt(D), attention logits
                     soft-capped at 50 and final logits at 30, sliding-window (128) and global
                     layers alternating

    load      load_pretrained / AutoModelForCausalLM.from_pretrained, seconds
    decode    batch-1 greedy decoding through the KV state / DynamicCache, tokens/s
    prefill   one forward over 256 tokens (batch 1) that fills a fresh KV cache, as serving
              does, with the logits of every position (both sides), tokens/s
    finetune  one training step, B 4 x T 128: scratchllm's Run.train_step (2 data-parallel
              threads, AdamW, clipping) vs torch autograd + torch.optim.AdamW + clipping
    peak RSS  VmHWM of each process (load + inference + fine-tune steps); for scratchllm
              also right before and after load_pretrained, against the weights' bytes

Each framework runs in its own subprocess with 2 threads; medians over the timed repeats.

    flock /tmp/scratchllm-bench.lock python benchmarks/bench_hub.py [--rounds 2] [--family gemma2]
"""
import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

THREADS = "2"
ROOT = Path(__file__).resolve().parents[1]
SMOL = dict(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, d_ff=1536,
            tie_embeddings=True, norm_eps=1e-5, rope_base=10000.0)
GEMMA2 = dict(model_type="gemma2", vocab_size=49152, hidden_size=576, num_hidden_layers=30,
              num_attention_heads=9, num_key_value_heads=3, head_dim=64, intermediate_size=1536,
              query_pre_attn_scalar=64, sliding_window=128, attn_logit_softcapping=50.0,
              final_logit_softcapping=30.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
              rope_theta=10000.0, max_position_embeddings=8192,
              layer_types=["sliding_attention", "full_attention"] * 15)
PROMPT, NEW, PREFILL, B, T, STEPS = 16, 32, 256, 4, 128, 3


def _env():
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=path)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
        env[var] = THREADS
    return env


def make_checkpoint(directory, family="llama"):
    """Random weights of `family` ("llama": SMOL; "gemma2": GEMMA2) saved in `directory`."""
    import numpy as np
    from scratchllm.hub import save_pretrained
    from scratchllm.hub.registry import config_from_flat, family_named
    from scratchllm.lm import LM, preset
    cfg = (preset("dense", **SMOL) if family == "llama"
           else config_from_flat(family_named("gemma2").from_hf(GEMMA2)))
    save_pretrained(LM(cfg, rng=np.random.default_rng(0)), directory)


def _median(xs):
    return sorted(xs)[len(xs) // 2]


def worker_numpy(directory):
    import numpy as np
    from scratchllm.hub import load_pretrained
    before = peak_rss_mib()  # the interpreter and the imports
    t0 = time.perf_counter()
    model = load_pretrained(directory)
    load = time.perf_counter() - t0
    loaded = dict(load_rss=peak_rss_mib(), import_rss=before,
                  weights_mib=sum(p.data.nbytes for p in model.parameters()) / 2 ** 20)
    ids = np.random.default_rng(0).integers(0, model.cfg.vocab_size, 20_000)
    state = model.init_state(1, PROMPT + NEW)
    for pos in range(PROMPT):
        logits = model.decode(ids[pos:pos + 1], state, pos)
    steps = []
    for pos in range(PROMPT, PROMPT + NEW):
        t = time.perf_counter()
        logits = model.decode(np.array([int(np.argmax(logits[0]))]), state, pos)
        steps.append(time.perf_counter() - t)
    prefill = []
    for _ in range(3):
        fresh = model.init_state(1, PREFILL)
        t = time.perf_counter()
        model.prefill(ids[None, :PREFILL], fresh)  # logits (1, T, V), the KV cache filled
        prefill.append(time.perf_counter() - t)
    return dict(load=load, decode=1 / _median(steps), prefill=PREFILL / _median(prefill),
                finetune=finetune_numpy(model, ids), **loaded)


def peak_rss_mib():
    """This process's peak RSS so far, MiB: /proc/self/status's VmHWM where there is one.
    (ru_maxrss survives exec: a child started by the parent that built the checkpoint
    reports the parent's 1.5 GB from its first line.)"""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def finetune_numpy(model, ids):
    """Tokens/s of Run.train_step (B x T from `ids`, 2 threads, AdamW, clipping): the median
    of STEPS steps after one warm-up step."""
    from scratchllm.train import Run, Settings
    run = Run(model.cfg, Settings(batch_size=B, seq_len=T, steps=10 ** 6, threads=2,
                                  lr=1e-4), model.dtype, model=model)
    ft = []
    for i in range(STEPS + 1):
        t = time.perf_counter()
        run.train_step(ids)
        if i:
            ft.append(time.perf_counter() - t)
    return B * T / _median(ft)


def worker_torch(directory):
    import torch
    import transformers
    torch.set_num_threads(int(THREADS))
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager")
    load = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (20_000,), generator=g)
    steps = []
    with torch.no_grad():
        out = model(ids[None, :PROMPT], use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(NEW):
            t = time.perf_counter()
            out = model(nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            steps.append(time.perf_counter() - t)
        prefill = []
        for _ in range(3):
            t = time.perf_counter()
            model(ids[None, :PREFILL], use_cache=True)  # logits (1, T, V) and a fresh cache
            prefill.append(time.perf_counter() - t)
    return dict(load=load, decode=1 / _median(steps), prefill=PREFILL / _median(prefill),
                finetune=finetune_torch(model, ids, g))


def finetune_torch(model, ids, g):
    """Tokens/s of one torch training step (B x T from `ids` drawn with generator `g`, autograd,
    torch.optim.AdamW, clipping): the median of STEPS steps after one warm-up step."""
    import torch

    def batch():
        start = torch.randint(0, len(ids) - T - 1, (B,), generator=g)
        return ({"input_ids": torch.stack([ids[s:s + T] for s in start])},
                torch.stack([ids[s + 1:s + T + 1] for s in start]))
    return B * T / torch_step_seconds(model, batch, STEPS)


def torch_step_seconds(model, batch, steps):
    """Median seconds of `steps` torch fine-tuning steps after one warm-up step: batch() ->
    (the model's keyword inputs, targets); autograd of the mean next-token cross-entropy,
    clip_grad_norm_ at 1, torch.optim.AdamW (lr 1e-4, betas 0.9/0.95, weight decay 0.1 on
    matrices and 0 on vectors: scratchllm's train.make_optimizer)."""
    import torch
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.95))
    model.train()
    ft = []
    for i in range(steps + 1):
        t = time.perf_counter()
        inputs, y = batch()
        logits = model(**inputs, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if i:
            ft.append(time.perf_counter() - t)
    model.eval()
    return _median(ft)


def child(workers, kind, directory):
    """In a child process: run workers[kind](directory) and print its result as JSON, with
    this process's peak RSS (MiB)."""
    result = workers[kind](directory)
    result["rss_mib"] = peak_rss_mib()
    print(json.dumps(result))


def side_by_side(script, make_checkpoint, rounds):
    """{"numpy" | "torch": {metric: median}}: `script --child KIND DIR` in a fresh process per
    framework, alternating within each round (scratchllm first), on one checkpoint."""
    with tempfile.TemporaryDirectory() as d:
        make_checkpoint(d)
        rows = {"numpy": [], "torch": []}
        for _ in range(rounds):
            for kind in rows:
                out = subprocess.run([sys.executable, script, "--child", kind, d], env=_env(),
                                     check=True, capture_output=True, text=True)
                rows[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {k: {m: _median([r[m] for r in v]) for m in v[0]} for k, v in rows.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--family", choices=("llama", "gemma2"), default="llama",
                    help="the checkpoint's geometry (default llama: SmolLM-135M's)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child({"numpy": worker_numpy, "torch": worker_torch}, *args.child)
    med = side_by_side(__file__, functools.partial(make_checkpoint, family=args.family),
                       args.rounds)
    print(f"uptime: {os.popen('uptime').read().strip()}")
    print(f"{args.family}, {args.rounds} round(s)")
    print("| metric | scratchllm | transformers | ratio | target |")
    print("|---|---|---|---|---|")
    targets = ({"decode": 2.0, "prefill": 1.3, "finetune": 1.3} if args.family == "llama"
               else {"decode": 1.2, "prefill": 1.0, "finetune": 1.0})  # speed's; the checkpoints'
    for m, unit in (("decode", "tok/s"), ("prefill", "tok/s"), ("finetune", "tok/s")):
        a, b = med["numpy"][m], med["torch"][m]
        print(f"| {m} | {a:,.1f} {unit} | {b:,.1f} {unit} | {a / b:.2f} | >= {targets[m]} |")
    a, b = med["numpy"]["load"], med["torch"]["load"]
    print(f"| load | {a:.2f} s | {b:.2f} s | {a / b:.2f} | < 2 s |")
    a, b = med["numpy"]["rss_mib"], med["torch"]["rss_mib"]
    print(f"| peak RSS | {a:,.0f} MiB | {b:,.0f} MiB | {a / b:.2f} | <= 1.2 |")
    n = med["numpy"]
    whole, above = n["load_rss"] / n["weights_mib"], \
        (n["load_rss"] - n["import_rss"]) / n["weights_mib"]
    print(f"loading (scratchllm): peak RSS {n['load_rss']:,.0f} MiB after the load, "
          f"{n['import_rss']:,.0f} MiB before it (interpreter and imports), "
          f"{n['weights_mib']:,.0f} MiB of weights: {whole:.2f}x the weights for the process, "
          f"{above:.2f}x above the imports (target <= 1.2x)")


if __name__ == "__main__":
    main()
