"""The dense decoder families: llama, mistral, qwen2, qwen3 (one shape with three options) and
gemma3_text. No math here: each family is a set of config options the LM builds from the
library's own pairs.

    llama    RMSNorm pre-norm, GQA + RoPE (with its rope_scaling: linear, dynamic, yarn,
             llama3), SwiGLU                    (Touvron et al. 2023, arXiv 2302.13971)
    mistral  llama + a sliding window W of keys (rolling KV state when decoding)
                                                (Jiang et al. 2023, arXiv 2310.06825)
    qwen2    llama + biases on the q, k, v projections      (Yang et al. 2024, arXiv 2407.10671)
    qwen3    llama + QK-norm (RMSNorm over each q and k head before RoPE), explicit head_dim
                                                (Yang et al. 2025, arXiv 2505.09388)
    gemma3_text  sandwich norms, RMSNorm gains 1 + w, embedding * sqrt(D), QK-norm, softmax
             scale query_pre_attn_scalar^-1/2, GeGLU (GELU-tanh gate), per-layer
             layer_types: sliding layers (window, local RoPE base) and full layers (global
             base and rope_scaling), tied head             (Gemma Team 2025, arXiv 2503.19786)

Names (base.py's LAYER_NAMES; the library stores W (Din, Dout), torch's nn.Linear weight
(Dout, Din), so projections are transposed, "T"):

    library                      transformers
    embed.E (V, D)               model.embed_tokens.weight (V, D)
    layers.i.norm1.g             model.layers.i.input_layernorm.weight
    layers.i.mixer.wq (D, H*Dh)  model.layers.i.self_attn.q_proj.weight (H*Dh, D)     T
    layers.i.mixer.bq            model.layers.i.self_attn.q_proj.bias (qwen2)
    layers.i.mixer.q_norm (Dh,)  model.layers.i.self_attn.q_norm.weight (qwen3, gemma3_text)
    layers.i.norm2.g             model.layers.i.post_attention_layernorm.weight
    layers.i.ffn.W1 / W3 / W2    model.layers.i.mlp.gate_proj / up_proj / down_proj.weight  T
    norm.g                       model.norm.weight
    head.W (D, V)                lm_head.weight (V, D)                              T
A tied head (tie_word_embeddings) has no lm_head.weight of its own: it is embed_tokens.
Gemma 3 names norm2 pre_feedforward_layernorm and adds post_mixer_norm =
post_attention_layernorm, post_ffn_norm = post_feedforward_layernorm; its RMSNorm weights
are stored as w with gain 1 + w, which is the library's g with norm_offset 1: copied as is.

Where a field is absent from config.json, the transformers configuration class's default
applies (huggingface/transformers src/transformers/models/llama/configuration_llama.py and
its siblings); a field whose value the library does not implement is an error naming it.
Glossary: V vocabulary, D model width, H heads, Dh head dim, W window.
"""
from dataclasses import dataclass

from scratchllm.hub.families.base import (DECODER_FIELDS, LAYER_NAMES, Family, decoder_entries,
                                          differences, fail_config, head_dim, only, over, refuse,
                                          require, rope_of, write_pad_id)

_LLAMA_SHAPE = dict(  # the options every llama-shaped family has (the flat names)
    attention="gqa", positions="rope", rope_style="half", layer_pattern=None, layer_types=None,
    n_sink=0, attn_sinks=False, o_bias=False, attn_scale=None, ffn="swiglu", norm="rmsnorm",
    block="pre", norm_offset=0.0, embed_scale=False, attn_softcap=None, logit_softcap=None)


