"""Training throughput of the presets: scratchllm (NumPy + fused Numba twins, hand-written
backward) vs a PyTorch CPU autograd twin of the same model, float32; peak RSS of each.

scratchllm runs the step of `python -m scratchllm train` (Run.train_step): the batch split in
data-parallel shards on BENCH_THREADS threads (default 2), one BLAS thread each. The twin
(`torch_loss`) is the same math written with torch ops over the SAME initial weights (copied
from scratchllm's LM by Param name) and the SAME batches (corpus.sample_batch with the
trainer's RNG): embedding, pre-norm blocks of [RMSNorm, GQA with RoPE (rotate_half) under the
preset's mask (causal, or sliding window + sinks), MLA or a Mamba block (hybrid's "M" layers:
mamba_simple's selective_scan_ref recurrence), RMSNorm, SwiGLU or top-k MoE
(softmax or sigmoid scores, shared expert, balance + z losses)], final RMSNorm, untied head;
AdamW (betas 0.9/0.95, wd 0.1 on matrices), clip_grad_norm_ 1.0. Both print the first
step's cross-entropy; they must agree to 1e-5. Twins exist for dense, swa, moe, mla and
hybrid.

Each side runs in its own subprocess (so neither's imports inflate the other's RSS); the
sides alternate for --rounds rounds (ours first in each round) and the table reports medians
over all timed steps. --threads1 adds scratchllm at 1 thread (the 2-thread speed-up),
--readable scratchllm's readable path (SCRATCHLLM_READABLE=1).

    flock /tmp/scratchllm-bench.lock python benchmarks/bench_train.py [--preset dense]
        [--steps 10 --rounds 3 --threads1 --readable]
"""
import argparse
import json
import os
import subprocess
import sys
import time

THREADS = os.environ.get("BENCH_THREADS", "2")
TWINS = ("dense", "swa", "moe", "mla", "hybrid")


def _env(threads):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS"):
        env[var] = threads
    return env


def _setup(args):
    """The preset's config, the trainer's settings, the token stream and the batch RNG."""
    import numpy as np
    from scratchllm.lm import preset
    from scratchllm.train import Settings
    cfg = preset(args.preset)
    s = Settings(batch_size=args.batch, seq_len=args.seq, steps=10 ** 6, threads=args.threads)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 100_000)
    return cfg, s, ids, np.random.default_rng([s.seed, 1])


def worker_numpy(args):
    """The exact step of `python -m scratchllm train`: trainer.Run.train_step."""
    from scratchllm.train import Run
    cfg, s, ids, _ = _setup(args)
    run = Run(cfg, s)
    times, losses = [], []
    for i in range(args.steps + 2):
        t0 = time.perf_counter()
        losses.append(run.train_step(ids)[0])
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return times, run.model.n_params(), losses[0]


