"""Benchmarks of the attention family (float32, 2 threads, medians, side by side in one run).

Run serialised with other helpers:
    flock /tmp/scratchllm-bench.lock python benchmarks/bench_attention.py [NAME ...]

Each benchmark is a function `bench_NAME() -> None` that times scratchllm against a PyTorch CPU
autograd twin doing the same math (written here, never in the library) and prints median ms
and the ratio ours / torch. With no arguments every benchmark runs; otherwise the named ones.

Sections:
- GQA (attention/gqa.py, attention/rope.py): gqa fwd+bwd with RoPE vs torch.
- MLA (attention/mla.py): the training form fwd+bwd vs torch; absorbed decoding vs rebuilding K, V.
- Flash (attention/flash.py, attention/sparse.py): flash_sdpa vs sdpa vs torch
  scaled_dot_product_attention, causal fwd+bwd at T = 1k..16k, time and peak extra memory
  (each in a fresh subprocess: `bench_attention.py --peak IMPL T`); top-k sparse attention vs
  flash at T = 8k and 16k (SPARSE_TS=...), k = 512.
"""
import os
import subprocess
import threading
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from runner import run_named  # noqa: E402  (benchmarks/ is on sys.path as the script's folder)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # repo root

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # 2 unless overridden


def median_times_interleaved(fns, repeats=9, warmup=2):
    """Median seconds of each fn, the fns alternating within each repeat (shared-load drift
    then hits every contestant alike)."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    for fn, ts in zip(fns, times):
        fn.best = min(ts)  # reported beside the median: the least disturbed run
    return [float(np.median(ts)) for ts in times]


def max_rel_grad_diff(grads, named_tensors):
    """Largest relative difference between our gradients and torch's .grad, over the inputs."""
    return max(float(np.abs(grads[k] - t.grad.numpy()).max() / np.abs(grads[k]).max())
               for k, t in named_tensors)


def time_against_torch(name, ours, theirs):
    """Time ours vs theirs interleaved (15 repeats); report medians (target 1.5x) and bests."""
    report(name, *median_times_interleaved([ours, theirs], repeats=15), target=1.5)
    report("  best of 15 (least disturbed)", ours.best, theirs.best)


def report(name, ours, theirs, target=None):
    """Print one row: median ms of ours and torch, the ratio, and the target verdict."""
    ratio = ours / theirs
    verdict = "" if target is None else (f"  target <= {target}x: "
                                         + ("met" if ratio <= target else "NOT met"))
    print(f"{name:<40} ours {ours * 1e3:8.2f} ms   torch {theirs * 1e3:8.2f} ms   "
          f"ratio {ratio:5.2f}x{verdict}")


# --- GQA (attention/gqa.py, attention/rope.py) ---
def torch_rope_half(t, cos, sin):
    """HF apply_rotary_pos_emb: t*cos + rotate_half(t)*sin, cos/sin (T, Dh/2) duplicated."""
    c, s = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    half = t.shape[-1] // 2
    return t * c + torch.cat([-t[..., half:], t[..., :half]], -1) * s


def torch_gqa(x, wq, wk, wv, wo, H, Hkv, inv_freq):
    """The same math as gqa_forward (causal, RoPE "half") with torch ops."""
    B, T, D = x.shape
    Dh = wq.shape[1] // H
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq  # (T, Dh/2)
    cos, sin = torch.cos(ang).float(), torch.sin(ang).float()
    q = (x @ wq).view(B, T, H, Dh).transpose(1, 2)
    k = (x @ wk).view(B, T, Hkv, Dh).transpose(1, 2)
    v = (x @ wv).view(B, T, Hkv, Dh).transpose(1, 2)
    q, k = torch_rope_half(q, cos, sin), torch_rope_half(k, cos, sin)
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    s = (q @ k.transpose(-1, -2)) * Dh ** -0.5
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    o = (p @ v).transpose(1, 2).reshape(B, T, H * Dh)
    return o @ wo


