"""Mixtral and DeepSeek-V3 checkpoints in scratchllm vs transformers (eager attention, eager
experts: a loop over the experts hit, CPU), same weights, float32, batch-1 greedy decoding.

    mixtral  ~214M parameters: D 512, L 8, H 8, Hkv 2, 8 experts of F 1792, top-2, V 32000
             decode tokens/s after a 16-token prompt (median over 32 tokens)
    dsv3     DeepSeek-V3's per-head MLA geometry (Dc 512, dn 128, dr 64, dv 128) with
             D 1024, H 16, Dq 384, L 4 (1 dense, F 2816), 16 routed experts of F 256 in 4
             groups (top-2 groups, top-4 experts), 1 shared, V 32000: prefill 2,048 tokens,
             then decode tokens/s at context 2,048 (median over 16 tokens) and the bytes
             the decoding cache holds (scratchllm's LatentKVState, transformers' cache
             tensors)
    qwen3_moe  Qwen3-MoE's options (QK-norm, explicit head_dim, softmax router, top-8 of 64
             fine-grained experts renormalised, no shared expert) at ~235M parameters: D 512,
             L 8, H 8, Hkv 2, head_dim 64, experts of F 256, V 32000: prefill 256 tokens
             (median of 3, each on a fresh cache), decode tokens/s after them (median over
             32 tokens), and bench_hub.py's fine-tune step (B 4 x T 128, AdamW,
             clipping; tokens/s)
    load     load_pretrained / AutoModelForCausalLM.from_pretrained, seconds
    RSS      peak RSS of each process (VmHWM: bench_hub.peak_rss_mib)

Random weights written once per model by scratchllm.hub.save_pretrained; each framework runs
in its own subprocess with 2 threads (bench_hub.py's environment).

    flock /tmp/scratchllm-bench.lock nice -n -15 python benchmarks/bench_hub_moe.py
        [mixtral|dsv3|qwen3_moe]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench_hub import THREADS, _env, _median, finetune_numpy, finetune_torch, peak_rss_mib

MODELS = {
    "mixtral": ("moe", dict(vocab_size=32000, d_model=512, n_layers=8, n_heads=8,
                            n_kv_heads=2, d_ff=1792, n_experts=8, top_k=2, norm_eps=1e-5,
                            rope_base=1e6)),
    "dsv3": ("mla", dict(vocab_size=32000, d_model=1024, n_layers=4, n_heads=16,
                         n_kv_heads=16, q_lora_rank=384, kv_lora_rank=512,
                         qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                         first_k_dense=1, dense_d_ff=2816, d_ff=256, n_experts=16, top_k=4,
                         n_group=4, topk_group=2, n_shared=1, routed_scaling_factor=2.5,
                         norm_eps=1e-6, rope_style="interleaved")),
    "qwen3_moe": ("qwen3_moe", dict(  # a config.json, read by the family record
        model_type="qwen3_moe", vocab_size=32000, hidden_size=512, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64, intermediate_size=1536,
        moe_intermediate_size=256, num_local_experts=64, num_experts_per_tok=8,
        norm_topk_prob=True, rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=False)),
}
PROMPT = {"mixtral": 16, "dsv3": 2048, "qwen3_moe": 256}
NEW = {"mixtral": 32, "dsv3": 16, "qwen3_moe": 32}
FINETUNE = ("qwen3_moe",)  # the models with a fine-tune row
PREFILLS = {"qwen3_moe": 3}  # timed prefills, each on a fresh state (median); default 1


def make_checkpoint(name, directory):
    import numpy as np
    from scratchllm.hub import save_pretrained
    from scratchllm.hub.registry import config_from_flat, family_named
    from scratchllm.lm import LM, preset
    base, fields = MODELS[name]
    cfg = (config_from_flat(family_named(base).from_hf(fields)) if "model_type" in fields
           else preset(base, **fields))
    model = LM(cfg, rng=np.random.default_rng(0))
    save_pretrained(model, directory)
    return sum(p.data.size for p in model.parameters())


def worker_numpy(name, directory):
    import numpy as np
    from scratchllm.hub import load_pretrained
    t0 = time.perf_counter()
    model = load_pretrained(directory)
    load = time.perf_counter() - t0
    ids = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (1, PROMPT[name]))
    times = []
    for _ in range(PREFILLS.get(name, 1)):
        state = model.init_state(1, PROMPT[name] + NEW[name])
        t = time.perf_counter()
        logits = model.prefill(ids, state)[:, -1]  # (1, V)
        times.append(time.perf_counter() - t)
    prefill = _median(times)
    steps = []
    for pos in range(PROMPT[name], PROMPT[name] + NEW[name]):
        t = time.perf_counter()
        logits = model.decode(np.array([int(np.argmax(logits[0]))]), state, pos)
        steps.append(time.perf_counter() - t)
    cache = sum(s.nbytes for s in state)  # allocated for exactly the tokens decoded
    out = dict(load=load, decode=1 / _median(steps), prefill=PROMPT[name] / prefill, cache=cache)
    if name in FINETUNE:
        out["finetune"] = finetune_numpy(
            model, np.random.default_rng(0).integers(0, model.cfg.vocab_size, 20_000))
    return out


def worker_torch(name, directory):
    import torch
    import transformers
    torch.set_num_threads(int(THREADS))
    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager")
    load = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT[name]), generator=g)
    steps = []
    with torch.no_grad():
        times = []
        for _ in range(PREFILLS.get(name, 1)):
            t = time.perf_counter()
            out = model(ids, use_cache=True)
            times.append(time.perf_counter() - t)
        prefill = _median(times)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(NEW[name]):
            t = time.perf_counter()
            out = model(nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            steps.append(time.perf_counter() - t)
    held = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
    out = dict(load=load, decode=1 / _median(steps), prefill=PROMPT[name] / prefill, cache=held)
    if name in FINETUNE:
        out["finetune"] = finetune_torch(
            model, torch.randint(0, model.config.vocab_size, (20_000,), generator=g), g)
    return out


def _child(kind, name, directory):
    worker = worker_numpy if kind == "numpy" else worker_torch
    result = worker(name, directory)
    result["rss_mib"] = peak_rss_mib()
    print(json.dumps(result))


def _spawn(kind, name, directory):
    out = subprocess.run([sys.executable, __file__, "--child", kind, name, directory],
                         env=_env(), check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", help=f"some of {list(MODELS)} (default: all)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return _child(*args.child)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        ap.error(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    args.models = args.models or list(MODELS)
    print(f"uptime: {os.popen('uptime').read().strip()}")
    print("| model | metric | scratchllm | transformers | ratio |")
    print("|---|---|---|---|---|")
    for name in args.models:
        with tempfile.TemporaryDirectory() as d:
            n_params = make_checkpoint(name, d)
            res = {kind: _spawn(kind, name, d) for kind in ("numpy", "torch")}
        a, b = res["numpy"], res["torch"]
        label = f"{name} ({n_params / 1e6:.0f}M)"
        ctx = f" at context {PROMPT[name]}" if name == "dsv3" else ""
        print(f"| {label} | decode{ctx} | {a['decode']:.2f} tok/s | {b['decode']:.2f} tok/s "
              f"| {a['decode'] / b['decode']:.2f} |")
        print(f"| {label} | prefill {PROMPT[name]} | {a['prefill']:.1f} tok/s | "
              f"{b['prefill']:.1f} tok/s | {a['prefill'] / b['prefill']:.2f} |")
        if name in FINETUNE:
            print(f"| {label} | fine-tune step | {a['finetune']:.1f} tok/s | "
                  f"{b['finetune']:.1f} tok/s | {a['finetune'] / b['finetune']:.2f} |")
        print(f"| {label} | load | {a['load']:.2f} s | {b['load']:.2f} s | "
              f"{a['load'] / b['load']:.2f} |")
        if name == "dsv3":
            print(f"| {label} | cache bytes | {a['cache']:,} | {b['cache']:,} | "
                  f"{a['cache'] / b['cache']:.2f} |")
        print(f"| {label} | peak RSS | {a['rss_mib']:,.0f} MiB | {b['rss_mib']:,.0f} MiB | "
              f"{a['rss_mib'] / b['rss_mib']:.2f} |")
    print(f"uptime: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
