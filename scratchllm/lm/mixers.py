"""Which Module a ModelConfig puts in each block: the token mixer (GQA / sliding-window GQA /
MLA attention, or a Mamba block) and the FFN (SwiGLU or MoE). No math here: the Modules come
from the attention, ssm, moe and core packages; this file only maps config fields to their
constructor arguments.

Every mixer offers forward(x) -> (y, cache), backward(dy, cache) -> dx, and for decoding
init_state(batch, max_len) -> state and decode(x_t, state, position) -> y_t.
"""
from scratchllm.attention import MLA, Attention
from scratchllm.core import SwiGLU
from scratchllm.moe import MoE
from scratchllm.linear_attention import RecurrentMixer, RWKV4TimeMix
from scratchllm.ssm import Mamba, Mamba2

RECURRENT = {"L": "linear", "R": "retnet", "G": "gla", "D": "delta"}  # RecurrentMixer kinds


def make_mixer(cfg, kind, *, rng, dtype):
    """The token mixer of a layer of kind "A" (attention), "M" (Mamba), "S" (Mamba-2),
    "W" (RWKV-4 time-mix) or one of RECURRENT."""
    rope = dict(rope_base=cfg.rope_base, rope_scaling=cfg.rope_scaling,
                rope_style=cfg.rope_style, rng=rng, dtype=dtype)
    if kind in RECURRENT:
        return RecurrentMixer(cfg.d_model, cfg.n_heads, RECURRENT[kind], rng=rng, dtype=dtype)
    if kind == "S":
        return Mamba2(cfg.d_model, n_heads=cfg.n_heads, d_state=cfg.d_state, expand=cfg.expand,
                      rng=rng, dtype=dtype)
    if kind == "W":
        return RWKV4TimeMix(cfg.d_model, rng=rng, dtype=dtype)
    if kind == "M":
        return Mamba(cfg.d_model, d_state=cfg.d_state, d_conv=cfg.d_conv, expand=cfg.expand,
                     dt_rank=cfg.dt_rank, inner_norms=cfg.mamba_inner_norms,
                     norm_eps=cfg.norm_eps, rng=rng, dtype=dtype)
    if cfg.attention == "mla":
        return MLA(cfg.d_model, cfg.n_heads, kv_lora_rank=cfg.kv_lora_rank,
                   qk_nope_head_dim=cfg.qk_nope_head_dim, qk_rope_head_dim=cfg.qk_rope_head_dim,
                   v_head_dim=cfg.v_head_dim, q_lora_rank=cfg.q_lora_rank, eps=cfg.norm_eps,
                   **rope)
    return Attention(cfg.d_model, cfg.n_heads, cfg.n_kv_heads, window=cfg.window,
                     n_sink=cfg.n_sink, mask="causal" if cfg.window is None else "sliding",
                     use_rope=cfg.positions == "rope", alibi=cfg.positions == "alibi",
                     attn_impl=cfg.attn_impl, **rope)


def make_ffn(cfg, moe, *, rng, dtype):
    """SwiGLU, or (moe=True) the MoE layer with its router options; None for ffn="none"."""
    if cfg.ffn == "none":
        return None
    if not moe:
        return SwiGLU(cfg.d_model, cfg.d_ff, rng=rng, dtype=dtype)
    return MoE(cfg.d_model, cfg.d_ff, cfg.n_experts, cfg.top_k,
               capacity_factor=cfg.capacity_factor, d_shared=cfg.n_shared * cfg.d_ff,
               score=cfg.score, router_bias=cfg.router_bias, n_group=cfg.n_group,
               topk_group=cfg.topk_group, norm_topk_prob=cfg.norm_topk_prob,
               routed_scaling_factor=cfg.routed_scaling_factor, rng=rng, dtype=dtype)
