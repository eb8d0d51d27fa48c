"""The gpt2 family: LayerNorm with bias, learned absolute positions, multi-head attention with
biases (a fused c_attn), a GELU-tanh MLP with biases, a tied head (Radford et al. 2019). No
math here: the LM builds it from the library's pairs (core's layernorm and gelu_mlp).

GPT-2 stores its projections with transformers' Conv1D, weight (in, out): the library's own
layout, so nothing is transposed; but q, k, v are one fused c_attn whose columns are
[q | k | v], split on the way in and concatenated on the way out:

    library                          transformers (gpt2)
    embed.E, pos.E                   transformer.wte.weight, transformer.wpe.weight
    layers.i.norm1.g / .b            transformer.h.i.ln_1.weight / .bias   (ln_2: norm2)
    layers.i.mixer.wq | wk | wv      transformer.h.i.attn.c_attn.weight (D, 3D)   split
    layers.i.mixer.bq | bk | bv      transformer.h.i.attn.c_attn.bias (3D,)        split
    layers.i.mixer.wo, bo            transformer.h.i.attn.c_proj.weight, .bias
    layers.i.ffn.W1, b1, W2, b2      transformer.h.i.mlp.c_fc.weight, .bias, c_proj.weight, .bias
    norm.g / .b                      transformer.ln_f.weight / .bias
    head.W (D, V)                    lm_head.weight (V, D), only when not tied      T
Checkpoints saved from GPT2Model (openai-community/gpt2) leave out "transformer.".

Reference: huggingface/transformers src/transformers/models/gpt2/configuration_gpt2.py (the
defaults below). Glossary: V vocabulary, D model width.
"""
from scratchllm.hub.families.base import (Family, differences, fail_config, only, over, refuse,
                                          require)
from scratchllm.hub.layout import Entry

_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}  # HF ACT2FN names
_FIXED = dict(scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
              add_cross_attention=False)
_NEEDS = dict(attention="gqa", positions="learned", layer_pattern=None, layer_types=None,
              window=None, n_sink=0, attn_sinks=False, head_dim=None, qkv_bias=True,
              o_bias=True, qk_norm=False, attn_scale=None, ffn="gelu_mlp", norm="layernorm",
              block="pre", embed_scale=False, attn_softcap=None, logit_softcap=None)
_TOP = {"embed.E": "transformer.wte.weight", "pos.E": "transformer.wpe.weight",
        "norm.g": "transformer.ln_f.weight", "norm.b": "transformer.ln_f.bias"}
_LAYER = {
    "norm1.g": "ln_1.weight", "norm1.b": "ln_1.bias", "norm2.g": "ln_2.weight",
    "norm2.b": "ln_2.bias", "mixer.wo": "attn.c_proj.weight", "mixer.bo": "attn.c_proj.bias",
    "ffn.W1": "mlp.c_fc.weight", "ffn.b1": "mlp.c_fc.bias", "ffn.W2": "mlp.c_proj.weight",
    "ffn.b2": "mlp.c_proj.bias",
}
_FUSED = {"attn.c_attn.weight": ("mixer.wq", "mixer.wk", "mixer.wv"),
          "attn.c_attn.bias": ("mixer.bq", "mixer.bk", "mixer.bv")}


def _from_hf(hf):
    """GPT-2's config.json (its own field names: n_embd, n_layer, ...)."""
    require(hf, ("vocab_size", "n_embd", "n_layer", "n_head"), "gpt2")
    act = hf.get("activation_function", "gelu_new")
    if act not in _GELU:
        fail_config(f"activation_function = {act!r} is not implemented (only {sorted(_GELU)})")
    only(hf, _FIXED, "gpt2")
    D, H = hf["n_embd"], hf["n_head"]
    return dict(name="gpt2", vocab_size=hf["vocab_size"], d_model=D, n_layers=hf["n_layer"],
                n_heads=H, n_kv_heads=H, d_ff=hf.get("n_inner") or 4 * D,
                norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                tie_embeddings=bool(hf.get("tie_word_embeddings", True)), qkv_bias=True,
                o_bias=True, norm="layernorm", positions="learned",
                max_positions=hf.get("n_positions", 1024), ffn="gelu_mlp",
                gelu_approx=_GELU[act])


def _to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_parameters"))
    hf.update(architectures=[GPT2.architecture], model_type=GPT2.model_type,
              vocab_size=f.vocab_size, n_embd=f.d_model, n_layer=f.n_layers,
              n_head=f.n_heads, n_inner=f.d_ff, n_positions=f.max_positions,
              layer_norm_epsilon=f.norm_eps, tie_word_embeddings=f.tie_embeddings,
              activation_function="gelu_new" if f.gelu_approx == "tanh" else "gelu",
              dtype=dtype_name)
    return hf


def _check(f):
    """GPT-2 is multi-head attention (n_kv_heads = n_heads) besides _NEEDS."""
    refuse(f, "gpt2", differences(f, dict(_NEEDS, n_kv_heads=f.n_heads)))


def _names(model, f):
    out = [Entry(hf, (lib,), False) for lib, hf in _TOP.items()]
    for i in range(f.n_layers):
        p, q = f"layers.{i}.", f"transformer.h.{i}."
        out += [Entry(q + hf, tuple(p + n for n in libs), False) for hf, libs in _FUSED.items()]
        out += [Entry(q + hf, (p + lib,), False) for lib, hf in _LAYER.items()]
    if not f.tie_embeddings:
        out.append(Entry("lm_head.weight", ("head.W",), True))
    return out


GPT2 = Family("gpt2", "GPT2LMHeadModel", _from_hf, _to_hf,
              claims=lambda f: (f.norm == "layernorm" and f.causal
                                and f.ffn != "channel_mix"),  # rwkv's
              check=_check, names=_names,
              bare_prefix="transformer.")
