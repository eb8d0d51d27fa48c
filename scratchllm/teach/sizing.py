"""Sizing arithmetic for decoder LMs: parameters, FLOPs per token, KV cache, serving memory.

Everything is read from a scratchllm.specs.ModelConfig, the config LM builds (teach/arch.MODELS
holds published ones): each spec counts its own parameters (n_params beside it) and its own
decoding memory (kv_per_token, state_per_sequence), so a count here is the count of LM(cfg).
`python -m scratchllm size llama-3-70b --context 65536 --batch 8 --dtype bf16` prints it all
(scratchllm.cli.size), with the chapters' rules of thumb beside the counts (teach/rules.py).
Pure Python: this module imports only the standard library and specs.

Parameters per layer (La attention layers, Lm Mamba layers, L = La + Lm):
    attention   D·H·Dh + 2·D·Hkv·Dh + H·Dh·D                     (wq, wk, wv, wo; MHA/GQA/MQA)
                + biases (GPT-2/3: (H + 2·Hkv)·Dh + D)              (AttentionSpec.n_params)
    MLA         D·Dq + Dq + Dq·H·(Dn+Dr) + D·(Dc+Dr) + Dc + Dc·H·(Dn+Dv) + H·Dv·D
                (wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo; Dq = 0: wq is D·H·(Dn+Dr))
    Mamba       D·2Di + Di·(d_conv+1) + Di·(R+2N) + R·Di + Di + Di·N + Di + Di·D   (MambaSpec)
    recurrent   linear attention, RetNet, GLA, DeltaNet, Mamba-2, RWKV-4 (their specs)
    MLP         SwiGLU 3·D·F;  GELU (GPT-3) 2·D·F + biases F + D       (FFNSpec.n_params)
    MoE         E·3·D·Fe routed + 3·D·Fs shared + D·E router (+ E selection bias)   (MoESpec)
    norms       D (RMSNorm weight) or 2·D (LayerNorm weight + bias), 2 per layer (1 without an
                FFN, twice that for a sandwich block); + one final norm
    embeddings  V·D, + V·D head when untied, + P·D learned positions
  Active per token: the same with K of the E routed experts.
FLOPs per token (Kaplan et al. 2020, Table 1), context T:
    forward 2·N + 2·La·T·H·Dqk,  training 3·forward (= 6·N + ...)
    N = active parameters that enter a matmul (the head does, the embedding lookup does not),
    Dqk = Dh (MLA: Dn + Dr) the query-key width of a head.
KV cache elements per token per attention layer: 2·Hkv·Dh (MHA Hkv = H, MQA Hkv = 1);
    MLA absorbed Dc + Dr (one latent, one shared rope key); MLA naive H·(Dn + Dr + Dv).
Serving memory = params·bytes(weights) + B·(Σ_layers T_l·cache per token per layer + Mamba
    states)·bytes(cache); a layer with a sliding window keeps T_l = min(T, window + n_sink)
    tokens, a global one T (Gemma 3: five local layers of 1024 per global one).
Bytes per number: fp32 4, bf16/fp16 2, fp8/int8 1, int4 ½ + 2/g (a bf16 scale per group of g
    numbers; "int4" g = 128, "int4-g32" g = 32).

Glossary: V vocab, D d_model, L layers, H query heads, Hkv KV heads, Dh head dim, F dense FFN
hidden, E routed experts, K top-k, Fe expert hidden, Fs shared experts' hidden (S·Fe for S
shared experts), Dq query latent (q_lora_rank), Dc KV latent (kv_lora_rank), Dn/Dr/Dv
nope/rope/value head dims, P learned positions, T context, B batch; Mamba: Di = expand·D inner
width, N state size, R = ceil(D/16).
"""
import math
from dataclasses import replace
from typing import NamedTuple

from scratchllm.specs import AttentionSpec, FFNSpec, MambaSpec, MLASpec, MoESpec

ATTENTION = (AttentionSpec, MLASpec)


