"""Where the time of bench_hub.py's llama rows goes, phase by phase, in scratchllm and in
transformers (eager, CPU), on SmolLM2-135M's geometry (bench_hub.SMOL, random weights):

    step     one fine-tune step of bench_hub (B 4 x T 128: Run.train_step on 2 data-parallel
             threads) split into: the shards' loss forward + backward, the replicas' gradient
             sum, clipping, AdamW; torch: forward, loss, backward, clipping, AdamW
    decode   one batch-1 decode step after a 16-token prompt split per layer kind: embedding,
             30 blocks, final norm, head (scratchllm) / torch's whole step
    prefill  bench_hub's 256-token prefill (scratchllm): its 30 layers (Block.prefill,
             OpenBLAS splitting each product over 2 threads) and the final norm + head

Each side runs in its own subprocess with 2 threads (bench_hub's environment); medians of
--repeats. A loaded machine moves every number; read the shares within one side.

    flock /tmp/scratchllm-bench.lock python benchmarks/bench_hub_phases.py [--repeats 3]
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hub import SMOL, THREADS, _env, _median  # noqa: E402

B, T, PROMPT = 4, 128, 16


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def numpy_side(repeats):
    import numpy as np
    from scratchllm.core.optim import clip_grad_norm, cosine_schedule
    from scratchllm.lm import LM, preset
    from scratchllm.train import Run, Settings, corpus
    cfg = preset("dense", **SMOL)
    model = LM(cfg, rng=np.random.default_rng(0))
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 20_000)
    run = Run(cfg, Settings(batch_size=B, seq_len=T, steps=10 ** 6, threads=2, lr=1e-4),
              model.dtype, model=model)
    dp, rows = run.dp, {k: [] for k in ("shards", "grad_sum", "clip", "adamw", "step")}
    for i in range(repeats + 1):
        x, y = corpus.sample_batch(ids, B, T, run.rng)
        S, main = len(dp.replicas), model.parameters()
        shards = [(m, a, b, len(a) / B, None) for m, a, b in
                  zip(dp.replicas, np.array_split(x, S), np.array_split(y, S))]
        _, t_sh = _timed(lambda: [f.result() for f in
                                  [dp.pool.submit(dp._shard, *sh) for sh in shards]])
        _, t_sum = _timed(lambda: [p.grad.__iadd__(q.grad) for r in dp.replicas[1:]
                                   for p, q in zip(main, r.parameters())])
        _, t_clip = _timed(lambda: clip_grad_norm(main, 1.0))
        run.opt.lr = cosine_schedule(i + 1, 1e-4, 1e-5, 0, 10 ** 6)
        _, t_opt = _timed(run.opt.step)
        _, t_step = _timed(lambda: run.train_step(ids))
        if i:
            for k, v in zip(rows, (t_sh, t_sum, t_clip, t_opt, t_step)):
                rows[k].append(v)
    return ({k: _median(v) for k, v in rows.items()} | decode_numpy(model, ids, repeats)
            | prefill_numpy(model, ids, repeats))


def prefill_numpy(model, ids, repeats, T=256):
    """Seconds of a T-token prefill's layers (a fresh state each time) and of the final norm +
    head, BLAS at bench_hub's THREADS (the fine-tune's Run leaves it at one)."""
    from scratchllm.core.blas import set_blas_threads
    set_blas_threads(int(THREADS))  # Run set BLAS to one thread for its shards
    x = model._embed_forward(ids[None, :T])[0]  # (1, T, D)
    rows = {k: [] for k in ("pre_layers", "pre_norm_head")}
    for i in range(repeats + 1):
        state = model.init_state(1, T)
        t0, y = time.perf_counter(), x
        for layer, st in zip(model.layers, state):
            y = layer.prefill(y, st)  # (1, T, D)
        t1 = time.perf_counter()
        model.unembed(y)
        t2 = time.perf_counter()
        if i:
            for k, v in zip(rows, (t1 - t0, t2 - t1)):
                rows[k].append(v)
    return {k: _median(v) for k, v in rows.items()}


def decode_numpy(model, ids, repeats):
    """Seconds of one batch-1 decode step and of its parts."""
    import numpy as np
    state = model.init_state(1, PROMPT + 8 * (repeats + 1))
    for pos in range(PROMPT):
        model.decode(ids[pos:pos + 1], state, pos)
    parts = {k: [] for k in ("dec_embed", "dec_blocks", "dec_norm_head", "dec_step")}
    pos = PROMPT
    for _ in range(repeats * 4):
        tok = np.array([int(ids[pos])])
        t0 = time.perf_counter()
        x = model._embed_forward(tok[:, None], pos)[0][:, 0]
        t1 = time.perf_counter()
        for layer, st in zip(model.layers, state):
            x = layer.decode(x, st, pos)
        t2 = time.perf_counter()
        model._cap(model._head_forward(model._norm_forward(x)[0])[0])
        t3 = time.perf_counter()
        for k, v in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t3 - t0)):
            parts[k].append(v)
        pos += 1
    return {k: _median(v) for k, v in parts.items()}


def torch_side(repeats):
    import torch
    import transformers
    torch.set_num_threads(2)
    S = SMOL
    conf = transformers.LlamaConfig(
        vocab_size=S["vocab_size"], hidden_size=S["d_model"], num_hidden_layers=S["n_layers"],
        num_attention_heads=S["n_heads"], num_key_value_heads=S["n_kv_heads"],
        intermediate_size=S["d_ff"], tie_word_embeddings=True, rms_norm_eps=S["norm_eps"],
        rope_theta=S["rope_base"], attn_implementation="eager")
    model = transformers.LlamaForCausalLM(conf).float()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, S["vocab_size"], (20_000,), generator=g)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-4, betas=(0.9, 0.95))
    rows = {k: [] for k in ("forward", "loss", "backward", "clip", "adamw", "step")}
    model.train()
    for i in range(repeats + 1):
        start = torch.randint(0, len(ids) - T - 1, (B,), generator=g)
        x = torch.stack([ids[s:s + T] for s in start])
        y = torch.stack([ids[s + 1:s + T + 1] for s in start])
        t0 = time.perf_counter()
        logits = model(input_ids=x, use_cache=False).logits
        t1 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t3 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        t4 = time.perf_counter()
        opt.step()
        t5 = time.perf_counter()
        if i:
            for k, v in zip(rows, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0)):
                rows[k].append(v)
    model.eval()
    dec = []
    with torch.no_grad():
        out = model(ids[None, :PROMPT], use_cache=True)
        cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(repeats * 4):
            t = time.perf_counter()
            out = model(nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            dec.append(time.perf_counter() - t)
    return {k: _median(v) for k, v in rows.items()} | {"dec_step": _median(dec)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--side", choices=("both", "numpy", "torch"), default="both")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        fn = numpy_side if args.child == "numpy" else torch_side
        print(json.dumps(fn(args.repeats)))
        return
    import os
    for kind in ("numpy", "torch") if args.side == "both" else (args.side,):
        out = subprocess.run([sys.executable, __file__, "--child", kind, "--repeats",
                              str(args.repeats)], env=_env(), check=True, capture_output=True,
                             text=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        print(kind, "  ".join(f"{k} {v * 1e3:,.1f} ms" for k, v in res.items()))
    print(f"uptime: {os.popen('uptime').read().strip()}")


if __name__ == "__main__":
    main()
