"""The hardware row "this": this machine's memory bandwidth and peak FLOP/s, measured with
NumPy (a large array copy and a float32 matmul), best of a few runs; and the library's own
decode timed on it (measure_decode), to draw beside the roofline's prediction. `size --serve
--hw this` imports this module only when asked, so `size` otherwise loads no numpy."""
import functools
import os
import statistics
import time

import numpy as np

from scratchllm.lm import LM
from scratchllm.teach.serving import Hardware


def _best(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def copy_bandwidth(n_bytes=1 << 26, repeats=5):
    """Bytes per second of np.copyto over n_bytes of float32: a copy reads n_bytes and writes
    n_bytes (2·n_bytes of traffic)."""
    src = np.ones(n_bytes // 4, np.float32)
    dst = np.empty_like(src)
    return 2 * src.nbytes / _best(lambda: np.copyto(dst, src), repeats)


def matmul_flops(n=1024, repeats=5):
    """FLOP/s of an (n, n) @ (n, n) float32 matmul: 2·n³ FLOPs."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.T.copy()
    return 2 * n ** 3 / _best(lambda: a @ b, repeats)


def physical_memory():
    """Bytes of RAM (os.sysconf; 0 where the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


@functools.cache
def measure_this():
    """Hardware("this", ...): measured once per process. NumPy multiplies in float32 here, so
    every dtype gets the float32 rate (bf16 and fp8 weights would be cast up first)."""
    bandwidth, peak = copy_bandwidth(), matmul_flops()
    return Hardware("this", bandwidth, {"fp32": peak, "bf16": peak, "fp16": peak},
                    physical_memory(), "measured: np.copyto of 64 MiB, 1024² float32 matmul")


def _fill(state, context):
    """Make every layer's state hold `context` tokens (their values do not matter for timing:
    the zeros they were allocated with); recurrent states have no length."""
    for st in state:
        if hasattr(st, "lengths"):  # KVState, RollingKVState, LatentKVState
            st.lengths[:] = context


def measure_decode(cfg, batches, context, steps=4, seed=0):
    """Tokens/s of LM(cfg).decode (float32) at each batch size with `context` tokens cached:
    b / the median of `steps` timed steps (after one untimed). [(batch, tokens/s)]."""
    rng = np.random.default_rng(seed)
    model = LM(cfg, rng=rng)
    out = []
    for b in batches:
        state = model.init_state(b, context + steps + 1)
        _fill(state, context)
        times = []
        for t in range(steps + 1):
            ids = rng.integers(0, cfg.vocab_size, b)
            start = time.perf_counter()
            model.decode(ids, state, context + t)
            times.append(time.perf_counter() - start)
        out.append((b, b / statistics.median(times[1:])))
    return out


def measure_experts(cfg, batches, context=8, seed=0):
    """The distinct routed experts a batch of b tokens touches, measured from the routers of
    LM(cfg) (random weights) on b random sequences of `context` tokens: their last tokens'
    top-k choices, averaged over the MoE layers. [(batch, distinct experts)]; [] without MoE.
    serving.expected_experts gives the uniform-routing expectation beside it."""
    rng = np.random.default_rng(seed)
    model, out = LM(cfg, rng=rng), []
    for b in batches:
        _, cache = model.forward(rng.integers(0, cfg.vocab_size, (b, context)))
        picks = [c.ffn.inner.router.topk_idx.reshape(b, context, -1)[:, -1]  # (b, K)
                 for c in cache.blocks if hasattr(getattr(c.ffn, "inner", None), "router")]
        if not picks:
            return []
        out.append((b, statistics.mean(len(np.unique(p)) for p in picks)))
    return out
