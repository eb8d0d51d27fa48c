"""More dense decoder families: olmo2 and gemma2. No math here: each family is a set of config
options the LM builds from the library's own pairs.

    olmo2    llama's attention and SwiGLU with the norms on the sub-layers' outputs only
             (block "output": h = x + N(attn(x)), y = h + N'(mlp(h)); no norm before a
             sub-layer) and QK-norm over the whole q and k projections (qk_norm "full":
             RMSNorm over H*Dh and Hkv*Dh numbers, before the head split and RoPE)
                                                (OLMo et al. 2024, arXiv 2501.00656)
    gemma2   gemma3_text's shape without QK-norm (sandwich norms, gains 1 + w, embedding
             * sqrt(D), GeGLU, softmax scale query_pre_attn_scalar^-1/2, alternating
             sliding/full layer_types with one RoPE for both) and soft-capping: attention
             scores c_a tanh(S / c_a) before the mask (attn_logit_softcapping) and logits
             c_f tanh(z / c_f) (final_logit_softcapping)
                                                (Gemma Team 2024, arXiv 2408.00118)

Names (base.py's LAYER_NAMES, with the two block norms renamed; "T" transposed):

    library                      transformers: model.layers.i.
    layers.i.norm1.g             post_attention_layernorm.weight   (on the attention's output)
    layers.i.norm2.g             post_feedforward_layernorm.weight (on the MLP's output)
    layers.i.mixer.q_norm (H*Dh,)  self_attn.q_norm.weight
    layers.i.mixer.k_norm (Hkv*Dh,)  self_attn.k_norm.weight
    the projections, the MLP, embed_tokens, norm and lm_head as llama's

gemma2 names its norms as gemma3_text does: norm2 pre_feedforward_layernorm,
post_mixer_norm post_attention_layernorm, post_ffn_norm post_feedforward_layernorm.

Where a field is absent from config.json, the transformers configuration class's default
applies (huggingface/transformers src/transformers/models/olmo2/configuration_olmo2.py,
src/transformers/models/gemma2/configuration_gemma2.py);
a field whose value the library does not implement is an error naming it.
Reference: huggingface/transformers src/transformers/models/olmo2/modeling_olmo2.py
(Olmo2Attention, Olmo2DecoderLayer), src/transformers/models/gemma2/modeling_gemma2.py
(eager_attention_forward's softcap, Gemma2DecoderLayer, Gemma2ForCausalLM).
Glossary: D model width, H heads, Hkv KV heads, Dh head dim.
"""
from scratchllm.hub.families.base import (DECODER_FIELDS, LAYER_NAMES, Family, decoder_entries,
                                          differences, fail_config, only, over, refuse, require,
                                          rope_of, rope_parameters)

_OLMO2 = dict(rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=2048)
_OLMO2_NEEDS = dict(
    attention="gqa", positions="rope", rope_style="half", layer_pattern=None, layer_types=None,
    window=None, n_sink=0, attn_sinks=False, qkv_bias=False, o_bias=False, qk_norm="full",
    attn_scale=None, head_dim=None, ffn="swiglu", norm="rmsnorm", block="output",
    norm_offset=0.0, embed_scale=False, attn_softcap=None, logit_softcap=None)
_OLMO2_LAYER = dict(LAYER_NAMES, **{
    "norm1.g": ("post_attention_layernorm.weight", False),
    "norm2.g": ("post_feedforward_layernorm.weight", False)})