def kv_cache_elements(kind, *, n_heads=None, head_dim=None, n_kv_heads=None,
                      kv_lora_rank=None, qk_rope_head_dim=None):
    """Numbers cached per token per layer (multiply by itemsize for bytes).

    mha: 2·H·Dh   gqa: 2·Hkv·Dh   mqa: 2·Dh   mla: Dc + dr (absorbed form, shared by heads).
    >>> kv_cache_elements("mha", n_heads=128, head_dim=128), \
kv_cache_elements("mla", kv_lora_rank=512, qk_rope_head_dim=64)
    (32768, 576)
    """
    fn = "kv_cache_elements"
    need = {"mha": ("n_heads", "head_dim"), "gqa": ("n_kv_heads", "head_dim"),
            "mqa": ("head_dim",), "mla": ("kv_lora_rank", "qk_rope_head_dim")}
    if kind not in need:
        raise ValueError(f"{fn}: kind must be one of {sorted(need)}, got {kind!r}")
    given = dict(n_heads=n_heads, head_dim=head_dim, n_kv_heads=n_kv_heads,
                 kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim)
    for name in need[kind]:
        if given[name] is None:
            raise ValueError(f"{fn}: kind {kind!r} needs {name}, got None")
        if not given[name] > 0:
            raise ValueError(f"{fn}: {name} must be > 0, got {given[name]!r}")
    if kind == "mla":
        return kv_lora_rank + qk_rope_head_dim
    heads = {"mha": n_heads, "gqa": n_kv_heads, "mqa": 1}[kind]
    return 2 * heads * head_dim


DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int8": 1,
               "int4": 0.5}  # before scales: dtype_bytes adds int4's
INT4_GROUP, SCALE_BYTES = 128, 2  # int4: one bf16 scale per group of 128 numbers


# ---------------------------------------------------------------- the layers of a config
def mixers(cfg, types):
    """The mixer specs of cfg's layers that are instances of `types`, in layer order."""
    return [layer.mixer for layer in cfg.layers if isinstance(layer.mixer, types)]


def ffns(cfg, types):
    """The FFN specs of cfg's layers that are instances of `types`, in layer order."""
    return [layer.ffn for layer in cfg.layers if isinstance(layer.ffn, types)]


def n_attention_layers(cfg):
    return len(mixers(cfg, ATTENTION))


def attention_spec(cfg):
    """The AttentionSpec or MLASpec of cfg's attention layers (the first one's); None without
    attention. The layers may differ in their masks (a window in some only: Gemma 3's five
    sliding-window layers per global one) and positions (a RoPE base per kind): neither changes
    a layer's weights or what it caches per token, and layer_tokens reads each layer's own
    mask. Layers whose sizes differ are refused: their cache and FLOPs are not one per-layer
    number times La."""
    at = [i for i, layer in enumerate(cfg.layers) if isinstance(layer.mixer, ATTENTION)]
    if not at:
        return None
    first = cfg.layers[at[0]].mixer

    def same_sizes(m):
        return type(m) is type(first) and replace(m, mask=first.mask, rope=first.rope) == first

    other = next((i for i in at if not same_sizes(cfg.layers[i].mixer)), None)
    if other is not None:
        raise ValueError(f"sizing: cfg {cfg.name!r} has attention layers {at[0]} and {other} "
                         f"with different sizes; sizing reads one attention spec per model "
                         f"(masks and positions may differ)")
    return first


def layer_windows(cfg):
    """W + n_sink of each attention layer in order (None: a global layer, it keeps every
    token). Gemma 3: five local layers of 1024 per global one."""
    attention_spec(cfg)  # the layers' sizes agree
    return tuple(None if layer.mixer.mask.window is None
                 else layer.mixer.mask.window + layer.mixer.mask.n_sink
                 for layer in cfg.layers if isinstance(layer.mixer, ATTENTION))


def sliding_window(cfg):
    """W of cfg's sliding-window attention layers (all of them, or some: Gemma 3's local
    layers); None without a window (or without attention). Windows of different widths are
    refused."""
    windows = {layer.mixer.mask.window for layer in cfg.layers
               if isinstance(layer.mixer, ATTENTION) and layer.mixer.mask.window is not None}
    attention_spec(cfg)
    if len(windows) > 1:
        raise ValueError(f"sizing: cfg {cfg.name!r} has sliding windows of {sorted(windows)} "
                         f"tokens; sizing reads one window per model")
    return windows.pop() if windows else None


def n_global_layers(cfg):
    """Attention layers without a window: they keep all T tokens."""
    return sum(w is None for w in layer_windows(cfg))


def biases(spec, d_model):
    """The bias vectors among a mixer's or a dense FFN's parameters (n_biases; 0 for the specs
    without biases)."""
    return spec.n_biases(d_model) if isinstance(spec, (AttentionSpec, FFNSpec)) else 0


def weights(spec, d_model):
    """The parameters of a mixer or a dense FFN that are not bias vectors."""
    return spec.n_params(d_model) - biases(spec, d_model)