@dataclass(frozen=True)
class _LlamaShaped:
    """A family of llama's shape; they differ only in these.

    defaults   transformers' defaults of the config.json fields that change the math
    options    the flat options the family fixes (window, qkv_bias, qk_norm)
    fixed      {config.json field: the one value the library implements}
    windowed   config.json's sliding_window is the window (mistral)
    full_layer_types  config.json writes use_sliding_window false and layer_types all
               full_attention (qwen2, qwen3)
    """
    model_type: str
    architecture: str
    defaults: dict
    options: dict
    fixed: dict
    windowed: bool = False
    full_layer_types: bool = False

    def record(self):
        return Family(self.model_type, self.architecture, self.from_hf, self.to_hf,
                      self.claims, self.check, self.names)

    def from_hf(self, hf):
        require(hf, DECODER_FIELDS, self.model_type)
        hf = {**self.defaults, **hf}
        only(hf, dict(hidden_act="silu", **self.fixed), self.model_type)
        layer_types = hf.get("layer_types") or []
        if not self.windowed and any(t != "full_attention" for t in layer_types):
            fail_config(f"layer_types {layer_types} has sliding layers; only full_attention "
                        f"is implemented for {self.model_type}")
        theta, scaling = rope_of(hf)
        H, D = hf["num_attention_heads"], hf["hidden_size"]
        return dict(
            self.options, name=self.model_type, vocab_size=hf["vocab_size"], d_model=D,
            n_layers=hf["num_hidden_layers"], n_heads=H,
            n_kv_heads=hf.get("num_key_value_heads") or H, d_ff=hf["intermediate_size"],
            norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
            rope_base=theta, rope_scaling=scaling,
            head_dim=None if hf["head_dim"] in (None, D // H) else hf["head_dim"],
            window=hf["sliding_window"] if self.windowed else None,
            pad_id=hf.get("pad_token_id"))  # nn.Embedding(padding_idx=pad_token_id)

    def to_hf(self, f, dtype_name, base=None):
        hf = over(base, ("rope_scaling", "rope_parameters"))
        scaling = dict(f.rope_scaling) if f.rope_scaling else None
        max_pos = hf.get("max_position_embeddings", self.defaults["max_position_embeddings"])
        if scaling and scaling.get("rope_type") == "dynamic":  # HF reads L0 from max_position
            max_pos = scaling.pop("original_max_position_embeddings")
        hf.update(
            architectures=[self.architecture], model_type=self.model_type,
            vocab_size=f.vocab_size, hidden_size=f.d_model, intermediate_size=f.d_ff,
            num_hidden_layers=f.n_layers, num_attention_heads=f.n_heads,
            num_key_value_heads=f.n_kv_heads, head_dim=head_dim(f), hidden_act="silu",
            rms_norm_eps=f.norm_eps, tie_word_embeddings=f.tie_embeddings,
            max_position_embeddings=max_pos, rope_theta=f.rope_base, rope_scaling=scaling,
            dtype=dtype_name)
        if self.windowed:
            hf["sliding_window"] = f.window
        if self.full_layer_types:
            hf.update(use_sliding_window=False, layer_types=["full_attention"] * f.n_layers)
        return write_pad_id(hf, f)

    def claims(self, f):
        """llama's shape with this family's options (mistral: with a window)."""
        return not differences(f, {**_LLAMA_SHAPE, **self.options, "pad_id": f.pad_id}) and (
            not self.windowed or f.window is not None)

    def check(self, f):
        refuse(f, self.model_type, differences(f, {**_LLAMA_SHAPE, **self.options,
                                                   "pad_id": f.pad_id}))  # any pad id

    def names(self, model, f):
        return decoder_entries(model, self.model_type, LAYER_NAMES)


_PLAIN = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=None)
LLAMA = _LlamaShaped(
    "llama", "LlamaForCausalLM", defaults=dict(_PLAIN, max_position_embeddings=2048),
    options=dict(window=None, qkv_bias=False, qk_norm=False),
    fixed=dict(attention_bias=False, mlp_bias=False, pretraining_tp=1)).record()
MISTRAL = _LlamaShaped(
    "mistral", "MistralForCausalLM",
    defaults=dict(_PLAIN, sliding_window=4096, max_position_embeddings=4096 * 32),
    options=dict(qkv_bias=False, qk_norm=False), fixed={}, windowed=True).record()
QWEN2 = _LlamaShaped(
    "qwen2", "Qwen2ForCausalLM", defaults=dict(_PLAIN, max_position_embeddings=32768),
    options=dict(window=None, qkv_bias=True, qk_norm=False),
    fixed=dict(use_sliding_window=False), full_layer_types=True).record()
QWEN3 = _LlamaShaped(
    "qwen3", "Qwen3ForCausalLM",
    defaults=dict(_PLAIN, head_dim=128, max_position_embeddings=32768),
    options=dict(window=None, qkv_bias=False, qk_norm=True),
    fixed=dict(attention_bias=False, use_sliding_window=False), full_layer_types=True).record()


# ---------------------------------------------------------------------------- gemma3_text
_GEMMA3 = dict(rms_norm_eps=1e-6, tie_word_embeddings=True, head_dim=256,
               num_key_value_heads=4, hidden_activation="gelu_pytorch_tanh",
               query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=131072)
