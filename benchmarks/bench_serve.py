"""Benchmarks of serving (scratchllm/serve/): float32, 2 threads, medians, side by side in one run.

Run serialised with other helpers:
    flock /tmp/scratchllm-bench.lock python benchmarks/bench_serve.py [NAME ...] [--ckpt DIR]

Sections:
- engine: generate_batch on the paged cache against the contiguous one (the default `dense`
  preset, 8 requests): same-length requests (one decode call per step) and a mixed workload
  (different prompt and output lengths), beside the requests run one after the other through
  lm.generate_ids.
- long: one decode step at long context (B = 4, 2,048 cached tokens) reading a float32, int8,
  fp8 or int4 paged cache, and a contiguous float32 one.
- prefix: a shared-system-prompt workload: prefix-cache hit rate, peak KV bytes of the paged
  cache against the contiguous arrays, time with and without a hit.
- quality: per KV format, the attention-output error of each layer and the held-out perplexity
  decoded through the quantised cache, on a trained checkpoint (--ckpt, default runs/dense:
  `python -m scratchllm train` makes it) and its validation split.
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import numpy as np  # noqa: E402
from runner import run_named  # noqa: E402  (benchmarks/ is on sys.path as the script's folder)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

from scratchllm.lm import LM, generate_ids, preset  # noqa: E402
from scratchllm.serve import (PagedCache, generate_batch, kv_attention_error,  # noqa: E402
                              kv_cross_entropy, make_engine)

CKPT = "runs/dense"


def _model():
    return LM(preset("dense"), rng=np.random.default_rng(0), dtype=np.float32)


def median_times_interleaved(fns, repeats=5, warmup=1):
    """Median seconds of each fn, the fns alternating within each repeat."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[i].append(time.perf_counter() - t0)
    return [float(np.median(t)) for t in times]


def bench_engine():
    model, rng = _model(), np.random.default_rng(0)
    V = model.cfg.vocab_size
    same = ([[int(t) for t in rng.integers(0, V, 64)] for _ in range(8)], [64] * 8)
    mixed = ([[int(t) for t in rng.integers(0, V, rng.integers(8, 120))] for _ in range(8)],
             [int(n) for n in rng.integers(8, 120, 8)])
    for label, (prompts, news) in (("same lengths (64 + 64)", same), ("mixed lengths", mixed)):
        fns = [lambda: generate_batch(model, prompts, news, kv="paged"),
               lambda: generate_batch(model, prompts, news, kv="contiguous"),
               lambda: [list(generate_ids(model, p, n, None, temperature=0.0))
                        for p, n in zip(prompts, news)]]
        paged, contiguous, alone = median_times_interleaved(fns, repeats=3)
        n = sum(news)
        print(f"{label}: {n} new tokens, 8 requests | paged {n / paged:,.0f} tok/s | "
              f"contiguous {n / contiguous:,.0f} tok/s | paged/contiguous "
              f"{contiguous / paged:.2f}x the speed | one by one (generate_ids) "
              f"{n / alone:,.0f} tok/s")


def bench_long():
    model, rng = _model(), np.random.default_rng(0)
    B, T, steps, bs = 4, 2048, 8, 16
    ids = rng.integers(0, model.cfg.vocab_size, (B, T + steps))
    rows = []
    for kv_dtype in ("float32", "int8", "fp8", "int4", "contiguous"):
        if kv_dtype == "contiguous":
            cache = make_engine(model, "contiguous").cache
            for s in range(B):
                cache.add(s, T + steps)
        else:
            cache = PagedCache(model, B * -(-(T + steps) // bs), bs, kv_dtype)
            for s in range(B):
                cache.blocks.add(s, [0])
                cache.blocks.reserve(s, T + steps)
        views = cache.views(list(range(B)), 0)
        model.prefill(ids[:, :T], views)
        times = []
        for t in range(T, T + steps):
            t0 = time.perf_counter()
            model.decode(ids[:, t], views, t)
            times.append(time.perf_counter() - t0)
        rows.append((kv_dtype, float(np.median(times[1:]))))
    base = rows[0][1]
    print(f"decode step, B={B}, context {T}, dense preset (4 layers, Hkv=2, Dh=32):")
    for name, sec in rows:
        print(f"  {name:10s} {sec * 1e3:7.2f} ms/step  {B / sec:8,.0f} tok/s  "
              f"{base / sec:.2f}x float32 paged's speed")


def bench_prefix():
    model, rng = _model(), np.random.default_rng(0)
    V, bs = model.cfg.vocab_size, 16
    system = [int(t) for t in rng.integers(0, V, 96)]
    prompts = [system + [int(t) for t in rng.integers(0, V, 16)] for _ in range(16)]
    news = [32] * 16
    per_token = sum(2 * layer.mixer.spec.n_kv_heads * layer.mixer.head_dim * 4
                    for layer in model.layers)  # bytes of K and V per token, float32
    for kv in ("paged", "contiguous"):
        engine = make_engine(model, kv, bs, max_tokens=sum(-(-(len(p) + n) // bs) * bs
                                                            for p, n in zip(prompts, news)))
        for i, (p, n) in enumerate(zip(prompts, news)):
            engine.submit(i, p, n)
        t0 = time.perf_counter()
        engine.run()
        sec = time.perf_counter() - t0
        if kv == "paged":
            bm = engine.cache.blocks
            peak = engine.stats["peak_blocks"] * bs * per_token
            print(f"paged: prefix-cache hits {bm.hits}/{bm.lookups} blocks "
                  f"({bm.hits / bm.lookups:.0%}), peak {engine.stats['peak_blocks']} blocks = "
                  f"{peak / 2**20:.2f} MiB, {sec:.2f} s")
        else:
            peak = engine.stats["peak_bytes"]
            print(f"contiguous: peak {peak / 2**20:.2f} MiB reserved "
                  f"(prompt + max_new per request), {sec:.2f} s")


def bench_quality():
    from scratchllm.train.checkpoint import load_model
    from scratchllm.train.corpus import DEFAULT_CORPUS, split
    where = sys.argv[sys.argv.index("--ckpt") + 1] if "--ckpt" in sys.argv else CKPT
    if not os.path.isdir(where):
        print(f"no checkpoint at {where}: run `python -m scratchllm train` (or pass --ckpt)")
        return
    model, tok, _ = load_model(where)
    text = DEFAULT_CORPUS.read_text(encoding="utf-8")
    _, val = split(np.array(tok.encode(text, allowed_special="all")))
    T, n_win = 128, 32
    windows = np.stack([val[i * T:(i + 1) * T + 1] for i in range(n_win)])  # (32, T + 1)
    base = None
    print(f"{where}: {n_win} held-out windows of {T} tokens, decoded through the cache")
    for kv_dtype in ("float32", "int8", "fp8", "int4"):
        err = kv_attention_error(model, windows[:8, :-1], kv_dtype)
        ce = kv_cross_entropy(model, windows, kv_dtype)
        base = ce if base is None else base
        print(f"  {kv_dtype:8s} attention error per layer "
              f"{' '.join(f'{e:.2e}' for e in err)} | CE {ce:.4f} nats, perplexity "
              f"{np.exp(ce):.3f} ({np.exp(ce - base) - 1:+.3%})")


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--ckpt" in args:
        i = args.index("--ckpt")
        args = args[:i] + args[i + 2:]
    sys.exit(run_named([bench_engine, bench_long, bench_prefix, bench_quality], args))
