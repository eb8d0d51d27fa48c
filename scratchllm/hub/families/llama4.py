"""Llama 4's text model, llama4_text (Llama4ForCausalLM). No math here: the LM builds it from
the library's pairs (attention/gqa.py with a chunked Mask, moe/layer.py with the gate on the
experts' input).

    llama4_text  llama's block (RMSNorm pre-norm, GQA, SwiGLU) with
                 - RoPE in (2i, 2i + 1) pairs (transformers' complex rotation), absent in the
                   NoPE layers (no_rope_layers[i] == 0; by default every
                   no_rope_layer_interval-th layer)
                 - chunked local attention in the "chunked_attention" layers of layer_types
                   (by default the RoPE layers): a query sees the keys of its own chunk of
                   attention_chunk_size positions only; the NoPE layers attend globally
                 - use_qk_norm: an L2-norm (RMSNorm without gains, eps rms_norm_eps) on each
                   q and k head of the RoPE layers, after RoPE (a rotation keeps the norm,
                   so the library's norm before RoPE is the same; qk_norm "l2")
                 - the MoE layers of moe_layers (by default every interleave_moe_layer_step-th
                   layer), the others a dense SwiGLU of intermediate_size_mlp: a router
                   whose top-k logits pass a sigmoid (the others 0), each chosen expert
                   reading its input scaled by that gate, expert(g x) (moe_gate_input), plus
                   one shared expert; experts and shared expert intermediate_size wide
                 - attn_temperature_tuning: on the NoPE layers each query times
                   log1p(floor((p + 1) / floor_scale)) attn_scale + 1 (flat
                   attn_temperature [attn_scale, floor_scale], a TemperatureSpec)
                                   (Meta 2025, "The Llama 4 herd"; transformers' Llama4TextMoe)

Names ("T" transposed), in model.layers.i.:

    library                         transformers
    mixer.wq / wk / wv / wo         self_attn.q_proj / k_proj / v_proj / o_proj.weight  T
    norm1.g, norm2.g                input_layernorm.weight, post_attention_layernorm.weight
    ffn.W1 / W3 / W2  (dense)       feed_forward.gate_proj / up_proj / down_proj.weight T
    ffn.w_router (D, E)             feed_forward.router.weight (E, D)                   T
    [ffn.w1 | ffn.w3] (E, D, 2F)    feed_forward.experts.gate_up_proj (E, D, 2F)  [gate | up]
    ffn.w2 (E, F, D)                feed_forward.experts.down_proj (E, F, D)
    ffn.shared_w1 / w3 / w2         feed_forward.shared_expert.gate_proj / up_proj /
                                    down_proj.weight                                    T
The embedding, final norm and head as llama's. The embedding's padding_idx (pad_token_id)
is the LM's pad_id: its row gets no gradient, as in transformers.

Reference: huggingface/transformers src/transformers/models/llama4/modeling_llama4.py
(Llama4TextAttention, Llama4TextMoe, Llama4Router, Llama4TextDecoderLayer),
configuration_llama4.py (Llama4TextConfig: the defaults below),
src/transformers/masking_utils.py (chunked_overlay).
Glossary: D model width, E experts, F expert width.
"""
from scratchllm.hub.families.base import (DECODER_FIELDS, LAYER_NAMES, Family, decoder_entries,
                                          differences, fail_config, head_dim, layer_kinds, only,
                                          over, refuse, require, rope_of, rope_parameters)
from scratchllm.hub.layout import Entry
from scratchllm.specs.unflat import moe_pattern

_DEFAULTS = dict(
    intermediate_size_mlp=16384, num_key_value_heads=8, head_dim=128, hidden_act="silu",
    max_position_embeddings=4096 * 32, rms_norm_eps=1e-5, tie_word_embeddings=False,
    num_experts_per_tok=1, num_local_experts=16, moe_layers=None, interleave_moe_layer_step=1,
    use_qk_norm=True, no_rope_layers=None, no_rope_layer_interval=4,
    attention_chunk_size=8192, layer_types=None, attn_temperature_tuning=True,
    attention_bias=False, pad_token_id=None, rope_theta=500000.0)
_TRAINING_ONLY = dict(balance_coef=0.0, z_coef=0.0, bias_gamma=0.0)
_MOE = dict(score="sigmoid", norm_topk_prob=False, n_shared=1, moe_gate_input=True,
            **_TRAINING_ONLY)
