"""ModelConfig -> flat names: the inverse of from_flat, for what speaks flat names (a Hugging
Face config.json is one flat dict). A config the flat names cannot express (layers whose
attention differs in more than window and local RoPE, MoE layers in no moe_every pattern, two
norms, ...) is a ValueError saying so: to_flat builds its answer, then checks that
from_flat(**answer) gives the config back.
"""
import dataclasses

from scratchllm.specs.attention import AttentionSpec
from scratchllm.specs.ffn import MoESpec
from scratchllm.specs.flat import RECURRENT, Flat, from_flat
from scratchllm.specs.mixers import (GatedDeltaNetSpec, Mamba2Spec, MambaSpec, RecurrentSpec,
                                     RWKVSpec)
from scratchllm.specs.mla import MLASpec

LETTER = {MambaSpec: "M", Mamba2Spec: "S", RWKVSpec: "W", AttentionSpec: "A", MLASpec: "A",
          GatedDeltaNetSpec: "N"}
KIND_LETTER = {kind: letter for letter, kind in RECURRENT.items()}


def to_flat(cfg):
    """{flat name: value} (only names whose value differs from Flat's default) with
    from_flat(**to_flat(cfg)) == cfg; ValueError if the flat names cannot say cfg."""
    layers = cfg.layers
    flat = dict(name=cfg.name, vocab_size=cfg.vocab_size, d_model=cfg.d_model,
                n_layers=len(layers), tie_embeddings=cfg.tie_embeddings,
                embed_scale=cfg.embed_scale, max_positions=cfg.max_positions,
                norm=cfg.norm.kind, norm_eps=cfg.norm.eps, norm_offset=cfg.norm.offset,
                block=layers[0].placement, type_vocab_size=cfg.type_vocab_size,
                embed_norm=cfg.embed_norm, final_norm=cfg.final_norm,
                mlm_head=cfg.head.transform, pad_id=cfg.pad_id,
                logit_softcap=cfg.logit_softcap,
                rescale_every=next((i + 1 for i, layer in enumerate(layers)
                                    if layer.out_scale != 1.0), 0))
    if cfg.mtp is not None:
        flat.update(mtp_depth=cfg.mtp.depth, mtp_weight=cfg.mtp.weight)
    if cfg.head.transform:  # the FFN's GELU below, when it has one, must be the same
        flat["gelu_approx"] = cfg.head.gelu_approx
    kinds = "".join(mixer_letter(layer.mixer) for layer in layers)
    flat["layer_pattern"] = None if set(kinds) == {"A"} else kinds
    flat.update(_mixer_fields(cfg))
    flat.update(_ffn_fields(layers))
    defaults = dataclasses.asdict(Flat())
    flat = {k: v for k, v in flat.items() if v != defaults[k]}
    try:
        again = from_flat(**flat)
    except ValueError as e:
        raise ValueError(f"to_flat: {cfg.name!r} has no flat form ({e})") from None
    if again != cfg:
        diff = [i for i, (a, b) in enumerate(zip(again.layers, layers)) if a != b]
        raise ValueError(f"to_flat: {cfg.name!r} has no flat form: layers {diff} differ from "
                         f"what the flat names can say (one attention spec but for window and "
                         f"local RoPE, one norm, MoE layers in a moe_every pattern)")
    return flat


def flat_view(cfg):
    """Every flat name of cfg as attributes (a Flat): `flat_view(cfg).n_heads`."""
    return Flat(**to_flat(cfg))


def mixer_letter(mixer):
    """The layer_pattern letter (LAYER_KINDS) of a mixer spec: "A" attention, "M" Mamba, ...,
    "F" for None (an MLP-only layer)."""
    if mixer is None:
        return "F"
    return KIND_LETTER[mixer.kind] if isinstance(mixer, RecurrentSpec) else LETTER[type(mixer)]


def _mixer_fields(cfg):
    """The attention, MLA, Mamba and recurrent fields, from the first layer of each kind."""
    mixers = [layer.mixer for layer in cfg.layers]
    out = {"positions": cfg.positions if cfg.positions != "none" else "rope"}
    for m in reversed(mixers):  # the first of each kind wins
        if isinstance(m, (RecurrentSpec, Mamba2Spec)):
            out["n_heads"] = m.n_heads
        if isinstance(m, (MambaSpec, Mamba2Spec)):
            out.update(d_state=m.d_state, d_conv=m.d_conv, expand=m.expand)
        if isinstance(m, Mamba2Spec):
            out["ssm_groups"] = m.n_groups
        if isinstance(m, MambaSpec):
            out.update(dt_rank=m.dt_rank, mamba_inner_norms=m.inner_norms, mamba_scan=m.scan)
        if isinstance(m, GatedDeltaNetSpec):
            out.update(gdn_k_heads=m.n_k_heads, gdn_v_heads=m.n_v_heads,
                       gdn_k_head_dim=m.k_head_dim, gdn_v_head_dim=m.v_head_dim,
                       d_conv=m.d_conv)
    attention = [m for m in mixers if isinstance(m, AttentionSpec)]
    mla = [m for m in mixers if isinstance(m, MLASpec)]
    if mla:
        m = mla[0]
        out.update(attention="mla", n_heads=m.n_heads, q_lora_rank=m.q_lora_rank,
                   kv_lora_rank=m.kv_lora_rank, qk_nope_head_dim=m.qk_nope_head_dim,
                   qk_rope_head_dim=m.qk_rope_head_dim, v_head_dim=m.v_head_dim,
                   mla_norm_eps=m.norm_eps,
                   **_rope_fields(m.rope))
        if m.indexer is not None:
            out.update(index_topk=m.indexer.top_k, index_n_heads=m.indexer.n_heads,
                       index_head_dim=m.indexer.head_dim)
    if attention:
        out.update(_attention_fields(attention, cfg.positions, mixers))
    return out


