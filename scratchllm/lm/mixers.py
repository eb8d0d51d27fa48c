"""Which Module a spec becomes: the token mixer of a LayerSpec (GQA attention, MLA, Mamba,
Mamba-2, a linear-attention-family recurrence, RWKV-4's time mix), a cross-attention sub-layer,
and the norms (RMSNorm or LayerNorm). No math here: the Modules come from the attention, ssm,
linear_attention and core packages; each function below only maps a spec's fields onto its
Module's constructor.

Every mixer offers forward(x) -> (y, cache), backward(dy, cache) -> dx, and for decoding
init_state(batch, max_len) -> state, decode(x_t, state, position) -> y_t and (attention, MLA,
Mamba) prefill(x, state) -> y.
"""
from scratchllm.attention import MLA, Attention, CrossAttention
from scratchllm.core import LayerNorm, RMSNorm
from scratchllm.linear_attention import RecurrentMixer, RWKV4TimeMix
from scratchllm.specs import (AttentionSpec, Mamba2Spec, MambaSpec, Mask, MLASpec,
                              RecurrentSpec, RWKVSpec)
from scratchllm.ssm import Mamba, Mamba2


def _rope(rope):
    """A RopeSpec as the rope keywords of Attention and MLA."""
    return dict(rope_base=rope.base, rope_scaling=rope.scaling, rope_style=rope.style)


def attention(d_model, spec, *, rng, dtype):
    """GQA self-attention (MHA at n_kv_heads = n_heads): causal, sliding-window (+ sinks) or
    bidirectional (an encoder's Mask(causal=False))."""
    m = spec.mask
    if m.block is not None or m.array is not None:
        raise ValueError(f"attention: a block or array mask is not a model layer's mask, got "
                         f"mask={m!r}")
    kind = "sliding" if m.window is not None else "causal" if m.causal else "none"
    rope = {} if spec.rope is None else _rope(spec.rope)
    return Attention(d_model, spec.n_heads, spec.n_kv_heads, rng=rng, head_dim=spec.head_dim,
                     use_rope=spec.rope is not None, mask=kind, window=m.window,
                     n_sink=m.n_sink, qkv_bias=spec.qkv_bias, o_bias=spec.o_bias,
                     qk_norm=spec.qk_norm, norm_eps=spec.norm_eps,
                     norm_offset=spec.norm_offset, scale=spec.scale, dtype=dtype,
                     attn_impl=spec.impl, alibi=spec.alibi, flash_block=spec.block,
                     sinks=spec.sinks, **rope)


def mla(d_model, spec, *, rng, dtype):
    """Multi-head latent attention (DeepSeek-V2/V3)."""
    return MLA(d_model, spec.n_heads, kv_lora_rank=spec.kv_lora_rank,
               qk_nope_head_dim=spec.qk_nope_head_dim, qk_rope_head_dim=spec.qk_rope_head_dim,
               v_head_dim=spec.v_head_dim, q_lora_rank=spec.q_lora_rank, eps=spec.norm_eps,
               rng=rng, dtype=dtype, **_rope(spec.rope))


def mamba(d_model, spec, *, rng, dtype):
    """A Mamba (S6) block."""
    return Mamba(d_model, d_state=spec.d_state, d_conv=spec.d_conv, expand=spec.expand,
                 dt_rank=spec.dt_rank, inner_norms=spec.inner_norms, norm_eps=spec.norm_eps,
                 rng=rng, dtype=dtype)


def mamba2(d_model, spec, *, rng, dtype):
    """A Mamba-2 (SSD) block."""
    return Mamba2(d_model, n_heads=spec.n_heads, d_state=spec.d_state, expand=spec.expand,
                  d_conv=spec.d_conv, chunk=spec.chunk, rng=rng, dtype=dtype)


def recurrent(d_model, spec, *, rng, dtype):
    """Linear attention, RetNet, GLA or DeltaNet."""
    return RecurrentMixer(d_model, spec.n_heads, spec.kind, chunk=spec.chunk, rng=rng,
                          dtype=dtype)


def rwkv(d_model, spec, *, rng, dtype):
    """RWKV-4's time mixing."""
    return RWKV4TimeMix(d_model, rng=rng, dtype=dtype)


MIXERS = {AttentionSpec: attention, MLASpec: mla, MambaSpec: mamba, Mamba2Spec: mamba2,
          RecurrentSpec: recurrent, RWKVSpec: rwkv}


def make_mixer(d_model, spec, *, rng, dtype):
    """The token mixer Module of a mixer spec (LayerSpec.mixer)."""
    if type(spec) not in MIXERS:
        raise TypeError(f"make_mixer: spec must be one of {[c.__name__ for c in MIXERS]}, got "
                        f"{type(spec).__name__}")
    return MIXERS[type(spec)](d_model, spec, rng=rng, dtype=dtype)


def make_cross(d_model, spec, *, rng, dtype):
    """The cross-attention Module of an AttentionSpec that has only heads (n_heads,
    n_kv_heads, head_dim): no RoPE, no mask (every query reads the whole context), none of the
    self-attention options."""
    plain = AttentionSpec(spec.n_heads, spec.n_kv_heads, spec.head_dim, rope=None,
                          mask=Mask(causal=False))
    if spec != plain:
        raise ValueError(f"make_cross: cross-attention takes n_heads, n_kv_heads and head_dim "
                         f"only (rope=None, mask=Mask(causal=False)), got {spec!r}")
    return CrossAttention(d_model, spec.n_heads, spec.n_kv_heads, rng=rng,
                          head_dim=spec.head_dim, dtype=dtype)


def make_norm(d_model, spec, dtype):
    """A NormSpec's Module: RMSNorm (gain offset + g), or LayerNorm with bias (GPT-2)."""
    if spec.kind == "layernorm":
        if spec.offset:
            raise ValueError(f"make_norm: a gain offset ({spec.offset}) is an RMSNorm option; "
                             f"LayerNorm has none")
        return LayerNorm(d_model, eps=spec.eps, dtype=dtype)
    return RMSNorm(d_model, eps=spec.eps, offset=spec.offset, dtype=dtype)