_GEMMA3_FIXED = dict(hidden_activation="gelu_pytorch_tanh", attention_bias=False,
                     final_logit_softcapping=None, attn_logit_softcapping=None,
                     use_bidirectional_attention=False)
_GEMMA3_NEEDS = dict(
    attention="gqa", positions="rope", rope_style="half", layer_pattern=None, n_sink=0,
    attn_sinks=False, qkv_bias=False, o_bias=False, qk_norm=True, ffn="geglu",
    gelu_approx="tanh", norm="rmsnorm", block="sandwich", norm_offset=1.0, embed_scale=True,
    attn_softcap=None, logit_softcap=None)
_GEMMA3_LAYER = dict(LAYER_NAMES, **{
    "norm2.g": ("pre_feedforward_layernorm.weight", False),
    "post_mixer_norm.g": ("post_attention_layernorm.weight", False),
    "post_ffn_norm.g": ("post_feedforward_layernorm.weight", False)})


def _gemma3_rope(hf):
    """(global theta, its scaling, local theta): rope_parameters per layer type
    (transformers >= 5), or rope_theta + rope_scaling + rope_local_base_freq."""
    per_type = hf.get("rope_parameters") or {}
    if "full_attention" in per_type:
        theta, scaling = rope_of({**hf, "rope_parameters": per_type["full_attention"]})
        local, local_scaling = rope_of({**hf, "rope_parameters": per_type.get(
            "sliding_attention") or {"rope_theta": 10000.0}})
        if local_scaling is not None:
            fail_config("rope_parameters['sliding_attention'] with a rope_type other than "
                        "default is not implemented")
        return theta, scaling, local
    theta, scaling = rope_of({**hf, "rope_theta": hf.get("rope_theta", 1e6)})
    return theta, scaling, float(hf.get("rope_local_base_freq", 10000.0))


def _gemma3_from_hf(hf):
    require(hf, DECODER_FIELDS, "gemma3_text")
    hf = {**_GEMMA3, **hf}
    only(hf, _GEMMA3_FIXED, "gemma3_text")
    L = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else
                                      "sliding_attention" for i in range(L)]
    theta, scaling, local = _gemma3_rope(hf)
    return dict(
        name="gemma3_text", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=L,
        n_heads=hf["num_attention_heads"], n_kv_heads=hf["num_key_value_heads"],
        d_ff=hf["intermediate_size"], head_dim=hf["head_dim"],
        norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        rope_base=theta, rope_scaling=scaling, rope_local_base=local, layer_types=list(types),
        window=hf["sliding_window"], qk_norm=True, ffn="geglu", gelu_approx="tanh",
        block="sandwich", norm_offset=1.0, embed_scale=True,
        attn_scale=float(hf["query_pre_attn_scalar"]) ** -0.5,
        pad_id=hf.get("pad_token_id", 0))  # nn.Embedding(padding_idx=pad_token_id)


def _gemma3_to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_parameters", "rope_theta"))
    hf.update(
        architectures=[GEMMA3.architecture], model_type=GEMMA3.model_type,
        vocab_size=f.vocab_size, hidden_size=f.d_model, intermediate_size=f.d_ff,
        num_hidden_layers=f.n_layers, num_attention_heads=f.n_heads,
        num_key_value_heads=f.n_kv_heads, head_dim=head_dim(f), rms_norm_eps=f.norm_eps,
        tie_word_embeddings=f.tie_embeddings,
        query_pre_attn_scalar=round((f.attn_scale or head_dim(f) ** -0.5) ** -2),
        sliding_window=f.window, pad_token_id=f.pad_id,
        layer_types=list(f.layer_types or ["full_attention"] * f.n_layers),
        hidden_activation="gelu_pytorch_tanh", dtype=dtype_name, rope_parameters={
            "full_attention": {"rope_type": "default", **(f.rope_scaling or {}),
                               "rope_theta": f.rope_base},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": f.rope_local_base or f.rope_base}})
    return hf


GEMMA3 = Family(
    "gemma3_text", "Gemma3ForCausalLM", _gemma3_from_hf, _gemma3_to_hf,
    claims=lambda f: f.block == "sandwich" and f.qk_norm is True,  # gemma2: no QK-norm
    check=lambda f: refuse(f, "gemma3_text", differences(f, {**_GEMMA3_NEEDS,
                                                             "pad_id": f.pad_id})),
    names=lambda model, f: decoder_entries(model, "gemma3_text", _GEMMA3_LAYER))