def _rope_fields(rope):
    return dict(rope_base=rope.base, rope_scaling=rope.scaling, rope_style=rope.style,
                rope_partial=rope.partial)


def _attention_fields(attention, positions, mixers):
    roped = [m for m in attention if m.rope is not None]
    a = (roped or attention)[0]  # the first RoPE layer speaks for the NoPE ones too
    out = dict(n_heads=a.n_heads, n_kv_heads=a.n_kv_heads, head_dim=a.head_dim,
               qkv_bias=a.qkv_bias, o_bias=a.o_bias, qk_norm=a.qk_norm,
               attn_scale=a.scale, attn_sinks=a.sinks, attn_impl=a.impl,
               attn_softcap=a.softcap, causal=a.mask.causal, attn_output_gate=a.output_gate)
    if positions == "none":
        out["positions"] = "alibi" if a.alibi else "rope" if a.rope is not None else "nope"
    temperature = [m.temperature for m in attention if m.temperature is not None]
    if temperature:  # Llama 4's query temperature on its NoPE layers
        out["attn_temperature"] = [temperature[0].attn_scale, temperature[0].floor_scale]
    if roped and len(roped) < len(attention):  # NoPE layers among RoPE layers (Llama 4)
        out["nope_layers"] = [i for i, m in enumerate(mixers)
                              if isinstance(m, AttentionSpec) and m.rope is None]
    windows = {m.mask.window for m in attention}
    sliding = [m for m in attention if m.mask.window is not None]
    full = [m for m in attention if m.mask.window is None]
    chunked = [m for m in attention if m.mask.chunk is not None]
    out["window"] = sliding[0].mask.window if sliding else None
    out["n_sink"] = sliding[0].mask.n_sink if sliding else 0
    out["attention_chunk"] = chunked[0].mask.chunk if chunked else None
    rope = ([m for m in full if m.rope is not None] or sliding or full)[0].rope
    if rope is not None:
        out.update(_rope_fields(rope))
    if len(windows) > 1 or chunked:  # sliding (chunked) and full layers: Gemma 2/3, gpt-oss
        out["layer_types"] = [_layer_type(m) for m in mixers]
        if full and sliding and sliding[0].rope != full[0].rope and sliding[0].rope is not None:
            out["rope_local_base"] = sliding[0].rope.base
    return out


def _layer_type(mixer):
    """A layer_types entry: "sliding_attention", "chunked_attention" or "full_attention"."""
    mask = mixer.mask if isinstance(mixer, AttentionSpec) else None
    if mask is not None and mask.window is not None:
        return "sliding_attention"
    return "chunked_attention" if mask is not None and mask.chunk else "full_attention"


def _ffn_fields(layers):
    ffns = [layer.ffn for layer in layers]
    if all(f is None for f in ffns):
        return {"ffn": "none"}
    moe = [i for i, f in enumerate(ffns) if isinstance(f, MoESpec)]
    if not moe:
        f = next(f for f in ffns if f is not None)
        return dict(ffn=f.kind, d_ff=f.d_ff, gelu_approx=f.gelu_approx)
    m = ffns[moe[0]]
    dense = [f for f in ffns if f is not None and not isinstance(f, MoESpec)]
    out = dict(ffn="moe", d_ff=m.experts.d_ff, n_experts=m.router.n_experts,
               top_k=m.router.top_k, score=m.router.score, router_bias=m.router.bias,
               n_group=m.router.n_group, topk_group=m.router.topk_group,
               group_top=m.router.group_top,
               norm_topk_prob=m.router.norm_topk_prob,
               routed_scaling_factor=m.router.routed_scaling_factor,
               bias_gamma=m.router.bias_gamma, experts=m.experts.kind,
               swiglu_alpha=m.experts.alpha, swiglu_limit=m.experts.limit,
               capacity_factor=m.capacity_factor, n_shared=m.d_shared // m.experts.d_ff,
               balance_coef=m.balance_coef, z_coef=m.z_coef, moe_gate_input=m.gate_input,
               shared_gate=m.shared_gate,
               dense_d_ff=dense[0].d_ff if dense and dense[0].d_ff != m.experts.d_ff else None)
    out.update(moe_pattern(moe, len(layers)))
    return out


def moe_pattern(moe, n_layers):
    """first_k_dense, moe_every, moe_offset whose layers i >= first_k_dense with i % moe_every
    == moe_offset are exactly `moe` (the simplest such choice, first_k_dense = 0 if a period
    alone says it; {} if none is)."""
    for first in (0, moe[0]):
        for every in range(1, n_layers + 1):
            offset = moe[0] % every
            if [i for i in range(first, n_layers) if i % every == offset] == moe:
                return dict(first_k_dense=first, moe_every=every,
                            moe_offset=None if offset == every - 1 else offset)
    return {}
