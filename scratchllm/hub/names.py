"""Which Hugging Face tensor each library Param is, and in what layout.

The library stores a linear map as W (Din, Dout) so that y = x @ W; torch's nn.Linear stores
weight (Dout, Din) and computes y = x @ weight^T. So every projection weight is transposed
on the way in and out ("T"); embeddings, norm gains and biases are copied as they are.

    library                      transformers (llama, mistral, qwen2, qwen3)
    embed.E (V, D)               model.embed_tokens.weight (V, D)
    layers.i.norm1.g             model.layers.i.input_layernorm.weight
    layers.i.mixer.wq (D, H*Dh)  model.layers.i.self_attn.q_proj.weight (H*Dh, D)     T
    layers.i.mixer.bq            model.layers.i.self_attn.q_proj.bias (qwen2)
    layers.i.mixer.q_norm (Dh,)  model.layers.i.self_attn.q_norm.weight (qwen3)
    layers.i.norm2.g             model.layers.i.post_attention_layernorm.weight
    layers.i.ffn.W1 / W3 / W2    model.layers.i.mlp.gate_proj / up_proj / down_proj.weight  T
    norm.g                       model.norm.weight
    head.W (D, V)                lm_head.weight (V, D)                              T
A tied head (tie_word_embeddings) has no lm_head.weight of its own: it is embed_tokens.
Gemma 3 (sandwich norms) names norm2 pre_feedforward_layernorm and adds post_mixer_norm =
post_attention_layernorm, post_ffn_norm = post_feedforward_layernorm; its RMSNorm weights
are stored as w with gain 1 + w, which is the library's g with norm_offset 1: copied as is.

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

Glossary: V vocabulary, D model width, H heads, Dh head dim.
"""
from scratchllm.hub.layout import Entry
from scratchllm.hub.names_ssm import is_ssm, ssm_entries

from scratchllm.hub.families import EXTRA_FAMILIES, extra_family

_TOP = {"embed.E": ("model.embed_tokens.weight", False), "norm.g": ("model.norm.weight", False),
        "head.W": ("lm_head.weight", True)}
LAYER_NAMES = {
    "norm1.g": ("input_layernorm.weight", False),
    "norm2.g": ("post_attention_layernorm.weight", False),
    "mixer.wq": ("self_attn.q_proj.weight", True), "mixer.bq": ("self_attn.q_proj.bias", False),
    "mixer.wk": ("self_attn.k_proj.weight", True), "mixer.bk": ("self_attn.k_proj.bias", False),
    "mixer.wv": ("self_attn.v_proj.weight", True), "mixer.bv": ("self_attn.v_proj.bias", False),
    "mixer.wo": ("self_attn.o_proj.weight", True),
    "mixer.q_norm": ("self_attn.q_norm.weight", False),
    "mixer.k_norm": ("self_attn.k_norm.weight", False),
    "ffn.W1": ("mlp.gate_proj.weight", True), "ffn.W3": ("mlp.up_proj.weight", True),
    "ffn.W2": ("mlp.down_proj.weight", True),
}
_GEMMA3_LAYER = dict(LAYER_NAMES, **{
    "norm2.g": ("pre_feedforward_layernorm.weight", False),
    "post_mixer_norm.g": ("post_attention_layernorm.weight", False),
    "post_ffn_norm.g": ("post_feedforward_layernorm.weight", False)})
_GPT2_TOP = {"embed.E": "transformer.wte.weight", "pos.E": "transformer.wpe.weight",
             "norm.g": "transformer.ln_f.weight", "norm.b": "transformer.ln_f.bias"}
_GPT2_LAYER = {
    "norm1.g": "ln_1.weight", "norm1.b": "ln_1.bias", "norm2.g": "ln_2.weight",
    "norm2.b": "ln_2.bias", "mixer.wo": "attn.c_proj.weight", "mixer.bo": "attn.c_proj.bias",
    "ffn.W1": "mlp.c_fc.weight", "ffn.b1": "mlp.c_fc.bias", "ffn.W2": "mlp.c_proj.weight",
    "ffn.b2": "mlp.c_proj.bias",
}
_GPT2_FUSED = {"attn.c_attn.weight": ("mixer.wq", "mixer.wk", "mixer.wv"),
               "attn.c_attn.bias": ("mixer.bq", "mixer.bk", "mixer.bv")}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", ".attn.bias", ".attn.masked_bias")  # old buffers


def entries(model):
    """[Entry] for every Param of an LM of a supported family."""
    if model.cfg.name in EXTRA_FAMILIES:
        return extra_family(model.cfg.name).entries(model)
    if model.cfg.name == "gpt2":
        return _gpt2_entries(model)
    if is_ssm(model.cfg):  # mamba, jamba: names_ssm.py
        return ssm_entries(model)
    return named_entries(model, _GEMMA3_LAYER if model.cfg.block == "sandwich" else LAYER_NAMES)


def named_entries(model, layer_names):
    """[Entry] for every Param: _TOP's names, and model.layers.i. + layer_names[rest] for
    layers.i.rest."""
    out = []
    for name, _ in model.named_parameters():
        if name in _TOP:
            hf, t = _TOP[name]
        else:
            _, i, rest = name.split(".", 2)  # "layers", i, "mixer.wq"
            if rest not in layer_names:
                raise ValueError(f"hub: parameter {name!r} has no transformers name")
            hf, t = f"model.layers.{i}.{layer_names[rest][0]}", layer_names[rest][1]
        out.append(Entry(hf, (name,), t))
    return out


def _gpt2_entries(model):
    out = [Entry(hf, (lib,), False) for lib, hf in _GPT2_TOP.items()]
    for i in range(model.cfg.n_layers):
        p, q = f"layers.{i}.", f"transformer.h.{i}."
        out += [Entry(q + hf, tuple(p + n for n in libs), False)
                for hf, libs in _GPT2_FUSED.items()]
        out += [Entry(q + hf, (p + lib,), False) for lib, hf in _GPT2_LAYER.items()]
    if not model.cfg.tie_embeddings:
        out.append(Entry("lm_head.weight", ("head.W",), True))
    return out