def bench_gqa():
    from scratchllm.attention import AttentionWeights, gqa_backward, gqa_forward
    from scratchllm.attention import rope_frequencies
    from scratchllm.specs import AttentionSpec
    B, T, D, H, Hkv, Dh = 8, 256, 256, 8, 2, 32
    rng = np.random.default_rng(0)
    f32 = np.float32
    x = rng.standard_normal((B, T, D)).astype(f32)
    ws = {"wq": rng.standard_normal((D, H * Dh)).astype(f32) * D ** -0.5,
          "wk": rng.standard_normal((D, Hkv * Dh)).astype(f32) * D ** -0.5,
          "wv": rng.standard_normal((D, Hkv * Dh)).astype(f32) * D ** -0.5,
          "wo": rng.standard_normal((H * Dh, D)).astype(f32) * (H * Dh) ** -0.5}
    dy = rng.standard_normal((B, T, D)).astype(f32)
    inv_freq, _ = rope_frequencies(Dh)
    w, spec = AttentionWeights(**ws), AttentionSpec(H, Hkv, head_dim=Dh)  # RoPE half, causal

    def ours():
        y, cache = gqa_forward(x, w, spec=spec)
        g = gqa_backward(dy, cache)
        return {"x": g["x"], **g["w"]._asdict()}

    tx = torch.tensor(x, requires_grad=True)
    tws = {k: torch.tensor(w, requires_grad=True) for k, w in ws.items()}
    tdy, tinv = torch.tensor(dy), torch.tensor(inv_freq)

    def theirs():
        for t in (tx, *tws.values()):
            t.grad = None
        torch_gqa(tx, *tws.values(), H, Hkv, tinv).backward(tdy)

    g, _ = ours(), theirs()  # same math: check before timing
    err = max_rel_grad_diff(g, [("x", tx), *tws.items()])
    print(f"B={B} T={T} D={D} H={H} Hkv={Hkv} Dh={Dh}, RoPE half, causal; "
          f"max rel grad diff vs torch {err:.1e}")
    time_against_torch("gqa fwd+bwd (RoPE)", ours, theirs)


GQA_BENCHMARKS = [bench_gqa]


# --- MLA ---
def torch_rope_interleaved(t, cos, sin):
    """DeepSeek-V3 apply_rotary_emb (complex multiply of pairs (2i, 2i+1)) in real ops."""
    x1, x2 = t[..., 0::2], t[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).flatten(-2)


def torch_mla(x, wq, wkv_a, kv_norm, wkv_b, wo, H, dn, dr, dv, cos, sin, eps=1e-6):
    """The same math as mla_forward (training form, wq, interleaved RoPE, causal) in torch."""
    B, T, D = x.shape
    Dc = kv_norm.shape[0]
    q = (x @ wq).view(B, T, H, dn + dr).transpose(1, 2)
    q = torch.cat([q[..., :dn], torch_rope_interleaved(q[..., dn:], cos, sin)], -1)
    kv = x @ wkv_a
    c, k_pe = kv[..., :Dc], torch_rope_interleaved(kv[..., Dc:].unsqueeze(1), cos, sin)
    c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps) * kv_norm
    kvb = (c @ wkv_b).view(B, T, H, dn + dv).transpose(1, 2)
    k = torch.cat([kvb[..., :dn], k_pe.expand(B, H, T, dr)], -1)
    s = (q @ k.transpose(-1, -2)) * (dn + dr) ** -0.5
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    return (p @ kvb[..., dn:]).transpose(1, 2).reshape(B, T, H * dv) @ wo


def mla_weights(rng, D, H, dn, dr, dv, Dc):
    """float32 MLA weights (wq form), matrices ~ N(0, 1/d_in), kv_norm gain ~ 1."""
    f32 = np.float32
    shapes = {"wq": (D, H * (dn + dr)), "wkv_a": (D, Dc + dr), "wkv_b": (Dc, H * (dn + dv)),
              "wo": (H * dv, D)}
    ws = {k: (rng.standard_normal(s) * s[0] ** -0.5).astype(f32) for k, s in shapes.items()}
    ws["kv_norm"] = (1 + 0.1 * rng.standard_normal(Dc)).astype(f32)
    return ws


def mla_spec(H, dn, dr, dv, Dc):
    """The MLASpec of mla_weights: the wq form, DeepSeek's interleaved RoPE."""
    from scratchllm.specs import MLASpec, RopeSpec
    return MLASpec(H, 0, Dc, dn, dr, dv, rope=RopeSpec(style="interleaved"))


def bench_mla():
    from scratchllm.attention import MLAWeights, mla_backward, mla_forward
    from scratchllm.attention import rope_frequencies
    B, T, D, H, Dc, dr, dn, dv = 8, 256, 256, 8, 64, 16, 32, 32
    rng = np.random.default_rng(0)
    ws = mla_weights(rng, D, H, dn, dr, dv, Dc)
    x = rng.standard_normal((B, T, D)).astype(np.float32)
    dy = rng.standard_normal((B, T, D)).astype(np.float32)
    inv_freq, _ = rope_frequencies(dr)
    w, spec = MLAWeights(**ws), mla_spec(H, dn, dr, dv, Dc)

    def ours():
        y, cache = mla_forward(x, w, spec=spec)
        g = mla_backward(dy, cache)
        return {"x": g["x"], **g["w"]._asdict()}

    tx = torch.tensor(x, requires_grad=True)
    tws = {k: torch.tensor(w, requires_grad=True) for k, w in ws.items()}
    ang = torch.arange(T, dtype=torch.float64)[:, None] * torch.tensor(inv_freq)  # (T, dr/2)
    cos, sin, tdy = torch.cos(ang).float(), torch.sin(ang).float(), torch.tensor(dy)

    def theirs():
        for t in (tx, *tws.values()):
            t.grad = None
        torch_mla(tx, *(tws[k] for k in ("wq", "wkv_a", "kv_norm", "wkv_b", "wo")),
                  H, dn, dr, dv, cos, sin).backward(tdy)

    g, _ = ours(), theirs()  # same math: check before timing
    err = max_rel_grad_diff(g, [("x", tx), *tws.items()])
    print(f"B={B} T={T} D={D} H={H} Dc={Dc} dr={dr} dn=dv={dn}, wq form, interleaved RoPE, "
          f"causal; max rel grad diff vs torch {err:.1e}")
    time_against_torch("mla fwd+bwd (training form)", ours, theirs)


