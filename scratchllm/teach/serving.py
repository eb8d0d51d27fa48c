"""The roofline of serving: what one decode step (and one prefill) of a ModelConfig reads and
computes on one device, the time lower bound and which roof binds. Pure Python, like sizing.py
(it reads the same specs); `python -m scratchllm size MODEL --serve --hw h200 --batch 1,8,64
--context 4096` prints it (scratchllm.cli.size_serve).

One decode step: b sequences, each with T tokens cached, each adds one token (which attends to
those T; its own key and value are not counted).
    weight bytes   every parameter a step reads, once for the whole batch: all of them but the
                   embedding table (a lookup gathers b rows; a tied head reads it whole); MoE:
                   of a layer's E routed experts only those the b tokens pick, in expectation
                   E·(1 − (1 − K/E)^b) under uniform routing (each expert is missed by one
                   token with probability 1 − K/E); the shared experts and the router are
                   always read
    KV bytes       b · Σ over attention layers of kept(T)·(numbers per token) (+ the states of
                   Mamba and recurrent layers): kept(T) = T, or min(T, W + sinks) with a window;
                   per token 2·Hkv·Dh (MHA/GQA/MQA), Dc + Dr (MLA, absorbed) — layer by layer,
                   so models whose layers differ (windows in some) are counted right
    FLOPs          b · (2·N + Σ attention layers 2·kept(T)·H·(Dqk + Dv)): N = the active
                   parameters a token multiplies (K of the E experts; the head, not the
                   embedding lookup), the attention term the chapter's QKᵀ and PV products
                   (MLA absorbed: scores over Dc + Dr, values over Dc); the Mamba scan is not
                   counted
    intensity      FLOPs / (weight bytes + KV bytes)
    seconds        max(bytes / bandwidth, FLOPs / peak): the lower bound; `bound` names the
                   larger ("memory" or "compute"). The two meet at the ridge point
                   intensity = peak / bandwidth (Williams, Waterman and Patterson 2009,
                   "Roofline", CACM 52(4)).
Prefill of b prompts of T tokens: the weights once (MoE: the experts b·T tokens pick), the KV
cache written once, FLOPs b·(2·N·T + Σ 2·H·(Dqk + Dv)·Σ_t kept(t)), t = 1..T (causal).
Throughput b / seconds tokens per second, latency `seconds` per token, up to the largest batch
whose weights and KV cache fit the device's memory (max_batch).
"""
from typing import NamedTuple

from scratchllm.specs import MLASpec, MoESpec
from scratchllm.teach.sizing import ATTENTION, dtype_bytes, parameters


class Hardware(NamedTuple):
    name: str
    bandwidth: float  # bytes per second, memory to the compute units
    peak: dict        # dtype -> dense FLOP/s (no structured sparsity)
    memory: int       # bytes on the device
    source: str