_NEEDS = dict(
    attention="gqa", positions="rope", rope_style="interleaved", layer_pattern=None,
    window=None, n_sink=0, attn_sinks=False, qkv_bias=False, o_bias=False, attn_scale=None,
    norm="rmsnorm", block="pre", norm_offset=0.0, embed_scale=False, attn_softcap=None,
    logit_softcap=None, rope_local_base=None)
_MOE_NEEDS = dict(_MOE, experts="swiglu", router_bias=False, n_group=1, topk_group=1,
                  routed_scaling_factor=1.0, capacity_factor=None)
_LAYER = dict(LAYER_NAMES, **{
    "ffn.W1": ("feed_forward.gate_proj.weight", True),
    "ffn.W3": ("feed_forward.up_proj.weight", True),
    "ffn.W2": ("feed_forward.down_proj.weight", True),
    "ffn.w_router": ("feed_forward.router.weight", True),
    "ffn.shared_w1": ("feed_forward.shared_expert.gate_proj.weight", True),
    "ffn.shared_w3": ("feed_forward.shared_expert.up_proj.weight", True),
    "ffn.shared_w2": ("feed_forward.shared_expert.down_proj.weight", True)})
_EXPERTS = {"gate_up_proj": ("ffn.w1", "ffn.w3"), "down_proj": ("ffn.w2",)}


