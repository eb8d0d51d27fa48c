"""The chapters' rules of thumb, each beside the exact count it approximates (teach/sizing.py):
12·L·D² for the blocks' weights, 2N / 6N FLOPs per token, the context at which attention
overtakes the weight matmuls, L·W through stacked sliding windows, and a Mamba state against
the KV cache at 1k / 32k / 1M tokens, F ≈ 8/3·D (Llama: 3.5·D), the embedding's share of a
small model with a large vocabulary, DeepSeek-V2's KV cut against DeepSeek 67B, and Gemma 3's
KV cache against its weights at 32K with and without its local layers.
`python -m scratchllm size` prints them beside the exact counts (--explain shows the
formulas). Pure Python, as sizing is.
"""
from typing import NamedTuple

from scratchllm.specs import FFNSpec, MambaSpec, MoESpec
from scratchllm.teach.arch import without_windows
from scratchllm.teach.sizing import (attention_spec, attention_width, ffns, kv_cache, mixers,
                                     n_attention_layers, n_global_layers, nbytes, parameters,
                                     sliding_window, weights)

CONTEXTS = (1024, 32768, 1048576)  # 1k, 32k, 1M tokens


def twelve_l_d2(cfg):
    """GPT-3's rule for the weights in the blocks: 12·L·D² (per block 4·D² + 8·D², below);
    embeddings, biases and norms are left out. GPT-3: 12·96·12288² = 173,946,175,488."""
    return 12 * cfg.n_layers * cfg.d_model ** 2


def block_ffn(cfg):
    """The FFN a token passes through in a block: an MoE layer's if cfg has one, else the
    first dense FFN; None for mixer-only blocks."""
    return (ffns(cfg, MoESpec) or ffns(cfg, FFNSpec) or [None])[0]


def block_pieces(cfg):
    """[(piece, rule, exact)] per block: attention 4·D² (wq, wk, wv, wo, each D·D for MHA) and
    MLP 8·D² (two D·4D matrices), against the model's own weights (biases left out): one
    attention layer (GQA and MLA are smaller) and the FFN a token passes through (SwiGLU has
    three matrices; MoE: K routed experts + the shared ones)."""
    D, attn, ffn = cfg.d_model, attention_spec(cfg), block_ffn(cfg)
    attention = weights(attn, D) if attn else 0
    if isinstance(ffn, MoESpec):
        mlp = ffn.n_params(D, active=True) - ffn.router.n_params(D)
    else:
        mlp = weights(ffn, D) if ffn else 0
    return [("attention", 4 * D * D, attention), ("mlp", 8 * D * D, mlp)]


def flop_rules(cfg):
    """(2·N, 6·N): forward and training FLOPs per token by the rule, N = active parameters
    (all of them, embeddings too, and no attention term: compare flops_per_token)."""
    n = parameters(cfg).active
    return 2 * n, 6 * n


def attention_crossover(cfg, convention="4n2d"):
    """The context n at which attention's n-dependent FLOPs equal the block's weight matmuls,
    per token per layer: weights 2·P with P = the two block_pieces' exact sum (12·D² in GPT-3);
      "4n2d" (the chapter): attention 4·n²·Dattn per sequence (QKᵀ and PV, 2 FLOPs per
             multiply-add), 4·n·Dattn per token  ->  n = P / (2·Dattn)   (GPT-3: 6·D);
      "2Td"  (Kaplan et al. 2020, Table 1, and flops_per_token): 2·T·Dattn per token, the QKᵀ
             product only  ->  n = P / Dattn                              (GPT-3: 12·D).
    Dattn = attention_width(cfg). None without attention layers. No causal halving in either."""
    if convention not in ("4n2d", "2Td"):
        raise ValueError(f"attention_crossover: convention must be '4n2d' or '2Td', "
                         f"got {convention!r}")
    if not n_attention_layers(cfg):
        return None
    P = sum(exact for _, _, exact in block_pieces(cfg))
    return P / ((2 if convention == "4n2d" else 1) * attention_width(cfg))


def receptive_field(cfg):
    """L·W tokens: how far back the last layer sees through stacked sliding windows of W
    (each layer reaches W further back). 0 without a window; None when some layers have one
    and others are global (Gemma 3): a global layer sees every token. Mistral-7B-v0.1:
    32·4096."""
    window = sliding_window(cfg)
    if window and n_global_layers(cfg):
        return None
    return n_attention_layers(cfg) * window if window else 0


class MambaStateSize(NamedTuple):
    chapter: int  # D·N numbers per layer: one N-vector per model channel
    full: int     # Di·N + (d_conv - 1)·Di: what a decoding Mamba layer holds