TB, TFLOP, GB = 1e12, 1e12, 10 ** 9  # the datasheets' decimal units
# Dense tensor-core rates (the datasheets print 2x these "with sparsity"); fp32 is the plain
# (non-tensor) rate; memory as the datasheets print it (GB = 1e9 bytes).
HARDWARE = {hw.name: hw for hw in [
    # NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM): HBM2e 2,039 GB/s, FP32 19.5
    # TFLOPS, BF16/FP16 312 TFLOPS, INT8 624 TOPS; no FP8 tensor cores
    Hardware("a100", 2039e9, {"fp32": 19.5 * TFLOP, "bf16": 312 * TFLOP, "fp16": 312 * TFLOP,
                              "int8": 624 * TFLOP}, 80 * GB, "NVIDIA A100 datasheet, 80GB SXM"),
    # NVIDIA H100 Tensor Core GPU datasheet (H100 SXM): 3.35 TB/s, FP32 67 TFLOPS, BF16/FP16
    # 1,979 and FP8/INT8 3,958 with sparsity (989 and 1,979 dense), 80 GB
    Hardware("h100", 3.35 * TB, {"fp32": 67 * TFLOP, "bf16": 989 * TFLOP, "fp16": 989 * TFLOP,
                                 "fp8": 1979 * TFLOP, "int8": 1979 * TFLOP}, 80 * GB,
             "NVIDIA H100 datasheet, SXM"),
    # NVIDIA H200 Tensor Core GPU datasheet (H200 SXM): 141 GB HBM3e at 4.8 TB/s, the H100's
    # compute (FP32 67, BF16 1,979 / FP8 3,958 TFLOPS with sparsity)
    Hardware("h200", 4.8 * TB, {"fp32": 67 * TFLOP, "bf16": 989 * TFLOP, "fp16": 989 * TFLOP,
                                "fp8": 1979 * TFLOP, "int8": 1979 * TFLOP}, 141 * GB,
             "NVIDIA H200 datasheet, SXM"),
    # Apple M2 (MacBook Air, 24 GB), Apple newsroom "Apple unveils M2" (June 2022): 100 GB/s
    # unified memory, GPU 3.6 TFLOPS; the GPU runs fp16 at its fp32 rate (no bf16 units)
    Hardware("laptop", 100e9, {"fp32": 3.6 * TFLOP, "bf16": 3.6 * TFLOP, "fp16": 3.6 * TFLOP},
             24 * GB, "Apple M2 (June 2022 announcement), 24 GB"),
]}


def hardware(name):
    """The HARDWARE row `name` ("this" is measured by the cli, with numpy, not here)."""
    if name not in HARDWARE:
        raise ValueError(f"serving: unknown hardware {name!r}; known: {', '.join(HARDWARE)}")
    return HARDWARE[name]


def peak_flops(hw, dtype):
    """hw's dense FLOP/s in `dtype`; a dtype the device has no units for (fp8 on an A100, int8
    on a laptop) runs at its bf16 rate (weight-only quantisation: dequantise, then multiply)."""
    dtype_bytes(dtype)  # a known dtype
    name = {"float32": "fp32", "float16": "fp16"}.get(dtype, dtype)
    return hw.peak.get(name, hw.peak["bf16"])


def expected_experts(n_experts, top_k, tokens):
    """Expected distinct experts `tokens` tokens pick, each K of E uniformly at random:
    E·(1 − (1 − K/E)^tokens). 1 token: K; many: E."""
    if not 0 < top_k <= n_experts or tokens < 0:
        raise ValueError(f"expected_experts: need 0 < top_k <= n_experts and tokens >= 0, got "
                         f"{top_k}, {n_experts}, {tokens}")
    return n_experts * (1 - (1 - top_k / n_experts) ** tokens)


# ---------------------------------------------------------------- per step
def _kept(mixer, context):
    window = mixer.mask.window
    return context if window is None else min(context, window + mixer.mask.n_sink)


def _attention_width(mixer, d_model):
    """H·(Dqk + Dv): the widths QKᵀ and PV multiply per key (MLA absorbed: Dc + Dr and Dc)."""
    if isinstance(mixer, MLASpec):
        return mixer.n_heads * (2 * mixer.kv_lora_rank + mixer.qk_rope_head_dim)
    return mixer.n_heads * 2 * mixer.dh(d_model)


def weight_numbers(cfg, tokens):
    """(numbers read, numbers multiplied per token) of cfg's weights when `tokens` tokens pass
    once: all but the embedding table and learned positions (a tied head reads the table);
    routed experts: expected_experts(E, K, tokens) of them read, K multiplied."""
    p = parameters(cfg)
    skip = p.parts.get("embedding", (0, 0))[0] + p.parts.get("positions", (0, 0))[0]
    head = cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0
    read = p.total - skip + head - p.parts.get("routed experts", (0, 0))[0]
    for layer in cfg.layers:
        if isinstance(layer.ffn, MoESpec):
            r = layer.ffn.router
            read += expected_experts(r.n_experts, r.top_k, tokens) * \
                layer.ffn.experts.n_params(cfg.d_model)
    return read, p.active - skip + head


