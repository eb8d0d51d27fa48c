"""Which Module a ModelConfig puts in each block: the token mixer (GQA / sliding-window GQA /
MLA attention, or a Mamba block) and the FFN (SwiGLU, MoE, GPT-2's GELU MLP or
Gemma's GeGLU), and the norm (RMSNorm or LayerNorm). No math here: the Modules come
from the attention, ssm, moe and core packages; this file only maps config fields to their
constructor arguments.

Every mixer offers forward(x) -> (y, cache), backward(dy, cache) -> dx, and for decoding
init_state(batch, max_len) -> state and decode(x_t, state, position) -> y_t.
"""
from scratchllm.attention import MLA, Attention
from scratchllm.core import GeGLU, GeluMLP, LayerNorm, RMSNorm, SwiGLU
from scratchllm.moe import MoE
from scratchllm.linear_attention import RecurrentMixer, RWKV4TimeMix
from scratchllm.specs import (ExpertsSpec, Mamba2Spec, MambaSpec, MoESpec, RecurrentSpec,
                              RouterSpec, RWKVSpec)
from scratchllm.ssm import Mamba, Mamba2

RECURRENT = {"L": "linear", "R": "retnet", "G": "gla", "D": "delta"}  # RecurrentMixer kinds


def _layer_attention(cfg, layer):
    """(window, rope base, rope scaling) of attention layer `layer`: with layer_types, a
    sliding layer has the window, and rope_local_base without scaling when that is given
    (Gemma 3) or the full layers' RoPE (gpt-oss); a full layer has no window."""
    if cfg.layer_types is None:
        return cfg.window, cfg.rope_base, cfg.rope_scaling
    if cfg.layer_types[layer] == "sliding_attention" and cfg.rope_local_base is None:
        return cfg.window, cfg.rope_base, cfg.rope_scaling
    if cfg.layer_types[layer] == "sliding_attention":
        return cfg.window, cfg.rope_local_base, None
    return None, cfg.rope_base, cfg.rope_scaling


def make_mixer(cfg, kind, *, rng, dtype, layer=0):
    """The token mixer of layer `layer` of kind "A" (attention), "M" (Mamba), "S" (Mamba-2),
    "W" (RWKV-4 time-mix) or one of RECURRENT."""
    window, base, scaling = _layer_attention(cfg, layer)
    rope = dict(rope_base=base, rope_scaling=scaling, rope_style=cfg.rope_style, rng=rng,
                dtype=dtype)
    if kind in RECURRENT:
        spec = RecurrentSpec(RECURRENT[kind], cfg.n_heads)
        return RecurrentMixer(cfg.d_model, spec, rng=rng, dtype=dtype)
    if kind == "S":
        spec = Mamba2Spec(cfg.n_heads, cfg.d_state, cfg.expand, cfg.d_conv)
        return Mamba2(cfg.d_model, spec, rng=rng, dtype=dtype)
    if kind == "W":
        return RWKV4TimeMix(cfg.d_model, RWKVSpec(), rng=rng, dtype=dtype)
    if kind == "M":
        spec = MambaSpec(cfg.d_state, cfg.d_conv, cfg.expand, cfg.dt_rank,
                         cfg.mamba_inner_norms, cfg.norm_eps)
        return Mamba(cfg.d_model, spec, rng=rng, dtype=dtype)
    if cfg.attention == "mla":
        return MLA(cfg.d_model, cfg.n_heads, kv_lora_rank=cfg.kv_lora_rank,
                   qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim,
                   v_head_dim=cfg.v_head_dim, q_lora_rank=cfg.q_lora_rank, eps=cfg.norm_eps,
                   **rope)
    return Attention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, window=window,
                     n_sink=cfg.n_sink if window else 0,
                     mask="causal" if window is None else "sliding", head_dim=cfg.head_dim,
                     qkv_bias=cfg.qkv_bias, qk_norm=cfg.qk_norm, norm_eps=cfg.norm_eps,
                     norm_offset=cfg.norm_offset, o_bias=cfg.o_bias, scale=cfg.attn_scale,
                     use_rope=cfg.positions == "rope", alibi=cfg.positions == "alibi",
                     attn_impl=cfg.attn_impl, sinks=cfg.attn_sinks, **rope)


def make_ffn(cfg, moe, *, rng, dtype):
    """SwiGLU, GPT-2's GELU MLP, GeGLU, or (moe=True) the MoE layer with its router options;
    None for ffn="none"."""
    if cfg.ffn == "none":
        return None
    if cfg.ffn == "gelu_mlp":
        return GeluMLP(cfg.d_model, cfg.d_ff, rng=rng, approximate=cfg.gelu_approx, dtype=dtype)
    if cfg.ffn == "geglu":
        return GeGLU(cfg.d_model, cfg.d_ff, rng=rng, approximate=cfg.gelu_approx, dtype=dtype)
    if not moe:  # a dense layer (of an MoE model: dense_d_ff wide, DeepSeek-V3)
        return SwiGLU(cfg.d_model, cfg.dense_d_ff or cfg.d_ff, rng=rng, dtype=dtype)
    router = RouterSpec(cfg.n_experts, cfg.top_k, cfg.score, cfg.router_bias, cfg.n_group,
                        cfg.topk_group, cfg.norm_topk_prob, cfg.routed_scaling_factor,
                        cfg.bias_gamma)
    experts = ExpertsSpec(cfg.experts, cfg.d_ff, cfg.swiglu_alpha, cfg.swiglu_limit)
    return MoE(cfg.d_model, MoESpec(router, experts, cfg.capacity_factor,
                                    cfg.n_shared * cfg.d_ff, cfg.balance_coef, cfg.z_coef),
               rng=rng, dtype=dtype)


def make_norm(cfg, dtype):
    """The block and final norm: RMSNorm, or LayerNorm with bias (GPT-2)."""
    if cfg.norm == "layernorm":
        return LayerNorm(cfg.d_model, eps=cfg.norm_eps, dtype=dtype)
    return RMSNorm(cfg.d_model, eps=cfg.norm_eps, offset=cfg.norm_offset, dtype=dtype)