def mamba_state_numbers(cfg):
    """Numbers one Mamba layer of cfg keeps per sequence while decoding, two ways. The
    chapter's D·N leaves out (1) the expand factor: the scan runs on Di = expand·D channels,
    not D, and (2) the conv state: the causal conv keeps its last d_conv - 1 inputs of Di
    channels (MambaSpec.state_per_sequence counts both)."""
    found = mixers(cfg, MambaSpec)
    if not found:
        raise ValueError(f"mamba_state_numbers: cfg {cfg.name!r} has no Mamba layer")
    D = cfg.d_model
    return MambaStateSize(D * found[0].d_state, found[0].state_per_sequence(D))


def cache_at(cfg, contexts=CONTEXTS, dtype="bf16"):
    """[(context, KV-cache bytes, Mamba-state bytes)] for one sequence at each context."""
    out = []
    for T in contexts:
        c = kv_cache(cfg, T, 1, dtype)
        out.append((T, c.kv_bytes, c.state_bytes))
    return out


# ------------------------------------------------------------- the chapters' other numbers
SWIGLU_RULE = 8 / 3  # F ≈ 8/3·D keeps a SwiGLU's three matrices at the MLP's 8·D² (3·D·F)


def ffn_ratio(cfg):
    """F / D of cfg's dense FFN (None without one), beside the rules 8/3 (a SwiGLU at the 4·D
    MLP's cost) and Llama 3's 3.5 (int(8D/3) times an ffn_dim_multiplier, rounded up to a
    multiple: 14,336 = 3.5 · 4096 in Llama 3 8B)."""
    dense = ffns(cfg, FFNSpec)
    return dense[0].d_ff / cfg.d_model if dense else None


class EmbeddingShare(NamedTuple):
    params: int  # the token embedding, plus the head when it is not tied
    total: int   # all parameters


def embedding_share(cfg):
    """The embedding's parameters (V·D, twice when the head is untied) against the total: the
    chapter's "a 1B model with a 128K vocabulary spends ~260M on embeddings" is Llama 3.2 1B,
    128,256 · 2,048 = 262,668,288 of 1.24B (tied)."""
    table = cfg.vocab_size * cfg.d_model
    return EmbeddingShare(table * (1 if cfg.tie_embeddings else 2), parameters(cfg).total)


class KVCut(NamedTuple):
    elements: int       # cached numbers per token, all layers, of cfg
    reference: int      # the same for the reference model
    cut: float          # 1 − elements / reference
    cut_quantised: float  # 1 − (elements · bits) / (reference · 16): cfg's cache at `bits`


def kv_cut(cfg, reference, bits=6):
    """cfg's KV cache per token against a reference model's in bf16. DeepSeek-V2 (60 layers of
    Dc + Dr = 576) against DeepSeek 67B (95 layers of 2·8·128): 34,560 against 194,560 numbers,
    an 82.2% cut; the paper's 93.3% (arXiv 2405.04434 §3.2.3) also stores V2's cache at 6 bits
    per element on average (FP8 with KV-cache quantisation) against 67B's 16."""
    mine = n_attention_layers(cfg) * kv_cache(cfg).elements_per_layer
    ref = n_attention_layers(reference) * kv_cache(reference).elements_per_layer
    return KVCut(mine, ref, 1 - mine / ref, 1 - mine * bits / (ref * 16))


class KVOverhead(NamedTuple):
    kv: int             # bytes of one sequence's KV cache at the context, as cfg's layers keep it
    weights: int        # bytes of all the weights
    ratio: float        # kv / weights
    global_kv: int      # the same cache with every layer global (without_windows)
    global_ratio: float  # global_kv / weights


def kv_overhead(cfg, context=32768, dtype="bf16"):
    """One sequence's KV cache against the weights' memory, both in `dtype`, as cfg keeps it
    and with every attention layer global. The Gemma 3 report (arXiv 2503.19786, §5, Fig. 5:
    KV cache against model memory with a 32K pre-fill) finds a global-only model's cache near
    60% of its weights and the local:global mix under 15%. Gemma 3 4B (34 layers, 2·4·256
    numbers per token per layer; 5 global layers keep 32,768 tokens, 29 local ones 1,024):
    4,563,402,752 bytes all global = 58.8% of 7,760,526,336 bf16 weight bytes; 792,723,456 =
    10.2% with its windows."""
    weights = nbytes(parameters(cfg).total, dtype)
    kv = kv_cache(cfg, context, 1, dtype).kv_bytes
    full = kv_cache(without_windows(cfg), context, 1, dtype).kv_bytes
    return KVOverhead(kv, weights, kv / weights, full, full / weights)


class Int4Weights(NamedTuple):
    rule: int   # ½ byte per parameter
    exact: int  # 4-bit codes and a bf16 scale per group (sizing.dtype_bytes)


def int4_weights(cfg, dtype="int4"):
    """cfg's weights in 4 bits: the rule's ½ byte per parameter (Llama 3 70B in ~35 GB)
    against the bytes with the scales, 2/g more per parameter (g = 128: +3.1%; int4-g32,
    llama.cpp's Q4_0: +12.5%)."""
    n = parameters(cfg).total
    return Int4Weights(n // 2 + n % 2, nbytes(n, dtype))
