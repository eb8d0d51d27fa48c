"""Sizing arithmetic for decoder LMs: parameters, FLOPs per token, KV cache, serving memory.

`python -m scratchllm size llama-3-70b --context 65536 --batch 8 --dtype bf16` prints it all
(scratchllm.cli.size). Pure Python: this module imports only the standard library.
Weights are counted as the reference code stores them (no biases unless `biases=True`).

Parameters per layer (La attention layers, Lm Mamba layers, L = La + Lm):
    attention   D·H·Dh + 2·D·Hkv·Dh + H·Dh·D                     (wq, wk, wv, wo; MHA/GQA/MQA)
    MLA         D·Dq + Dq + Dq·H·(Dn+Dr) + D·(Dc+Dr) + Dc + Dc·H·(Dn+Dv) + H·Dv·D
                (wq_a, q_norm, wq_b, wkv_a, kv_norm, wkv_b, wo; Dq = 0: wq is D·H·(Dn+Dr))
    Mamba       D·2Di + Di·(d_conv+1) + Di·(R+2N) + R·Di + Di + Di·N + Di + Di·D   (see _mamba)
    recurrent   linear attention, RetNet, GLA, DeltaNet, Mamba-2, RWKV-4 (see _recurrent)
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
import math
from typing import NamedTuple


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


DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "fp16": 2, "float16": 2, "fp8": 1, "int8": 1}


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


def _recurrent(a, kind):
    """(params, state numbers per sequence) of one recurrent mixer of scratchllm's lm/mixers.py:
    L/R/G/D wq, wk, wv, wo (D·D each) + G's gate D·D or D's β D·H, state H·Dh·Dh
    (L: H·Dh·(Dh + 1), with z); S (Mamba-2) Wz, Wx D·Di, WB, WC D·N, Wdt D·H, 3 H-vectors,
    the conv (Di + 2N)·(d_conv + 1), the norm Di, Wout Di·D, state N·Di + (d_conv − 1)·(Di + 2N);
    W (RWKV-4 time-mix) 4·D·D + 5·D, state 4·D."""
    D, H, Dh, N, Di = a.d_model, a.n_heads, a.dh, a.d_state, a.expand * a.d_model
    if kind == "S":
        conv = Di + 2 * N  # channels of the conv over [x | B | C]
        return (2 * D * Di + 2 * D * N + D * H + 3 * H + conv * (a.d_conv + 1) + Di + Di * D,
                N * Di + (a.d_conv - 1) * conv)
    if kind == "W":
        return 4 * D * D + 5 * D, 4 * D
    extra = {"G": D * D, "D": D * H}.get(kind, 0)
    return 4 * D * D + extra, H * Dh * (Dh + (kind == "L"))


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
        elif mixer == "M":
            add("mamba", _mamba(a))
        else:
            add("recurrent", _recurrent(a, mixer)[0])
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
    scan itself (a few Di·N per token) is not counted. A sliding window attends to at most
    window + n_sink tokens, so T = min(context, window + n_sink) there."""
    p = parameters(a)
    n = p.active - p.parts.get("embedding", (0, 0))[0] - p.parts.get("positions", (0, 0))[0]
    n += a.vocab * a.d_model if a.tied else 0
    width = a.n_heads * (a.qk_nope + a.qk_rope if a.mla else a.dh)
    T = min(context, a.window + a.n_sink) if a.window else context
    forward = 2 * n + 2 * n_attention_layers(a) * T * width
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
    state_bytes: int         # per sequence, Mamba conv + SSM states: Lm·Di·(d_conv - 1 + N),
                             # + the recurrent mixers' states (_recurrent)
    bytes: int               # batch · (tokens · bytes_per_token + state_bytes)


def kv_cache(a, context=1, batch=1, dtype="bf16", absorbed=True):
    """Cache sizes of Arch `a` for `batch` sequences of `context` tokens stored in `dtype`."""
    size = dtype_bytes(dtype)
    elements = kv_elements_per_token_layer(a, absorbed)
    per_token = n_attention_layers(a) * elements * size
    tokens = min(context, a.window + a.n_sink) if a.window else context
    n_mamba = sum(mixer == "M" for mixer, _ in a.layers())
    state = n_mamba * a.expand * a.d_model * (a.d_conv - 1 + a.d_state) * size
    state += sum(_recurrent(a, m)[1] for m, _ in a.layers() if m not in "AM") * size
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