def _from_hf(hf):
    require(hf, DECODER_FIELDS, "llama4_text")
    hf = {**_DEFAULTS, **hf}
    only(hf, dict(hidden_act="silu", attention_bias=False), "llama4_text")
    L, H, D = hf["num_hidden_layers"], hf["num_attention_heads"], hf["hidden_size"]
    rope = list(hf["no_rope_layers"] or [int((i + 1) % hf["no_rope_layer_interval"] != 0)
                                         for i in range(L)])[:L]
    chunk = hf["attention_chunk_size"]
    types = list(hf["layer_types"] or ["chunked_attention" if r and chunk is not None
                                       else "full_attention" for r in rope])
    if set(types) - {"chunked_attention", "full_attention"}:
        fail_config(f"layer_types = {types!r} is not implemented for llama4_text (only "
                    f"'chunked_attention' and 'full_attention')")
    if "chunked_attention" in types and chunk is None:
        fail_config("attention_chunk_size = None with 'chunked_attention' layers (transformers "
                    "needs a chunk size for them too)")
    nope = [i for i, r in enumerate(rope) if not r]
    temperature = [float(hf.get("attn_scale", 0.1)), int(hf.get("floor_scale", 8192))] if (
        hf["attn_temperature_tuning"] and nope) else None
    moe = sorted(hf["moe_layers"] if hf["moe_layers"] is not None else range(
        hf["interleave_moe_layer_step"] - 1, L, hf["interleave_moe_layer_step"]))
    pattern = moe_pattern(moe, L) if moe else {}
    if moe and not pattern:
        fail_config(f"moe_layers = {moe!r} is not implemented for llama4_text (only every n-th "
                    f"layer from some layer on)")
    theta, scaling = rope_of(hf)
    out = dict(
        name="llama4_text", vocab_size=hf["vocab_size"], d_model=D, n_layers=L, n_heads=H,
        n_kv_heads=hf["num_key_value_heads"] or H,
        head_dim=None if hf["head_dim"] in (None, D // H) else hf["head_dim"],
        norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        rope_base=theta, rope_scaling=scaling, rope_style="interleaved",
        positions="rope" if len(nope) < L else "nope", pad_id=hf["pad_token_id"],
        qk_norm="l2" if hf["use_qk_norm"] and len(nope) < L else False,
        nope_layers=nope if 0 < len(nope) < L else None,
        layer_types=types if "chunked_attention" in types else None, attn_temperature=temperature,
        attention_chunk=chunk if "chunked_attention" in types else None)
    if len(nope) == L:  # no RoPE anywhere: RoPE's fields do not apply
        out.update(rope_scaling=None, rope_style="half")
    if not moe:
        return dict(out, d_ff=hf["intermediate_size_mlp"])
    return dict(out, ffn="moe", d_ff=hf["intermediate_size"],
                dense_d_ff=hf["intermediate_size_mlp"], n_experts=hf["num_local_experts"],
                top_k=hf["num_experts_per_tok"], **pattern, **_MOE)


def _moe_layers(f):
    """The indices of the MoE layers of the flat view f."""
    if f.ffn != "moe":
        return []
    offset = f.moe_every - 1 if f.moe_offset is None else f.moe_offset
    return [i for i in range(f.first_k_dense, f.n_layers) if i % f.moe_every == offset]


def _to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_theta", "interleave_moe_layer_step"))
    rope, max_pos = rope_parameters(f, hf.get("max_position_embeddings",
                                              _DEFAULTS["max_position_embeddings"]))
    nope = set(f.nope_layers or (range(f.n_layers) if f.positions != "rope" else ()))
    moe = f.ffn == "moe"
    hf.update(
        architectures=[LLAMA4_TEXT.architecture], model_type="llama4_text",
        vocab_size=f.vocab_size, hidden_size=f.d_model, num_hidden_layers=f.n_layers,
        num_attention_heads=f.n_heads, num_key_value_heads=f.n_kv_heads, head_dim=head_dim(f),
        hidden_act="silu", attention_bias=False, rms_norm_eps=f.norm_eps,
        tie_word_embeddings=f.tie_embeddings, max_position_embeddings=max_pos,
        rope_parameters=rope, pad_token_id=f.pad_id, use_qk_norm=f.qk_norm == "l2",
        no_rope_layers=[int(i not in nope) for i in range(f.n_layers)],
        layer_types=list(f.layer_types or ["full_attention"] * f.n_layers),
        attention_chunk_size=f.attention_chunk or hf.get("attention_chunk_size"),
        attn_temperature_tuning=f.attn_temperature is not None or (
            bool(hf.get("attn_temperature_tuning", True)) and not nope),
        intermediate_size=f.d_ff if moe else hf.get("intermediate_size", f.d_ff),
        intermediate_size_mlp=f.dense_d_ff or f.d_ff, moe_layers=_moe_layers(f),
        dtype=dtype_name)
    if moe:
        hf.update(num_local_experts=f.n_experts, num_experts_per_tok=f.top_k)
    if f.attn_temperature is not None:
        hf.update(attn_scale=f.attn_temperature[0], floor_scale=f.attn_temperature[1])
    return hf


def _check(f):
    """_NEEDS, qk_norm "l2" or none, and with MoE layers _MOE_NEEDS; a NoPE model (positions
    "nope") has no RoPE fields to keep."""
    needs = dict(_NEEDS, pad_id=f.pad_id, attention_chunk=f.attention_chunk,
                 nope_layers=f.nope_layers, attn_temperature=f.attn_temperature)
    if f.positions == "nope":
        needs.update(positions="nope", rope_style="half")
    differ = differences(f, {**needs, **(_MOE_NEEDS if f.ffn == "moe" else {})})
    if f.ffn not in ("moe", "swiglu"):
        differ["ffn"] = "ffn='moe' or 'swiglu'"
    if f.qk_norm not in (False, "l2"):
        differ["qk_norm"] = "qk_norm='l2' or False"
    if set(f.layer_types or ()) - {"chunked_attention", "full_attention"}:
        differ["layer_types"] = "layer_types of 'chunked_attention' and 'full_attention'"
    refuse(f, "llama4_text", differ)


def _claims(f):
    """Options only Llama 4 has: the gate on the experts' input, chunks, L2 QK-norm, NoPE
    layers among RoPE layers."""
    return set(layer_kinds(f)) == {"A"} and f.attention == "gqa" and bool(
        f.moe_gate_input or f.attention_chunk or f.qk_norm == "l2" or f.nope_layers)


def _names(model, f):
    """decoder_entries for all but the routed experts, which are one fused tensor each."""
    out, experts = [], set()
    for name, p in model.named_parameters():
        if name.endswith((".ffn.w1", ".ffn.w3", ".ffn.w2")):
            experts.add(int(name.split(".")[1]))
    for i in sorted(experts):
        out += [Entry(f"model.layers.{i}.feed_forward.experts.{tensor}",
                      tuple(f"layers.{i}.{n}" for n in lib), False)
                for tensor, lib in _EXPERTS.items()]
    rest = _Without(model, (".ffn.w1", ".ffn.w3", ".ffn.w2"))
    return decoder_entries(rest, "llama4_text", _LAYER) + out


class _Without:
    """A model's named_parameters() without the names ending in `ends` (the experts, which
    _names gives their fused tensors)."""

    def __init__(self, model, ends):
        self.model, self.ends = model, ends

    def named_parameters(self):
        return [(n, p) for n, p in self.model.named_parameters() if not n.endswith(self.ends)]


LLAMA4_TEXT = Family("llama4_text", "Llama4ForCausalLM", _from_hf, _to_hf, _claims, _check,
                     _names)