# ---------------------------------------------------------------- parameters and FLOPs
class Params(NamedTuple):
    total: int
    active: int   # used by one token: K of the E routed experts
    parts: dict   # component -> (total, active), in print order


def _layer_parts(layer, D):
    """[(part, total, active)] of one block: its mixer, its FFN, its norms. Only the routed
    experts differ: a token uses K of the E."""
    mixer, ffn = layer.mixer, layer.ffn
    if mixer is None:  # an MLP-only layer
        out = []
    elif isinstance(mixer, ATTENTION):
        out = [("attention", weights(mixer, D)), ("biases", biases(mixer, D))]
    else:
        out = [("mamba" if isinstance(mixer, MambaSpec) else "recurrent", mixer.n_params(D))]
    if isinstance(ffn, MoESpec):
        out += [("routed experts", ffn.router.n_experts * ffn.experts.n_params(D)),
                ("shared experts", ffn.shared.n_params(D) if ffn.shared else 0),
                ("router", ffn.router.n_params(D))]
    elif ffn is not None:
        out += [("mlp", weights(ffn, D)), ("biases", biases(ffn, D))]
    out.append(("norms", layer.n_norms * layer.norm.n_params(D)))
    used = ffn.router.top_k * ffn.experts.n_params(D) if isinstance(ffn, MoESpec) else None
    return [(name, n, used if name == "routed experts" else n) for name, n in out]


def parameters(cfg):
    """Params(total, active, parts) of ModelConfig `cfg`, each part counted by its spec.
    Routed experts count E times in total and K times in active; the rest counts in both.
    total == cfg.n_params() and active == cfg.n_params(active=True)."""
    D, V = cfg.d_model, cfg.vocab_size
    positions = cfg.max_positions * D if cfg.positions == "learned" else 0
    head = 0 if cfg.tie_embeddings else V * D
    trunk = [("embedding", V * D), ("positions", positions), ("head", head)]
    rows = [(name, n, n) for name, n in trunk]
    for layer in cfg.layers:
        rows += _layer_parts(layer, D)
    final_norm = cfg.norm.n_params(D)
    rows.append(("norms", final_norm, final_norm))
    parts = {}
    for name, total, active in rows:
        t, a = parts.get(name, (0, 0))
        parts[name] = (t + total, a + active)
    parts = {k: v for k, v in parts.items() if v[0]}
    return Params(sum(t for t, _ in parts.values()), sum(a for _, a in parts.values()), parts)


def flops_per_token(cfg, context, training=False):
    """FLOPs for one token attending to `context` tokens (Kaplan et al. 2020, Table 1):
    forward 2·N + 2·Σ_layers T_l·H·Dqk, training 3× forward. N = active parameters that enter
    a matmul: the head does (also when tied), embedding and position lookups do not. The Mamba
    scan itself (a few Di·N per token) is not counted. A layer with a sliding window attends
    to at most window + n_sink tokens, T_l = min(context, window + n_sink); the others T."""
    p = parameters(cfg)
    n = p.active - p.parts.get("embedding", (0, 0))[0] - p.parts.get("positions", (0, 0))[0]
    n += cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0
    forward = 2 * n + 2 * sum(layer_tokens(cfg, context)) * attention_width(cfg)
    return 3 * forward if training else forward


def attention_width(cfg):
    """H·Dqk, the query-key width the attention term multiplies (MLA: Dqk = Dn + Dr); 0
    without attention layers."""
    spec = attention_spec(cfg)
    if isinstance(spec, MLASpec):
        return spec.n_heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim)
    return spec.n_heads * spec.dh(cfg.d_model) if spec else 0


# ---------------------------------------------------------------- KV cache and serving memory

def dtype_bytes(dtype):
    """Bytes per number in `dtype`, scales included: whole-byte formats their itemsize; "int4"
    half a byte plus a 2-byte (bf16) scale per group of 128 numbers, 0.515625 (4.125 bits,
    GPTQ's and AWQ's default groups); "int4-g32" groups of 32, 0.5625 (llama.cpp's Q4_0)."""
    group = int4_group(dtype)
    if group is not None:
        return 0.5 + SCALE_BYTES / group
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"sizing: unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)} "
                         f"and int4-gN (int4 in groups of N)")
    return DTYPE_BYTES[dtype]