# ---------------------------------------------------------------- the chapters' rules of thumb
# Printed beside the exact counts by `python -m scratchllm size` (--explain shows the formulas).
CONTEXTS = (1024, 32768, 1048576)  # 1k, 32k, 1M tokens


def twelve_l_d2(a):
    """GPT-3's rule for the weights in the blocks: 12·L·D² (per block 4·D² + 8·D², below);
    embeddings, biases and norms are left out. GPT-3: 12·96·12288² = 173,946,175,488."""
    return 12 * a.n_layers * a.d_model ** 2


def block_pieces(a):
    """[(piece, rule, exact)] per block: attention 4·D² (wq, wk, wv, wo, each D·D for MHA) and
    MLP 8·D² (two D·4D matrices), against the Arch's own matrices: one attention layer
    (GQA and MLA are smaller) and the MLP a token passes through (SwiGLU has three matrices;
    MoE: K routed + S shared experts)."""
    D = a.d_model
    attention = _attention(a)[0] if n_attention_layers(a) else 0
    if a.n_experts:
        mlp = (a.top_k + a.n_shared) * _mlp(a, a.moe_d_ff or a.d_ff)[0]
    else:
        mlp = _mlp(a, a.d_ff)[0] if a.d_ff else 0
    return [("attention", 4 * D * D, attention), ("mlp", 8 * D * D, mlp)]


def flop_rules(a):
    """(2·N, 6·N): forward and training FLOPs per token by the rule, N = active parameters
    (all of them, embeddings too, and no attention term: compare flops_per_token)."""
    n = parameters(a).active
    return 2 * n, 6 * n


def attention_width(a):
    """H·Dqk, the query-key width the attention term multiplies (MLA: Dqk = Dn + Dr)."""
    return a.n_heads * (a.qk_nope + a.qk_rope if a.mla else a.dh)


def attention_crossover(a, convention="4n2d"):
    """The context n at which attention's n-dependent FLOPs equal the block's weight matmuls,
    per token per layer: weights 2·P with P = the two block_pieces' exact sum (12·D² in GPT-3);
      "4n2d" (the chapter): attention 4·n²·Dattn per sequence (QKᵀ and PV, 2 FLOPs per
             multiply-add), 4·n·Dattn per token  ->  n = P / (2·Dattn)   (GPT-3: 6·D);
      "2Td"  (Kaplan et al. 2020, Table 1, and flops_per_token): 2·T·Dattn per token, the QKᵀ
             product only  ->  n = P / Dattn                              (GPT-3: 12·D).
    Dattn = attention_width(a). None without attention layers. No causal halving in either."""
    if convention not in ("4n2d", "2Td"):
        raise ValueError(f"attention_crossover: convention must be '4n2d' or '2Td', "
                         f"got {convention!r}")
    if not n_attention_layers(a):
        return None
    P = sum(exact for _, _, exact in block_pieces(a))
    return P / ((2 if convention == "4n2d" else 1) * attention_width(a))


def receptive_field(a):
    """L·W tokens: how far back the last layer sees through stacked sliding windows of W
    (each layer reaches W further back). 0 without a window. Mistral-7B-v0.1: 32·4096."""
    return n_attention_layers(a) * a.window if a.window else 0


class MambaStateSize(NamedTuple):
    chapter: int  # D·N numbers per layer: one N-vector per model channel
    full: int     # Di·N + (d_conv - 1)·Di: what a decoding Mamba layer holds


def mamba_state_numbers(a):
    """Numbers one Mamba layer keeps per sequence while decoding, two ways. The chapter's D·N
    leaves out (1) the expand factor: the scan runs on Di = expand·D channels, not D, and
    (2) the conv state: the causal conv keeps its last d_conv - 1 inputs of Di channels."""
    Di = a.expand * a.d_model
    return MambaStateSize(a.d_model * a.d_state, Di * a.d_state + (a.d_conv - 1) * Di)


def cache_at(a, contexts=CONTEXTS, dtype="bf16"):
    """[(context, KV-cache bytes, Mamba-state bytes)] for one sequence at each context."""
    out = []
    for T in contexts:
        c = kv_cache(a, T, 1, dtype)
        out.append((T, c.tokens * c.bytes_per_token, c.state_bytes))
    return out
