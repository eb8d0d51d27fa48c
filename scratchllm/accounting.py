"""Sizing arithmetic for decoder LMs: parameters, FLOPs per token, KV cache, serving memory.

`python -m scratchllm size llama-3-70b --context 65536 --batch 8 --dtype bf16` prints it all.
Weights are counted as the reference code stores them (no biases unless `biases=True`).

Parameters per layer (La attention layers, Lm Mamba layers, L = La + Lm):
    attention   D·H·Dh + 2·D·Hkv·Dh + H·Dh·D                     (wq, wk, wv, wo; MHA/GQA/MQA)
    MLA         D·Dq + Dq + Dq·H·(Dn+Dr) + D·(Dc+Dr) + Dc + Dc·H·(Dn+Dv) + H·Dv·D
                (wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo; Dq = 0: wq is D·H·(Dn+Dr))
    Mamba       D·2Di + Di·(d_conv+1) + Di·(R+2N) + R·Di + Di + Di·N + Di + Di·D   (see _mamba)
    MLP         SwiGLU 3·D·F;  GELU (GPT-3) 2·D·F
    MoE         E·3·D·Fe routed + S·3·D·Fe shared + D·E router (+ E selection bias)
    norms       2·D (RMSNorm weight) or 4·D (LayerNorm weight + bias); + one final norm
    embeddings  V·D, + V·D head when untied, + P·D learned positions
  Active per token: the same with K of the E routed experts.
FLOPs per token (Kaplan et al. 2020, Table 1), context T:
    forward 2·N + 2·La·T·H·Dqk,  training 3·forward (= 6·N + ...)
    N = active parameters that enter a matmul (the head does, the embedding lookup does not),
    Dqk = Dh (MLA: Dn + Dr) the query-key width of a head.
KV cache elements per token per attention layer: 2·Hkv·Dh (MHA Hkv = H, MQA Hkv = 1);
    MLA absorbed Dc + Dr (one latent, one shared rope key); MLA naive H·(Dn + Dr + Dv).
Serving memory = params·bytes(weights) + B·(T·La·cache per token per layer + Mamba states)
    ·bytes(cache); a sliding window keeps min(T, window + n_sink) tokens.

Glossary: V vocab, D d_model, L layers, H query heads, Hkv KV heads, Dh head dim, F dense FFN
hidden, E routed experts, K top-k, S shared experts, Fe expert hidden, Dq query latent
(q_lora_rank), Dc KV latent (kv_lora_rank), Dn/Dr/Dv nope/rope/value head dims, P learned
positions, T context, B batch; Mamba: Di = expand·D inner width, N state size, R = ceil(D/16).
"""
import argparse
import math
from dataclasses import dataclass
from typing import NamedTuple

from scratchllm.mla import kv_cache_elements

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int8": 1}


@dataclass(frozen=True)
class Arch:
    """The sizes of a decoder-only LM, enough to count its weights and its cache."""
    name: str
    vocab: int                 # V
    d_model: int               # D
    n_layers: int              # L
    n_heads: int               # H query heads
    n_kv_heads: int            # Hkv: H for MHA, 1 for MQA, in between for GQA
    d_ff: int                  # F, hidden width of the dense MLP; 0 = no MLP (pure Mamba)
    head_dim: int = 0          # Dh; 0 means D // H
    tied: bool = False         # the output head reuses the embedding matrix
    mlp: str = "swiglu"        # "swiglu" (3 matrices) or "gelu" (2 matrices, GPT-2/3)
    norm: str = "rms"          # "rms" (weight) or "layer" (weight + bias)
    biases: bool = False       # every linear layer has a bias (GPT-2/3)
    n_positions: int = 0       # P learned absolute positions (GPT-3: 2048); 0 = RoPE
    window: int = 0            # sliding window: the cache keeps window + n_sink tokens
    n_sink: int = 0
    # MoE (n_experts = 0: every layer is dense)
    n_experts: int = 0         # E routed experts
    top_k: int = 0             # K routed experts per token
    n_shared: int = 0          # S shared experts, always on
    moe_d_ff: int = 0          # Fe; 0 means F
    n_dense_layers: int = 0    # the first layers keep a dense MLP (DeepSeek first_k_dense_replace)
    moe_every: int = 1         # after those, every k-th layer is MoE (Jamba: 2)
    router_bias: bool = False  # a selection-only bias of E numbers per MoE layer (DeepSeek-V3)
    # MLA (kv_lora_rank = 0: ordinary multi-head attention)
    q_lora_rank: int = 0       # Dq; 0 means a direct query projection
    kv_lora_rank: int = 0      # Dc
    qk_nope: int = 0           # Dn
    qk_rope: int = 0           # Dr
    v_head_dim: int = 0        # Dv
    # hybrids: one letter per layer, A = attention, M = Mamba mixer, tiled to L ("" = all A)
    pattern: str = ""
    d_state: int = 16          # N
    d_conv: int = 4
    expand: int = 2

    @property
    def dh(self):
        return self.head_dim or self.d_model // self.n_heads

    @property
    def mla(self):
        return self.kv_lora_rank > 0

    def layers(self):
        """One (mixer, ffn) per layer: mixer "A" or "M", ffn "dense", "moe" or "none"."""
        mixers = (self.pattern or "A") * self.n_layers
        out = []
        for i in range(self.n_layers):
            j = i - self.n_dense_layers
            moe = self.n_experts > 0 and j >= 0 and j % self.moe_every == self.moe_every - 1
            out.append((mixers[i], "moe" if moe else "dense" if self.d_ff else "none"))
        return out


