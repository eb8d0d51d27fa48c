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
    RSS      ru_maxrss of each process

Random weights written once per model by scratchllm.hub.save_pretrained; each framework runs
in its own subprocess with 2 threads (bench_hub.py's environment).

    flock /tmp/scratchllm-bench.lock nice -n -15 python benchmarks/bench_hub_moe.py [mixtral|dsv3]
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from bench_hub import THREADS, _env, _median

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
}
PROMPT = {"mixtral": 16, "dsv3": 2048}
NEW = {"mixtral": 32, "dsv3": 16}


def make_checkpoint(name, directory):
    import numpy as np
    from scratchllm.hub import save_pretrained
    from scratchllm.lm import LM, preset
    base, fields = MODELS[name]
    model = LM(preset(base, **fields), rng=np.random.default_rng(0))
    save_pretrained(model, directory)
    return sum(p.data.size for p in model.parameters())


def worker_numpy(name, directory):
    import numpy as np
    from scratchllm.hub import load_pretrained
    model = load_pretrained(directory)
    ids = np.random.default_rng(0).integers(0, model.cfg.vocab_size, (1, PROMPT[name]))
    state = model.init_state(1, PROMPT[name] + NEW[name])
    t = time.perf_counter()
    logits = model.prefill(ids, state)[:, -1]  # (1, V)
    prefill = time.perf_counter() - t
    steps = []
    for pos in range(PROMPT[name], PROMPT[name] + NEW[name]):
        t = time.perf_counter()
        logits = model.decode(np.array([int(np.argmax(logits[0]))]), state, pos)
        steps.append(time.perf_counter() - t)
    cache = sum(s.nbytes for s in state)  # allocated for exactly the tokens decoded
    return dict(decode=1 / _median(steps), prefill=PROMPT[name] / prefill, cache=cache)


def worker_torch(name, directory):
    import torch
    import transformers
    torch.set_num_threads(int(THREADS))
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager",
        experts_implementation="eager")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT[name]), generator=g)
    steps = []
    with torch.no_grad():
        t = time.perf_counter()
        out = model(ids, use_cache=True)
        prefill = time.perf_counter() - t
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(NEW[name]):
            t = time.perf_counter()
            out = model(nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            steps.append(time.perf_counter() - t)
    held = sum(t.nbytes for layer in cache.layers for t in (layer.keys, layer.values))
    return dict(decode=1 / _median(steps), prefill=PROMPT[name] / prefill, cache=held)


def _child(kind, name, directory):
    worker = worker_numpy if kind == "numpy" else worker_torch
    result = worker(name, directory)
    result["rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
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
        if name == "dsv3":
            print(f"| {label} | cache bytes | {a['cache']:,} | {b['cache']:,} | "
                  f"{a['cache'] / b['cache']:.2f} |")
        print(f"| {label} | peak RSS | {a['rss_mib']:,.0f} MiB | {b['rss_mib']:,.0f} MiB | "
              f"{a['rss_mib'] / b['rss_mib']:.2f} |")
    print(f"uptime: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