def _rope_half(dim, T, base):
    """x -> RoPE of x's last `dim` features, HF rotate_half pairs, positions 0..T-1."""
    import torch
    inv = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    cos, sin = (torch.cat([f(ang)] * 2, -1).float() for f in (torch.cos, torch.sin))

    def rope(x):
        x1, x2 = x[..., :dim // 2], x[..., dim // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin
    return rope


def torch_gqa(cfg, w, p, a, mask):
    """GQA self-attention (repeat_interleave of K/V, F.scaled_dot_product_attention); RoPE
    unless the config has no positions (hybrid's attention layers: "nope")."""
    import torch.nn.functional as F
    B, T, D = a.shape
    H, Hkv, Dh = cfg.n_heads, cfg.n_kv_heads, cfg.d_model // cfg.n_heads
    rope = _rope_half(Dh, T, cfg.rope_base) if cfg.positions == "rope" else (lambda t: t)

    def heads(t, n):
        return t.view(B, T, n, Dh).transpose(1, 2)
    q, k = rope(heads(a @ w[p + "wq"], H)), rope(heads(a @ w[p + "wk"], Hkv))
    k, v = k.repeat_interleave(H // Hkv, 1), heads(a @ w[p + "wv"], Hkv).repeat_interleave(
        H // Hkv, 1)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return o.transpose(1, 2).reshape(B, T, D) @ w[p + "wo"]


def torch_mla(cfg, w, p, a, mask):
    """MLA, training form, wq query (attention/mla.py): one shared roped key per token."""
    import torch
    import torch.nn.functional as F
    B, T, D = a.shape
    H, dn, dr, dv, Dc = (cfg.n_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                         cfg.v_head_dim, cfg.kv_lora_rank)
    rope = _rope_half(dr, T, cfg.rope_base)
    q = (a @ w[p + "wq"]).view(B, T, H, dn + dr).transpose(1, 2)
    q = torch.cat([q[..., :dn], rope(q[..., dn:])], -1)
    kv = a @ w[p + "wkv_a"]
    c = F.rms_norm(kv[..., :Dc], (Dc,), w[p + "kv_norm"], cfg.norm_eps)
    k_pe = rope(kv[..., Dc:].unsqueeze(1))  # (B, 1, T, dr)
    kvb = (c @ w[p + "wkv_b"]).view(B, T, H, dn + dv).transpose(1, 2)
    k = torch.cat([kvb[..., :dn], k_pe.expand(B, H, T, dr)], -1)
    o = F.scaled_dot_product_attention(q, k, kvb[..., dn:], attn_mask=mask)
    return o.transpose(1, 2).reshape(B, T, H * dv) @ w[p + "wo"]


def torch_mamba(cfg, w, p, a, mask):
    """The Mamba block (ssm/mamba.py): in-projection, causal depthwise conv1d + silu, x_proj
    to (dt, B, C), softplus dt, the selective scan h_t = exp(dt A) h_{t-1} + dt B_t u_t,
    y_t = C_t h_t + D u_t as a loop over t (mamba_simple's selective_scan_ref), silu(z) gate,
    out-projection; with the config's mamba_inner_norms, Jamba's RMSNorms on dt_low, B and C
    first. `mask` is unused (the recurrence is causal)."""
    import torch
    import torch.nn.functional as F
    B, T, _ = a.shape
    Di, (R, N) = w[p + "W_in"].shape[1] // 2, (w[p + "W_dt"].shape[0], w[p + "A_log"].shape[1])
    K = w[p + "conv_w"].shape[1]
    xz = a @ w[p + "W_in"]  # (B, T, 2Di)
    xc = F.conv1d(xz[..., :Di].transpose(1, 2), w[p + "conv_w"].unsqueeze(1), w[p + "conv_b"],
                  padding=K - 1, groups=Di)[..., :T].transpose(1, 2)  # (B, T, Di)
    u = F.silu(xc)
    dbc = u @ w[p + "W_x"]  # (B, T, R+2N)
    dt_low, Bm, Cm = dbc[..., :R], dbc[..., R:R + N], dbc[..., R + N:]
    if cfg.mamba_inner_norms:  # Jamba's RMSNorms on dt_low, B, C (modeling_jamba.py)
        dt_low, Bm, Cm = (F.rms_norm(t, (t.shape[-1],), w[p + g], cfg.norm_eps)
                          for t, g in ((dt_low, "dt_norm"), (Bm, "B_norm"), (Cm, "C_norm")))
    delta = F.softplus(dt_low @ w[p + "W_dt"] + w[p + "b_dt"])  # (B, T, Di)
    decay = torch.exp(delta.unsqueeze(-1) * -torch.exp(w[p + "A_log"]))  # (B, T, Di, N)
    drive = (delta * u).unsqueeze(-1) * Bm.unsqueeze(-2)  # (B, T, Di, N)
    h, ys = torch.zeros(B, Di, N), []
    for t in range(T):
        h = decay[:, t] * h + drive[:, t]
        ys.append(torch.einsum("bdn,bn->bd", h, Cm[:, t]))
    y = torch.stack(ys, 1) + u * w[p + "D"]  # (B, T, Di)
    return (y * F.silu(xz[..., Di:])) @ w[p + "W_out"]


def torch_moe(cfg, w, p, x):
    """Top-k MoE without capacity (moe/layer.py): softmax or sigmoid scores, gates over the
    chosen k (renormalised over them with norm_topk_prob), argsort dispatch, SwiGLU experts, shared expert; (y, balance loss, z-loss).
    The selection bias is left at its initial 0 (ours moves it when bias_gamma > 0)."""
    import torch
    import torch.nn.functional as F
    N, D = x.shape
    E, k = cfg.n_experts, cfg.top_k
    logits = x @ w[p + "w_router"]  # (N, E)
    q = torch.softmax(logits, -1) if cfg.score == "softmax" else torch.sigmoid(logits)
    top_q, idx = torch.topk(q, k, dim=-1)  # (N, K)
    gates = top_q / top_q.sum(-1, keepdim=True) if cfg.norm_topk_prob else top_q  # (N, K)
    flat = idx.reshape(-1)  # (NK,)
    order = torch.argsort(flat, stable=True)  # (NK,)
    counts = torch.bincount(flat, minlength=E)  # (E,)
    xs, outs, start = x[order // k], [], 0
    w1s, w3s, w2s = (w[p + n].unbind(0) for n in ("w1", "w3", "w2"))
    for i, m in enumerate(counts.tolist()):
        xi = xs[start:start + m]
        outs.append((F.silu(xi @ w1s[i]) * (xi @ w3s[i])) @ w2s[i])
        start += m
    ys = torch.cat(outs) * gates.reshape(-1)[order, None]  # (NK, D)
    y = torch.zeros(N, D).index_add(0, order // k, ys)  # (N, D)
    if cfg.n_shared:
        y = y + (F.silu(x @ w[p + "shared_w1"]) * (x @ w[p + "shared_w3"])) @ w[p + "shared_w2"]
    probs = q / q.sum(-1, keepdim=True)  # (N, E)
    aux = E * (counts.to(x.dtype) / (N * k) * probs.mean(0)).sum()
    return y, aux, torch.logsumexp(logits, -1).pow(2).mean()


def torch_loss(cfg, w, ids, targets):
    """(CE, CE + MoE aux terms) of the LM with weights w (torch tensors by Param name); cfg:
    the config's flat names (scratchllm.specs.unflat.flat_view)."""
    import torch
    import torch.nn.functional as F
    from scratchllm.attention.masks import attention_sink_mask, causal_mask
    from scratchllm.specs.flat import is_moe_layer
    D, V = cfg.d_model, cfg.vocab_size
    B, T = ids.shape
    mask = torch.from_numpy(causal_mask(T) if cfg.window is None else
                            attention_sink_mask(T, cfg.window, cfg.n_sink))
    attention = torch_mla if cfg.attention == "mla" else torch_gqa
    x, aux = w["embed.E"][ids], 0.0
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        mixer = torch_mamba if (cfg.layer_pattern or "A" * cfg.n_layers)[i] == "M" else attention
        x = x + mixer(cfg, w, p + "mixer.", F.rms_norm(x, (D,), w[p + "norm1.g"], cfg.norm_eps),
                      mask)
        b = F.rms_norm(x, (D,), w[p + "norm2.g"], cfg.norm_eps)
        if is_moe_layer(cfg, i):
            y, a_i, z_i = torch_moe(cfg, w, p + "ffn.", b.reshape(B * T, D))
            x, aux = x + y.view(B, T, D), aux + cfg.balance_coef * a_i + cfg.z_coef * z_i
        else:
            x = x + (F.silu(b @ w[p + "ffn.W1"]) * (b @ w[p + "ffn.W3"])) @ w[p + "ffn.W2"]
    logits = F.rms_norm(x, (D,), w["norm.g"], cfg.norm_eps) @ w["head.W"]
    ce = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    return ce, ce + aux


def worker_torch(args):
    import numpy as np
    import torch
    from scratchllm.lm import LM
    from scratchllm.specs.unflat import flat_view
    from scratchllm.train.corpus import sample_batch
    torch.set_num_threads(int(THREADS))
    cfg, s, ids, rng = _setup(args)
    model = LM(cfg, rng=np.random.default_rng(s.seed))  # the trainer's init
    flat = flat_view(cfg)  # the flat names torch_loss reads
    w = {n: torch.from_numpy(p.data.copy()).requires_grad_()
         for n, p in model.named_parameters()}
    decay = [t for n, t in w.items() if t.ndim >= 2 and not n.endswith("A_log")]
    rest = [t for n, t in w.items() if not (t.ndim >= 2 and not n.endswith("A_log"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.95))
    times, losses = [], []
    for i in range(args.steps + 2):
        x, y = (torch.from_numpy(np.ascontiguousarray(a)) for a in
                sample_batch(ids, s.batch_size, s.seq_len, rng))
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        ce, loss = torch_loss(flat, w, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        losses.append(float(ce))
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return times, sum(t.numel() for t in w.values()), losses[0]


def run_worker(name, args, threads):
    """name: numpy, readable (numpy under SCRATCHLLM_READABLE=1) or torch."""
    cmd = [sys.executable, __file__, "--worker", "torch" if name == "torch" else "numpy",
           "--steps", str(args.steps), "--batch", str(args.batch), "--seq", str(args.seq),
           "--preset", args.preset, "--threads", threads]
    env = dict(_env(threads), SCRATCHLLM_READABLE="1" if name == "readable" else "0")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{name} worker failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="dense", help=f"a preset with a torch twin: {TWINS}")
    p.add_argument("--steps", type=int, default=10, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", default=THREADS, help=argparse.SUPPRESS)
    p.add_argument("--threads1", action="store_true", help="also time scratchllm on 1 thread")
    p.add_argument("--readable", action="store_true",
                   help="also time scratchllm's readable path (SCRATCHLLM_READABLE=1)")
    p.add_argument("--worker", choices=("numpy", "torch"), help=argparse.SUPPRESS)
    args = p.parse_args()
    args.threads = int(args.threads)
    if args.worker:
        import resource
        times, n_params, loss0 = (worker_numpy if args.worker == "numpy" else worker_torch)(args)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
        print(json.dumps({"times": times, "params": n_params, "rss_mib": rss, "loss0": loss0}))
        return
    if args.preset not in TWINS:
        sys.exit(f"--preset {args.preset}: no torch twin; choose from {TWINS}")
    import numpy as np
    sides = [("numpy", THREADS), ("torch", THREADS)] + ([("numpy", "1")] if args.threads1 else [])
    sides += [("readable", THREADS)] if args.readable else []
    results = {side: [] for side in sides}
    for _ in range(args.rounds):
        for side in sides:
            results[side].append(run_worker(side[0], args, side[1]))
    tokens = args.batch * args.seq
    print(f"{args.preset} preset, batch {args.batch} x seq {args.seq} = {tokens} tokens/step, "
          f"float32, {args.rounds} rounds x {args.steps} steps; load {os.getloadavg()}")
    print(f"{'':<26}{'params':>10}{'median step':>13}{'tokens/s':>10}{'peak RSS':>10}"
          f"{'step-1 CE':>12}")
    rate = {}
    for (name, threads), runs in results.items():
        med = float(np.median([t for r in runs for t in r["times"]]))
        rate[name, threads] = tokens / med
        label = {"numpy": "scratchllm", "readable": "scratchllm readable",
                 "torch": "torch autograd twin"}[name] + f", {threads} thr"
        print(f"{label:<26}{runs[0]['params']:>10,}{med * 1e3:>10.1f} ms"
              f"{rate[name, threads]:>10,.0f}{max(r['rss_mib'] for r in runs):>7.0f} MiB"
              f"{runs[0]['loss0']:>12.7f}")
    ratio = rate["numpy", THREADS] / rate["torch", THREADS]
    gap = abs(results["numpy", THREADS][0]["loss0"] - results["torch", THREADS][0]["loss0"])
    target = 1.2 if args.preset == "dense" else 1.0
    print(f"ratio scratchllm : torch tokens/s: {ratio:.2f} (target >= {target}: "
          f"{'met' if ratio >= target else 'NOT met'}); step-1 CE differ by {gap:.1e} "
          f"({'agree' if gap < 1e-5 else 'DISAGREE'} to 1e-5)")
    if args.readable:
        print(f"fused / readable path: {rate['numpy', THREADS] / rate['readable', THREADS]:.2f}x")
    if args.threads1:
        print(f"scratchllm {THREADS} threads vs 1: "
              f"{rate['numpy', THREADS] / rate['numpy', '1']:.2f}x (target >= 1.8)")


if __name__ == "__main__":
    main()
