"""The chapters' rules of thumb, each beside the exact count it approximates (teach/sizing.py):
12·L·D² for the blocks' weights, 2N / 6N FLOPs per token, the context at which attention
overtakes the weight matmuls, L·W through stacked sliding windows, and a Mamba state against
the KV cache at 1k / 32k / 1M tokens. `python -m scratchllm size` prints them beside the exact
counts (--explain shows the formulas). Pure Python, as sizing is.
"""
from typing import NamedTuple

from scratchllm.specs import FFNSpec, MambaSpec, MoESpec
from scratchllm.teach.sizing import (attention_spec, attention_width, ffns, kv_cache, mixers,
                                     n_attention_layers, parameters, sliding_window, weights)

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
    (each layer reaches W further back). 0 without a window. Mistral-7B-v0.1: 32·4096."""
    window = sliding_window(cfg)
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
        out.append((T, c.tokens * c.bytes_per_token, c.state_bytes))
    return out
