"""A LLaVA checkpoint in scratchllm vs transformers (eager, CPU), same weights, float32: a CLIP
tower (image 112, patch 14: 64 patches, D 384, L 6, H 6, F 1536, quick-GELU; features from
its second-to-last block, [CLS] dropped), the GELU projector, and a llama LM with
SmolLM-135M's geometry (D 576, L 30, H 9, Hkv 3, F 1536, V 49152), random weights written
once by scratchllm.hub.save_pretrained.

    load      load_pretrained / LlavaForConditionalGeneration.from_pretrained, seconds
    prefill   one forward over an image's 64 tokens and 192 text tokens (batch 1), tokens/s
    decode    batch-1 greedy decoding after that prompt (KV state / DynamicCache), tokens/s
    finetune  one fine-tuning step over the same 256 tokens and the image: forward, the
              next-token loss, backward into every parameter (tower, projector, LM), global
              gradient-norm clip at 1, AdamW (lr 1e-4, betas 0.9/0.95, weight decay 0.1 on
              matrices, 0 on vectors): train.make_optimizer + clip_grad_norm vs torch
              autograd + torch.nn.utils.clip_grad_norm_ + torch.optim.AdamW, tokens/s (median
              of REPEATS steps after one warm-up step)
    peak RSS  peak RSS of each process (VmHWM: bench_hub.child)

Each framework runs in its own subprocess with 2 threads (bench_hub.py's environment);
medians over the timed repeats.

    flock /tmp/scratchllm-bench.lock python benchmarks/bench_hub_llava.py [--rounds 2]
"""
import argparse
import os
import time

from bench_hub import THREADS, _median, child, side_by_side, torch_step_seconds

VISION = dict(model_type="clip_vision_model", hidden_size=384, intermediate_size=1536,
              num_hidden_layers=6, num_attention_heads=6, image_size=112, patch_size=14,
              hidden_act="quick_gelu", layer_norm_eps=1e-5)
TEXT = dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
            num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
            rms_norm_eps=1e-5, tie_word_embeddings=False)
IMAGE_TOKEN, N_IMAGE, N_TEXT, NEW, REPEATS = 49151, 64, 192, 32, 3


def make_checkpoint(directory):
    import numpy as np
    from scratchllm.hub import family_named, save_pretrained
    from scratchllm.vision import Llava
    cfg = family_named("llava").from_hf(dict(
        model_type="llava", vision_config=VISION, text_config=TEXT,
        image_token_index=IMAGE_TOKEN, vision_feature_layer=-2,
        vision_feature_select_strategy="default", projector_hidden_act="gelu"))
    save_pretrained(Llava(cfg, rng=np.random.default_rng(0)), directory)


def _inputs():
    import numpy as np
    rng = np.random.default_rng(0)
    ids = rng.integers(0, IMAGE_TOKEN, (1, N_IMAGE + N_TEXT))
    ids[0, 1:1 + N_IMAGE] = IMAGE_TOKEN
    return ids, rng.standard_normal((1, 3, 112, 112)).astype(np.float32)


def worker_numpy(directory):
    import numpy as np
    from scratchllm.hub import load_pretrained
    t0 = time.perf_counter()
    model = load_pretrained(directory)
    load = time.perf_counter() - t0
    ids, pixels = _inputs()
    T = ids.shape[1]
    prefill = []
    for _ in range(REPEATS):
        t = time.perf_counter()
        model.forward(input_ids=ids, pixel_values=pixels)
        prefill.append(time.perf_counter() - t)
    finetune = finetune_numpy(model, ids, pixels)
    state = model.init_state(1, T + NEW)
    logits = model.prefill(ids, state, pixel_values=pixels)[:, -1]
    steps = []
    for pos in range(T, T + NEW):
        t = time.perf_counter()
        logits = model.decode(np.array([int(np.argmax(logits[0]))]), state, pos)
        steps.append(time.perf_counter() - t)
    return dict(load=load, decode=1 / _median(steps), prefill=T / _median(prefill),
                finetune=finetune)


def finetune_numpy(model, ids, pixels):
    """Tokens/s of one fine-tuning step on (ids, pixels): the median of REPEATS steps after a
    warm-up step (the optimizer of train.Run: make_optimizer's AdamW groups)."""
    import numpy as np
    from scratchllm.core import clip_grad_norm, fused
    from scratchllm.train import Settings, make_optimizer
    opt = make_optimizer(model, Settings(lr=1e-4))  # betas 0.9, 0.95; decay 0.1 on matrices
    params = opt.params
    targets = np.roll(ids, -1, axis=1)
    times = []
    for i in range(REPEATS + 1):
        t = time.perf_counter()
        model.zero_grad()
        logits, cache = model.forward(input_ids=ids, pixel_values=pixels)  # (1, T, V)
        _, c_ce = fused.CROSS_ENTROPY.forward(logits, targets)
        model.backward(fused.CROSS_ENTROPY.backward(np.float32(1), c_ce)["logits"], cache)
        clip_grad_norm(params, 1.0)
        opt.step()
        if i:
            times.append(time.perf_counter() - t)
    return ids.shape[1] / _median(times)


def worker_torch(directory):
    import torch
    import transformers
    torch.set_num_threads(int(THREADS))
    t0 = time.perf_counter()
    model = transformers.LlavaForConditionalGeneration.from_pretrained(
        directory, dtype=torch.float32, attn_implementation="eager")
    load = time.perf_counter() - t0
    ids, pixels = (torch.tensor(a) for a in _inputs())
    T = ids.shape[1]
    prefill = []
    with torch.no_grad():
        for _ in range(REPEATS):
            t = time.perf_counter()
            model(input_ids=ids, pixel_values=pixels, use_cache=False)
            prefill.append(time.perf_counter() - t)
    finetune = finetune_torch(model, ids, pixels)
    steps = []
    with torch.no_grad():
        out = model(input_ids=ids, pixel_values=pixels, use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(NEW):
            t = time.perf_counter()
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            steps.append(time.perf_counter() - t)
    return dict(load=load, decode=1 / _median(steps), prefill=T / _median(prefill),
                finetune=finetune)


def finetune_torch(model, ids, pixels):
    """finetune_numpy's step in torch (bench_hub.torch_step_seconds: autograd, clip_grad_norm_,
    torch.optim.AdamW with the same groups and settings)."""
    import torch
    targets = torch.roll(ids, -1, dims=1)
    inputs = {"input_ids": ids, "pixel_values": pixels}
    return ids.shape[1] / torch_step_seconds(model, lambda: (inputs, targets), REPEATS)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child({"numpy": worker_numpy, "torch": worker_torch}, *args.child)
    med = side_by_side(__file__, make_checkpoint, args.rounds)
    print(f"uptime: {os.popen('uptime').read().strip()}")
    print("| metric | scratchllm | transformers | ratio | target |")
    print("|---|---|---|---|---|")
    targets = {"decode": 1.2, "prefill": 1.0, "finetune": 1.0}
    for m in ("decode", "prefill", "finetune"):
        a, b = med["numpy"][m], med["torch"][m]
        print(f"| {m} | {a:,.1f} tok/s | {b:,.1f} tok/s | {a / b:.2f} | >= {targets[m]} |")
    a, b = med["numpy"]["load"], med["torch"]["load"]
    print(f"| load | {a:.2f} s | {b:.2f} s | {a / b:.2f} | |")
    a, b = med["numpy"]["rss_mib"], med["torch"]["rss_mib"]
    print(f"| peak RSS | {a:,.0f} MiB | {b:,.0f} MiB | {a / b:.2f} | |")


if __name__ == "__main__":
    main()