class Step(NamedTuple):
    batch: int
    context: int
    weight_bytes: float
    kv_bytes: float
    flops: float
    intensity: float
    seconds: float
    bound: str       # "memory" or "compute"
    fits: bool       # weights + the batch's KV cache at `context` fit the device
    memory_seconds: float
    compute_seconds: float

    @property
    def tokens_per_second(self):
        return self.batch / self.seconds

    def as_dict(self):
        """The pinned JSON object: batch, context, weight_bytes, kv_bytes, flops, intensity,
        seconds, bound, fits (bytes and FLOPs rounded to integers)."""
        return {"batch": self.batch, "context": self.context,
                "weight_bytes": round(self.weight_bytes), "kv_bytes": round(self.kv_bytes),
                "flops": round(self.flops), "intensity": self.intensity,
                "seconds": self.seconds, "bound": self.bound, "fits": self.fits}


def _roof(hw, dtype, counts, fits):
    """Step from (batch, context, weight bytes, KV bytes, FLOPs)."""
    batch, context, weight_bytes, kv_bytes, flops = counts
    memory_s = (weight_bytes + kv_bytes) / hw.bandwidth
    compute_s = flops / peak_flops(hw, dtype)
    return Step(batch, context, weight_bytes, kv_bytes, flops,
                flops / (weight_bytes + kv_bytes), max(memory_s, compute_s),
                "compute" if compute_s > memory_s else "memory", fits, memory_s, compute_s)


def fits(cfg, hw, batch, context, dtype="bf16", kv_dtype=None):
    """Do all of cfg's weights and `batch` sequences' cache at `context` fit hw's memory?"""
    weights = parameters(cfg).total * dtype_bytes(dtype)
    return weights + kv_cache_bytes(cfg, context, batch, kv_dtype or dtype) <= hw.memory


def kv_cache_bytes(cfg, context, batch=1, dtype="bf16"):
    """Bytes of `batch` sequences' cache at `context`, layer by layer (windows in some layers
    only are fine here); equals sizing.kv_cache(...).bytes where both apply."""
    numbers = 0
    for layer in cfg.layers:
        m = layer.mixer
        if m is None:  # an MLP-only layer keeps nothing
            continue
        numbers += (_kept(m, context) * m.kv_per_token(cfg.d_model) if isinstance(m, ATTENTION)
                    else m.state_per_sequence(cfg.d_model))
    return batch * numbers * dtype_bytes(dtype)


def attention_flops(cfg, context):
    """FLOPs of QKᵀ and PV for one token attending to `context` cached tokens, all layers."""
    return sum(2 * _kept(layer.mixer, context) * _attention_width(layer.mixer, cfg.d_model)
               for layer in cfg.layers if isinstance(layer.mixer, ATTENTION))


def decode_step(cfg, hw, batch, context, dtype="bf16", kv_dtype=None):
    """Step of one decode step: `batch` sequences with `context` cached tokens each add one
    token, weights in `dtype`, cache in `kv_dtype` (default `dtype`)."""
    kv_dtype = kv_dtype or dtype
    read, active = weight_numbers(cfg, batch)
    flops = batch * (2 * active + attention_flops(cfg, context))
    counts = (batch, context, read * dtype_bytes(dtype),
              kv_cache_bytes(cfg, context, batch, kv_dtype), flops)
    return _roof(hw, dtype, counts, fits(cfg, hw, batch, context, dtype, kv_dtype))