MODELS = {a.name: a for a in [
    # meta-llama/llama-models sku_list.py; F = int(8D/3)·multiplier rounded up (REFERENCE §7)
    Arch("llama-3-8b", 128256, 4096, 32, 32, 8, 14336),
    Arch("llama-3-70b", 128256, 8192, 80, 64, 8, 28672),
    Arch("llama-3.1-405b", 128256, 16384, 126, 128, 8, 53248),
    # mistralai params.json (v0.2+: no sliding window)
    Arch("mistral-7b", 32000, 4096, 32, 32, 8, 14336),
    # HF configuration_mixtral.py defaults
    Arch("mixtral-8x7b", 32000, 4096, 32, 32, 8, 14336, n_experts=8, top_k=2),
    # HF deepseek-ai/DeepSeek-V2 config.json (236B): 160 routed + 2 shared, top-6, 1 dense layer
    Arch("deepseek-v2", 102400, 5120, 60, 128, 128, 12288, n_experts=160, top_k=6, n_shared=2,
         moe_d_ff=1536, n_dense_layers=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope=128,
         qk_rope=64, v_head_dim=128),
    # DeepSeek-V3 inference/configs/config_671B.json (the MTP module is not counted)
    Arch("deepseek-v3", 129280, 7168, 61, 128, 128, 18432, n_experts=256, top_k=8, n_shared=1,
         moe_d_ff=2048, n_dense_layers=3, router_bias=True, q_lora_rank=1536,
         kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head_dim=128),
    # Brown et al. 2020, Table 2.1; GPT-2 layout: LayerNorm, biases, tied head, GELU MLP F = 4D
    Arch("gpt-3-175b", 50257, 12288, 96, 96, 96, 4 * 12288, tied=True, mlp="gelu",
         norm="layer", biases=True, n_positions=2048),
    # state-spaces/mamba-130m-hf: 24 Mamba mixers, no MLP, no attention, tied head
    Arch("mamba-130m", 50280, 768, 24, 1, 1, 0, tied=True, pattern="M"),
]}