def bench_mla_decode():
    from scratchllm.attention import LatentKVState, MLAWeights, mla_decode, mla_decode_ref
    from scratchllm.teach.sizing import kv_cache_elements
    ctx, D, H, Dc, dr, dn, dv = 4096, 256, 8, 64, 16, 32, 32
    rng = np.random.default_rng(1)
    w, spec = MLAWeights(**mla_weights(rng, D, H, dn, dr, dv, Dc)), mla_spec(H, dn, dr, dv, Dc)
    for B in (1, 8):
        state = LatentKVState(B, ctx, Dc, dr, np.float32)
        state.latents[:] = rng.standard_normal(state.latents.shape)
        x_t = rng.standard_normal((B, D)).astype(np.float32)

        def step(decode):
            state.length = ctx - 1  # ctx - 1 cached tokens; the step appends the ctx-th
            return decode(x_t, w, state, ctx - 1, spec=spec)

        err = np.abs(step(mla_decode) - step(mla_decode_ref)).max()
        fns = [lambda: step(mla_decode), lambda: step(mla_decode_ref)]
        absorbed, naive = median_times_interleaved(fns, repeats=15)
        print(f"{f'decode step, context {ctx}, B={B}':<32} absorbed {absorbed * 1e3:7.3f} ms"
              f"   naive (rebuild K, V) {naive * 1e3:7.3f} ms   naive/absorbed "
              f"{naive / absorbed:5.1f}x   (best of 15: {fns[1].best / fns[0].best:5.1f}x)   "
              f"max abs diff {err:.1e}")
    per_token = state.nbytes // (state.latents.shape[0] * ctx)
    mla = kv_cache_elements("mla", kv_lora_rank=Dc, qk_rope_head_dim=dr) * 4
    print(f"cache bytes/token/layer (LatentKVState.nbytes, float32): {per_token} (= (Dc + dr) * 4 = "
          f"{mla}); the naive form's k + v cache: H * (dn + dr + dv) * 4 = "
          f"{H * (dn + dr + dv) * 4}")


MLA_BENCHMARKS = [bench_mla, bench_mla_decode]


# --- Flash and sparse attention ---
FLASH_SHAPE = dict(B=1, H=8, Dh=64)
FLASH_TS = tuple(int(t) for t in os.environ.get("FLASH_TS",  # FLASH_TS=1024,2048 picks some
                                                 "1024,2048,4096,8192,16384").split(","))
SDPA_MAX_T = 4096  # sdpa's (B, H, T, T) float32 scores, probabilities and gradients: ~4 x 2 GiB at 8k


def flash_inputs(T, B=1, H=8, Dh=64, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((B, H, T, Dh)).astype(np.float32) for _ in range(4)]


def flash_step(impl, T, block=256):
    """fwd+bwd closure of one implementation, causal, on fresh float32 inputs."""
    from scratchllm.attention import (causal_mask, flash_sdpa_backward, flash_sdpa_forward,
                                      sdpa_backward, sdpa_forward)
    from scratchllm.specs import Mask
    q, k, v, dout = flash_inputs(T, **FLASH_SHAPE)
    if impl == "flash":
        return lambda: flash_sdpa_backward(dout, flash_sdpa_forward(
            q, k, v, mask=Mask(), block=block)[1])
    if impl == "sdpa":
        mask = Mask(array=causal_mask(T))  # built once, outside the timed step
        return lambda: sdpa_backward(dout, sdpa_forward(q, k, v, mask)[1])
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    tdo = torch.tensor(dout)

    def theirs():
        for t in (tq, tk, tv):
            t.grad = None
        torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True).backward(tdo)
    return theirs