def _olmo2_from_hf(hf):
    require(hf, DECODER_FIELDS, "olmo2")
    hf = {**_OLMO2, **hf}
    only(hf, dict(hidden_act="silu", attention_bias=False), "olmo2")
    H, D = hf["num_attention_heads"], hf["hidden_size"]
    if hf.get("head_dim") not in (None, D // H):
        fail_config(f"head_dim = {hf['head_dim']!r} is not implemented for olmo2 (transformers' "
                    f"Olmo2Config has no head_dim: it is hidden_size // num_attention_heads)")
    theta, scaling = rope_of(hf)
    return dict(
        name="olmo2", vocab_size=hf["vocab_size"], d_model=D, n_layers=hf["num_hidden_layers"],
        n_heads=H, n_kv_heads=hf.get("num_key_value_heads") or H, d_ff=hf["intermediate_size"],
        norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        rope_base=theta, rope_scaling=scaling, qk_norm="full", block="output",
        pad_id=hf.get("pad_token_id", 1))  # nn.Embedding(padding_idx=pad_token_id)


def _olmo2_to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_theta", "head_dim"))
    rope, max_pos = rope_parameters(f, hf.get("max_position_embeddings",
                                              _OLMO2["max_position_embeddings"]))
    hf.update(
        architectures=[OLMO2.architecture], model_type="olmo2", vocab_size=f.vocab_size,
        hidden_size=f.d_model, intermediate_size=f.d_ff, num_hidden_layers=f.n_layers,
        num_attention_heads=f.n_heads, num_key_value_heads=f.n_kv_heads, hidden_act="silu",
        attention_bias=False, rms_norm_eps=f.norm_eps, tie_word_embeddings=f.tie_embeddings,
        max_position_embeddings=max_pos, rope_parameters=rope, dtype=dtype_name,
        pad_token_id=f.pad_id)
    return hf


def _olmo2_check(f):
    """_OLMO2_NEEDS (head_dim None or d_model / n_heads), any pad_id."""
    differ = differences(f, {**_OLMO2_NEEDS, "pad_id": f.pad_id})
    if f.head_dim == f.d_model // f.n_heads:
        differ.pop("head_dim", None)
    refuse(f, "olmo2", differ)


OLMO2 = Family(
    "olmo2", "Olmo2ForCausalLM", _olmo2_from_hf, _olmo2_to_hf,
    claims=lambda f: f.block == "output", check=_olmo2_check,
    names=lambda model, f: decoder_entries(model, "olmo2", _OLMO2_LAYER))


# ---------------------------------------------------------------------------- gemma2
_GEMMA2 = dict(rms_norm_eps=1e-6, tie_word_embeddings=True, head_dim=256, num_key_value_heads=4,
               query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=8192,
               final_logit_softcapping=30.0, attn_logit_softcapping=50.0)
_GEMMA2_NEEDS = dict(
    attention="gqa", positions="rope", rope_style="half", layer_pattern=None, n_sink=0,
    attn_sinks=False, qkv_bias=False, o_bias=False, qk_norm=False, ffn="geglu",
    gelu_approx="tanh", norm="rmsnorm", block="sandwich", norm_offset=1.0, embed_scale=True,
    rope_local_base=None)
_GEMMA2_LAYER = dict(LAYER_NAMES, **{
    "norm2.g": ("pre_feedforward_layernorm.weight", False),
    "post_mixer_norm.g": ("post_attention_layernorm.weight", False),
    "post_ffn_norm.g": ("post_feedforward_layernorm.weight", False)})


def _gemma2_from_hf(hf):
    require(hf, DECODER_FIELDS, "gemma2")
    hf = {**_GEMMA2, **hf}
    only(hf, dict(hidden_activation="gelu_pytorch_tanh", attention_bias=False), "gemma2")
    if hf.get("use_bidirectional_attention"):
        fail_config("use_bidirectional_attention = true is not implemented for gemma2 (only "
                    "causal attention)")
    L = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                      for i in range(L)]
    theta, scaling = rope_of(hf)
    return dict(
        name="gemma2", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=L,
        n_heads=hf["num_attention_heads"], n_kv_heads=hf["num_key_value_heads"],
        d_ff=hf["intermediate_size"], head_dim=hf["head_dim"],
        norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        rope_base=theta, rope_scaling=scaling, layer_types=list(types),
        window=hf["sliding_window"], ffn="geglu", gelu_approx="tanh", block="sandwich",
        norm_offset=1.0, embed_scale=True,
        attn_scale=float(hf["query_pre_attn_scalar"]) ** -0.5,
        attn_softcap=_cap(hf["attn_logit_softcapping"]),
        logit_softcap=_cap(hf["final_logit_softcapping"]),
        pad_id=hf.get("pad_token_id", 0))  # nn.Embedding(padding_idx=pad_token_id)


def _cap(value):
    return None if value is None else float(value)


def _gemma2_to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_theta"))
    rope, max_pos = rope_parameters(f, hf.get("max_position_embeddings",
                                              _GEMMA2["max_position_embeddings"]))
    dh = f.head_dim or f.d_model // f.n_heads
    hf.update(
        architectures=[GEMMA2.architecture], model_type="gemma2", vocab_size=f.vocab_size,
        hidden_size=f.d_model, intermediate_size=f.d_ff, num_hidden_layers=f.n_layers,
        num_attention_heads=f.n_heads, num_key_value_heads=f.n_kv_heads, head_dim=dh,
        rms_norm_eps=f.norm_eps, tie_word_embeddings=f.tie_embeddings,
        query_pre_attn_scalar=round((f.attn_scale or dh ** -0.5) ** -2),
        sliding_window=f.window or hf.get("sliding_window", _GEMMA2["sliding_window"]),
        layer_types=list(f.layer_types or ["full_attention"] * f.n_layers),
        hidden_activation="gelu_pytorch_tanh", attention_bias=False,
        attn_logit_softcapping=f.attn_softcap, final_logit_softcapping=f.logit_softcap,
        max_position_embeddings=max_pos, rope_parameters=rope, dtype=dtype_name,
        pad_token_id=f.pad_id)
    return hf


def _gemma2_check(f):
    """_GEMMA2_NEEDS (any pad_id), and a softmax scale transformers' query_pre_attn_scalar^-1/2
    can say (an integer scalar)."""
    differ = differences(f, {**_GEMMA2_NEEDS, "pad_id": f.pad_id})
    scalar = (f.attn_scale or (f.head_dim or f.d_model // f.n_heads) ** -0.5) ** -2
    if abs(scalar - round(scalar)) > 1e-9 * scalar:
        differ["attn_scale"] = "attn_scale=n^-1/2 for an integer n (query_pre_attn_scalar)"
    refuse(f, "gemma2", differ)


GEMMA2 = Family(
    "gemma2", "Gemma2ForCausalLM", _gemma2_from_hf, _gemma2_to_hf,
    claims=lambda f: f.block == "sandwich" and not f.qk_norm, check=_gemma2_check,
    names=lambda model, f: decoder_entries(model, "gemma2", _GEMMA2_LAYER))