def get(name):
    """The named Arch; an unknown name raises ValueError listing the known ones."""
    if name not in MODELS:
        raise ValueError(f"accounting: unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def from_model_config(cfg, name="model"):
    """The Arch of a `scratchllm.config.ModelConfig` (or any object with its attribute names).

    Reads vocab_size, d_model, n_layers, n_heads, d_ff (required) and the optional n_kv_heads,
    head_dim, tie_embeddings, attention ("gqa" | "mla") with the MLA dims, ffn ("swiglu" | "moe")
    with the MoE sizes, window, n_sink and a hybrid layer pattern, all with getattr, so this
    module never imports the model. The LM keeps the MoE selection bias as a buffer, not a
    Param, so router_bias stays False: totals equal the LM's named_parameters() sizes."""
    missing = [n for n in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff")
               if getattr(cfg, n, None) is None]
    if missing:
        raise TypeError(f"from_model_config: cfg ({type(cfg).__name__}) has no "
                        f"{', '.join(missing)}; expected a scratchllm.config.ModelConfig")
    moe = _attr(cfg, "ffn", default="swiglu") == "moe"
    mla = _attr(cfg, "attention", default="gqa") == "mla"
    moe_sizes = dict(
        n_experts=_attr(cfg, "n_experts", "num_experts", "E"),
        top_k=_attr(cfg, "top_k", "k"), n_shared=_attr(cfg, "n_shared"),
        moe_d_ff=_attr(cfg, "moe_d_ff", "expert_d_ff", "d_ff_expert"),
        n_dense_layers=_attr(cfg, "n_dense_layers"), moe_every=_attr(cfg, "moe_every", default=1))
    mla_sizes = dict(
        q_lora_rank=_attr(cfg, "q_lora_rank"), kv_lora_rank=_attr(cfg, "kv_lora_rank"),
        qk_nope=_attr(cfg, "qk_nope_head_dim", "qk_nope"),
        qk_rope=_attr(cfg, "qk_rope_head_dim", "qk_rope"), v_head_dim=_attr(cfg, "v_head_dim"))
    return Arch(
        name, cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.n_heads,
        _attr(cfg, "n_kv_heads") or cfg.n_heads, cfg.d_ff, head_dim=_attr(cfg, "head_dim"),
        tied=bool(_attr(cfg, "tie_embeddings", "tied")), window=_attr(cfg, "window"),
        n_sink=_attr(cfg, "n_sink"), pattern=_attr(cfg, "layer_pattern", "pattern", default=""),
        d_state=_attr(cfg, "d_state", default=16), d_conv=_attr(cfg, "d_conv", default=4),
        expand=_attr(cfg, "expand", default=2),
        **(moe_sizes if moe else {}), **(mla_sizes if mla else {}))


def _attr(cfg, *names, default=0):
    """The first of `names` that cfg has and is not None, else `default`."""
    for n in names:
        if getattr(cfg, n, None) is not None:
            return getattr(cfg, n)
    return default


# ---------------------------------------------------------------- parameters and FLOPs

class Params(NamedTuple):
    total: int
    active: int   # used by one token: K of the E routed experts
    parts: dict   # component -> (total, active), in print order


def _attention(a):
    """(weights, biases) of one attention layer; MLA includes q_norm and kv_norm."""
    D, H = a.d_model, a.n_heads
    if a.mla:
        Dq, Dc, Dn, Dr, Dv = a.q_lora_rank, a.kv_lora_rank, a.qk_nope, a.qk_rope, a.v_head_dim
        q = D * Dq + Dq + Dq * H * (Dn + Dr) if Dq else D * H * (Dn + Dr)
        return q + D * (Dc + Dr) + Dc + Dc * H * (Dn + Dv) + H * Dv * D, 0
    Dh, Hkv = a.dh, a.n_kv_heads
    biases = H * Dh + 2 * Hkv * Dh + D if a.biases else 0
    return D * H * Dh + 2 * D * Hkv * Dh + H * Dh * D, biases


def _mlp(a, F):
    """(weights, biases) of one MLP of hidden width F: SwiGLU w1, w3, w2 or GELU fc, proj."""
    n = 3 if a.mlp == "swiglu" else 2
    return n * a.d_model * F, ((n - 1) * F + a.d_model if a.biases else 0)


def _mamba(a):
    """One Mamba mixer (mamba-minimal names): in_proj D·2Di, conv1d Di·d_conv + Di,
    x_proj Di·(R + 2N), dt_proj R·Di + Di, A_log Di·N, D Di, out_proj Di·D."""
    D, N, Di, R = a.d_model, a.d_state, a.expand * a.d_model, math.ceil(a.d_model / 16)
    return D * 2 * Di + Di * a.d_conv + Di + Di * (R + 2 * N) + R * Di + Di + Di * N + Di + Di * D


def parameters(a):
    """Params(total, active, parts) of Arch `a`; formulas in the module docstring.
    Routed experts count E times in total and K times in active; the rest counts in both."""
    D, V = a.d_model, a.vocab
    norm = D if a.norm == "rms" else 2 * D
    parts = {}

    def add(name, total, active=None):
        t, s = parts.get(name, (0, 0))
        parts[name] = (t + total, s + (total if active is None else active))

    add("embedding", V * D)
    add("positions", a.n_positions * D)
    add("head", 0 if a.tied else V * D)
    for mixer, ffn in a.layers():
        if mixer == "A":
            weights, biases = _attention(a)
            add("attention", weights)
            add("biases", biases)
        else:
            add("mamba", _mamba(a))
        if ffn == "moe":
            expert = _mlp(a, a.moe_d_ff or a.d_ff)[0]
            add("routed experts", a.n_experts * expert, a.top_k * expert)
            add("shared experts", a.n_shared * expert)
            add("router", D * a.n_experts + (a.n_experts if a.router_bias else 0))
        elif ffn == "dense":
            weights, biases = _mlp(a, a.d_ff)
            add("mlp", weights)
            add("biases", biases)
        add("norms", norm if ffn == "none" else 2 * norm)
    add("norms", norm)
    parts = {k: v for k, v in parts.items() if v[0]}
    return Params(sum(t for t, _ in parts.values()), sum(s for _, s in parts.values()), parts)


def n_attention_layers(a):
    return sum(mixer == "A" for mixer, _ in a.layers())


def flops_per_token(a, context, training=False):
    """FLOPs for one token attending to `context` tokens (Kaplan et al. 2020, Table 1):
    forward 2·N + 2·La·T·H·Dqk, training 3× forward. N = active parameters that enter a
    matmul: the head does (also when tied), embedding and position lookups do not. The Mamba
    scan itself (a few Di·N per token) is not counted."""
    p = parameters(a)
    n = p.active - p.parts.get("embedding", (0, 0))[0] - p.parts.get("positions", (0, 0))[0]
    n += a.vocab * a.d_model if a.tied else 0
    width = a.n_heads * (a.qk_nope + a.qk_rope if a.mla else a.dh)
    forward = 2 * n + 2 * n_attention_layers(a) * context * width
    return 3 * forward if training else forward


# ---------------------------------------------------------------- KV cache and serving memory

def dtype_bytes(dtype):
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"accounting: unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def kv_elements_per_token_layer(a, absorbed=True):
    """Cached numbers per token per attention layer: 2·Hkv·Dh (K and V); MLA absorbed Dc + Dr,
    MLA naive H·(Dn + Dr + Dv) (full K and V per head, DeepSeek-V3 attn_impl="naive")."""
    if a.mla and not absorbed:
        return a.n_heads * (a.qk_nope + a.qk_rope + a.v_head_dim)
    if a.mla:
        return kv_cache_elements("mla", kv_lora_rank=a.kv_lora_rank, qk_rope_head_dim=a.qk_rope)
    return kv_cache_elements("gqa", n_kv_heads=a.n_kv_heads, head_dim=a.dh)


class CacheSize(NamedTuple):
    elements_per_layer: int  # per token per attention layer
    bytes_per_layer: int     # per token per attention layer
    bytes_per_token: int     # per token, all attention layers
    tokens: int              # tokens kept per sequence: T, or window + n_sink
    state_bytes: int         # per sequence, Mamba conv + SSM states: Lm·Di·(d_conv - 1 + N)
    bytes: int               # batch · (tokens · bytes_per_token + state_bytes)


def kv_cache(a, context=1, batch=1, dtype="bf16", absorbed=True):
    """Cache sizes of Arch `a` for `batch` sequences of `context` tokens stored in `dtype`."""
    size = dtype_bytes(dtype)
    elements = kv_elements_per_token_layer(a, absorbed)
    per_token = n_attention_layers(a) * elements * size
    tokens = min(context, a.window + a.n_sink) if a.window else context
    n_mamba = a.n_layers - n_attention_layers(a)
    state = n_mamba * a.expand * a.d_model * (a.d_conv - 1 + a.d_state) * size
    return CacheSize(elements, elements * size, per_token, tokens, state,
                 batch * (tokens * per_token + state))


class ServingMemory(NamedTuple):
    weights: int  # bytes
    cache: int    # bytes
    total: int


def serving_memory(a, context, batch, dtype="bf16", kv_dtype=None):
    """Bytes to serve `batch` sequences of `context` tokens: all weights in `dtype`, plus the
    (absorbed) cache in `kv_dtype` (default: `dtype`). Activations and overheads not counted."""
    weights = parameters(a).total * dtype_bytes(dtype)
    cache = kv_cache(a, context, batch, kv_dtype or dtype).bytes
    return ServingMemory(weights, cache, weights + cache)


# ---------------------------------------------------------------- the `size` command

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


def describe(a):
    """One line of the sizes that matter, e.g. "V 128256, D 4096, L 32, H 32, Hkv 8, ..."."""
    s = f"V {a.vocab}, D {a.d_model}, L {a.n_layers}"
    if n_attention_layers(a):
        s += (f", H {a.n_heads}, MLA Dq {a.q_lora_rank}, Dc {a.kv_lora_rank}, Dn {a.qk_nope}, "
              f"Dr {a.qk_rope}, Dv {a.v_head_dim}" if a.mla
              else f", H {a.n_heads}, Hkv {a.n_kv_heads}, Dh {a.dh}")
    s += f", F {a.d_ff}" if a.d_ff else ""
    s += f", window {a.window} + {a.n_sink} sinks" if a.window else ""
    if a.n_experts:
        s += f", MoE E {a.n_experts} K {a.top_k} S {a.n_shared} Fe {a.moe_d_ff or a.d_ff}"
        s += f" after {a.n_dense_layers} dense layers" if a.n_dense_layers else ""
    if "M" in a.pattern:
        s += f", layers {a.pattern} (M = Mamba N {a.d_state} expand {a.expand} conv {a.d_conv})"
    return s + (", tied head" if a.tied else ", untied head")


def report(a, context, batch, dtype="bf16", kv_dtype=None):
    """The text `python -m scratchllm size` prints: exact integers beside rounded units."""
    kv_dtype = kv_dtype or dtype
    p, c = parameters(a), kv_cache(a, context, batch, kv_dtype)
    s = serving_memory(a, context, batch, dtype, kv_dtype)
    flops = (" kFLOP", " MFLOP", " GFLOP", " TFLOP", " PFLOP")
    row = "  {:<30}{:>26,}  {}".format
    lines = [f"{a.name}: {describe(a)}", "", "parameters (exact, rounded)"]
    lines += [row(name, t, human(t) + (f"  ({act:,} active)" if act != t else ""))
              for name, (t, act) in p.parts.items()]
    lines += [row("total", p.total, human(p.total)),
              row("active per token", p.active, human(p.active))]
    width = "H·(Dn+Dr)" if a.mla else "H·Dh"
    lines += ["", f"FLOPs per token at context {context:,} "
                  f"(2·N_active + 2·L·T·{width}; training 3×)"]
    for name, training in (("forward", False), ("training", True)):
        f = flops_per_token(a, context, training)
        lines.append(row(name, f, human(f, flops)))
    n_attn, per_layer = n_attention_layers(a), "Dc + Dr" if a.mla else "2·Hkv·Dh"
    lines += ["", f"cache in {kv_dtype} ({n_attn} attention layers)"]
    if n_attn:
        lines += [row("elements per token per layer", c.elements_per_layer, f"({per_layer})"),
                  row("bytes per token per layer", c.bytes_per_layer,
                      human_bytes(c.bytes_per_layer)),
                  row("bytes per token", c.bytes_per_token, human_bytes(c.bytes_per_token)),
                  row("tokens kept per sequence", c.tokens, "")]
    if c.state_bytes:
        lines.append(row("Mamba states per sequence", c.state_bytes, human_bytes(c.state_bytes)))
    lines += [row(f"context {context:,} × batch {batch}", c.bytes, human_bytes(c.bytes)),
              "", f"serving memory (weights {dtype}, cache {kv_dtype}; activations not counted)"]
    lines += [row(name, v, human_bytes(v)) for name, v in s._asdict().items()]
    return "\n".join(line.rstrip() for line in lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m scratchllm size",
        description="Parameters, FLOPs per token, KV cache and serving memory of a real model.")
    parser.add_argument("model", nargs="?", help="a model name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the known models")
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--batch", type=int, default=1, help="sequences served at once")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPE_BYTES),
                        help="dtype of the weights (and of the cache unless --kv-dtype)")
    parser.add_argument("--kv-dtype", choices=list(DTYPE_BYTES), help="dtype of the cache")
    args = parser.parse_args(argv)
    if args.list or args.model is None:
        print("\n".join(f"{name:<16} {describe(a)}" for name, a in MODELS.items()))
        return 0
    if args.model not in MODELS:
        parser.error(f"unknown model {args.model!r}; known: {', '.join(MODELS)}")
    if args.context < 1 or args.batch < 1:
        parser.error(f"--context and --batch must be >= 1, got {args.context} and {args.batch}")
    print(report(MODELS[args.model], args.context, args.batch, args.dtype, args.kv_dtype))
    return 0