def peak_extra_mib(impl, T):
    """Peak growth (MiB) of the resident set during one fwd+bwd, in a fresh process."""
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--peak", impl, str(T)],
                         capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _print_peak(impl, T):
    """Sample the current RSS every millisecond while the step runs (large NumPy and torch
    buffers are mmap-ed and returned to the OS when freed, so RSS follows live memory)."""
    step = flash_step(impl, T)  # inputs allocated
    base, peak, done = _rss_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.001)

    watcher = threading.Thread(target=sample)
    watcher.start()
    step()
    done.set()
    watcher.join()
    print(f"peak_extra_mib {(max(peak[0], _rss_bytes()) - base) / 2**20:.1f}")


def bench_flash():
    from scratchllm.attention import flash_sdpa_forward, sdpa_forward
    from scratchllm.specs import Mask
    q, k, v, _ = flash_inputs(256, **FLASH_SHAPE)
    err = np.abs(flash_sdpa_forward(q, k, v, mask=Mask(), block=64)[0]
                 - sdpa_forward(q, k, v, Mask(array=np.tril(np.ones((256, 256), bool))))[0]).max()
    print(f"B=1 H=8 Dh=64 float32 causal fwd+bwd, flash blocks 256x256; "
          f"max abs diff flash vs sdpa (T 256) {err:.1e}; peak = RSS growth in a fresh process")
    for T in FLASH_TS:
        impls = ["flash", "torch"] + (["sdpa"] if T <= SDPA_MAX_T else [])
        repeats = 3 if T <= 4096 else 1
        times = dict(zip(impls, median_times_interleaved([flash_step(i, T) for i in impls],
                                                         repeats=repeats, warmup=0)))
        peaks = {i: peak_extra_mib(i, T) for i in impls}
        row = "   ".join(f"{i} {times[i] * 1e3:9.1f} ms {peaks[i]:7.0f} MiB" for i in impls)
        ratios = f"flash/torch {times['flash'] / times['torch']:5.2f}x"
        if "sdpa" in times:
            ratios += f"  flash/sdpa {times['flash'] / times['sdpa']:5.2f}x"
        print(f"T={T:<6} {row}   {ratios}")
    if 16384 not in FLASH_TS:  # the memory target, without the (slow) timing
        print(f"T=16384  flash peak {peak_extra_mib('flash', 16384):.0f} MiB (not timed)")


SPARSE_TS = tuple(int(t) for t in os.environ.get("SPARSE_TS", "8192,16384").split(","))


def sparse_inputs(T, K, seed=1):
    """The top-k of random causal scores: K random earlier keys per query (all of them
    early on), sorted, -1 padded: (1, T, K) int64."""
    rng = np.random.default_rng(seed)
    idx = np.full((1, T, K), -1, np.int64)
    for t in range(T):
        n = min(t + 1, K)
        idx[0, t, :n] = np.sort(rng.choice(t + 1, n, replace=False))
    return idx


def bench_sparse():
    """top-k sparse attention (the fused twin: sparse_kernels.py, on numba.get_num_threads()
    threads) vs flash (2 BLAS threads) at T = 8k and 16k, k = 512, fwd+bwd, selection given."""
    import numba
    from scratchllm.attention import topk_sparse_attention_backward, topk_sparse_attention_forward
    K = 512
    print(f"top-k sparse (fused twin, {numba.get_num_threads()} Numba threads) vs flash "
          f"(blocks 256x256), B=1 H=8 Dh=64 float32 fwd+bwd, k={K}, selection given; "
          f"load {os.getloadavg()[0]:.1f}")
    for T in SPARSE_TS:
        q, k, v, dout = flash_inputs(T, **FLASH_SHAPE)
        idx = sparse_inputs(T, K)

        def sparse():
            return topk_sparse_attention_backward(dout, topk_sparse_attention_forward(
                q, k, v, idx, block_q=64)[1])

        sparse()  # compiled (or loaded from the cache) before timing
        repeats = 3 if T <= 8192 else 1
        sp, fl = median_times_interleaved([sparse, flash_step("flash", T)], repeats=repeats,
                                          warmup=0)
        print(f"T={T:<6} sparse {sp * 1e3:9.1f} ms   flash {fl * 1e3:9.1f} ms   "
              f"sparse/flash {sp / fl:5.3f}x  target < 1: " + ("met" if sp < fl else "NOT met")
              + f"  (median of {repeats}; load {os.getloadavg()[0]:.1f})")


FLASH_BENCHMARKS = [bench_flash, bench_sparse]


def main(argv=None):
    print(f"numpy {np.__version__}, torch {torch.__version__}, float32, "
          f"torch threads {torch.get_num_threads()}, OMP/OPENBLAS threads "
          f"{os.environ['OPENBLAS_NUM_THREADS']}")
    return run_named(GQA_BENCHMARKS + MLA_BENCHMARKS + FLASH_BENCHMARKS, argv)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--peak"]:
        sys.exit(_print_peak(sys.argv[2], int(sys.argv[3])))
    sys.exit(main())