def int4_group(dtype):
    """The group size of an int4 dtype name ("int4": 128, "int4-g64": 64); None for the
    others."""
    if dtype == "int4":
        return INT4_GROUP
    if not (isinstance(dtype, str) and dtype.startswith("int4-g")):
        return None
    digits = dtype[len("int4-g"):]
    if not digits.isdigit() or int(digits) < 1:
        raise ValueError(f"sizing: int4 groups are named int4-gN with N >= 1, got {dtype!r}")
    return int(digits)


def nbytes(numbers, dtype):
    """Bytes of `numbers` numbers in `dtype` (scales included), rounded up to a whole byte."""
    return math.ceil(numbers * dtype_bytes(dtype))


def kv_elements_per_token_layer(cfg, absorbed=True):
    """Cached numbers per token per attention layer (0 without attention): 2·Hkv·Dh (K and V);
    MLA absorbed Dc + Dr, MLA naive H·(Dn + Dr + Dv) (full K and V per head, DeepSeek-V3
    attn_impl="naive")."""
    spec = attention_spec(cfg)
    if spec is None:
        return 0
    if isinstance(spec, MLASpec) and not absorbed:
        return spec.n_heads * (spec.qk_nope_head_dim + spec.qk_rope_head_dim + spec.v_head_dim)
    return spec.kv_per_token(cfg.d_model)


def layer_tokens(cfg, context):
    """Tokens each attention layer keeps (and a query there attends to) at `context`, in
    layer order: T, or min(T, window + n_sink) in a layer with a sliding window."""
    return tuple(context if w is None else min(context, w) for w in layer_windows(cfg))


def tokens_kept(cfg, context):
    """Tokens the attention layer that keeps most keeps at `context` (T when any layer is
    global; min(T, W + n_sink) when every layer has a window); `context` without attention."""
    return max(layer_tokens(cfg, context), default=context)


class CacheSize(NamedTuple):
    elements_per_layer: int  # per token per attention layer
    bytes_per_layer: int     # per token per attention layer
    bytes_per_token: int     # per token held by every attention layer (La · bytes_per_layer)
    tokens: int              # tokens kept per sequence by the layer that keeps most
    state_bytes: int         # per sequence, the states of the Mamba and recurrent mixers
                             # (their specs' state_per_sequence)
    bytes: int               # batch · (kv_bytes + state_bytes)
    layer_tokens: tuple      # tokens kept per sequence by each attention layer
    kv_bytes: int            # per sequence: Σ layer_tokens · bytes_per_layer


def kv_cache(cfg, context=1, batch=1, dtype="bf16", absorbed=True):
    """Cache sizes of ModelConfig `cfg` for `batch` sequences of `context` tokens in `dtype`,
    layer by layer (a window in some layers only keeps fewer tokens there)."""
    elements = kv_elements_per_token_layer(cfg, absorbed)
    per_layer = nbytes(elements, dtype)
    kept = layer_tokens(cfg, context)
    recurrent = [layer.mixer for layer in cfg.layers
                 if layer.mixer is not None and not isinstance(layer.mixer, ATTENTION)]
    state = nbytes(sum(m.state_per_sequence(cfg.d_model) for m in recurrent), dtype)
    kv = sum(kept) * per_layer
    return CacheSize(elements, per_layer, len(kept) * per_layer, tokens_kept(cfg, context),
                     state, batch * (kv + state), kept, kv)


class ServingMemory(NamedTuple):
    weights: int  # bytes
    cache: int    # bytes
    total: int


def serving_memory(cfg, context, batch, dtype="bf16", kv_dtype=None):
    """Bytes to serve `batch` sequences of `context` tokens: all weights in `dtype`, plus the
    (absorbed) cache in `kv_dtype` (default: `dtype`). Activations and overheads not counted."""
    weight_bytes = nbytes(parameters(cfg).total, dtype)
    cache = kv_cache(cfg, context, batch, kv_dtype or dtype).bytes
    return ServingMemory(weight_bytes, cache, weight_bytes + cache)


# ---------------------------------------------------------------- rounded units
def human(n, units=("K", "M", "B", "T")):
    """1000-based: human(8_030_261_248) == "8.03B"."""
    for i in range(len(units), 0, -1):
        if n >= 1000 ** i:
            return f"{n / 1000 ** i:.2f}{units[i - 1]}"
    return str(n)


def human_bytes(n):
    """1024-based: human_bytes(131072) == "128.00 KiB"."""
    for i, unit in reversed(list(enumerate(("B", "KiB", "MiB", "GiB", "TiB", "PiB")))):
        if n >= 1024 ** i:
            return f"{n / 1024 ** i:.2f} {unit}" if i else f"{n} B"
    return f"{n} B"