def prefill(cfg, hw, batch, context, dtype="bf16", kv_dtype=None):
    """Step of prefilling `batch` prompts of `context` tokens (causal: token t attends to
    kept(t) tokens); kv_bytes is the cache written."""
    kv_dtype = kv_dtype or dtype
    read, active = weight_numbers(cfg, batch * context)
    attention = 0
    for layer in cfg.layers:
        m = layer.mixer
        if isinstance(m, ATTENTION):
            w = min(context, _kept(m, context))  # t attends to min(t, w) keys
            keys = w * (w + 1) // 2 + (context - w) * w
            attention += 2 * keys * _attention_width(m, cfg.d_model)
    flops = batch * (2 * active * context + attention)
    counts = (batch, context, read * dtype_bytes(dtype),
              kv_cache_bytes(cfg, context, batch, kv_dtype), flops)
    return _roof(hw, dtype, counts, fits(cfg, hw, batch, context, dtype, kv_dtype))


def max_batch(cfg, hw, context, dtype="bf16", kv_dtype=None):
    """The largest batch whose weights and cache at `context` fit hw's memory (0: not even
    the weights and one sequence)."""
    free = hw.memory - parameters(cfg).total * dtype_bytes(dtype)
    per_sequence = kv_cache_bytes(cfg, context, 1, kv_dtype or dtype)
    if free < per_sequence:
        return 0
    return int(free // per_sequence) if per_sequence else 10 ** 9


def knee(cfg, hw, context, dtype="bf16", kv_dtype=None, limit=1 << 20):
    """The smallest batch at which a decode step turns compute-bound (None if it never does
    up to `limit`): tokens/s rises ~linearly with the batch before it and flattens after.
    Memory is not a limit here (max_batch is): the knee may lie beyond what fits.

    Once a batch reads every expert, a step moves W + b·K bytes for b·F FLOPs (W the weights
    read, F and K one sequence's FLOPs and KV bytes), so with the ridge R = peak / bandwidth
        knee = ceil(R·W / (F − R·K))        when F / K > R (sequence_intensity), else never.
    GQA at long context: F / K falls below R (Llama-3-8B on an H100 at 4096 tokens: never).
    Absorbed MLA's attention alone does 2·H·(2·Dc + Dr) FLOPs per 2·(Dc + Dr) bytes of cache
    (DeepSeek-V3: 128·1088/576 = 242 FLOP/B, above an H200's R = 206), so longer contexts
    bring its knee down: 3,642 at 1,024 tokens, 1,776 at 32,768, on an H200 in bf16 (where
    the 671B weights alone need 9.5 devices' memory)."""
    lo, hi = 1, limit
    if decode_step(cfg, hw, hi, context, dtype, kv_dtype).bound == "memory":
        return None
    while lo < hi:  # memory-bound below, compute-bound from the knee on (monotone in b)
        mid = (lo + hi) // 2
        if decode_step(cfg, hw, mid, context, dtype, kv_dtype).bound == "compute":
            hi = mid
        else:
            lo = mid + 1
    return lo


def sequence_intensity(cfg, context, dtype="bf16", kv_dtype=None):
    """F / K: one sequence's decode FLOPs per byte of its own cache (and states) at `context`,
    the intensity a decode step tends to as the batch grows (the weights' bytes shared by
    ever more tokens). A knee exists iff it is above the ridge; inf without a cache."""
    _, active = weight_numbers(cfg, 1)
    kv = kv_cache_bytes(cfg, context, 1, kv_dtype or dtype)
    flops = 2 * active + attention_flops(cfg, context)
    return flops / kv if kv else float("inf")


def batch_sweep(cfg, hw, context, dtype="bf16", kv_dtype=None):
    """decode_step at batch 1, 2, 4, ... up to max_batch (and max_batch itself): the curve of
    tokens/s against batch, up to the KV-memory limit. Empty when nothing fits."""
    top = min(max_batch(cfg, hw, context, dtype, kv_dtype), 1 << 16)
    batches = [1 << i for i in range(top.bit_length()) if 1 << i <= top]
    batches += [top] if top and top not in batches else []
    return [decode_step(cfg, hw, b, context, dtype, kv_dtype) for b in batches]

