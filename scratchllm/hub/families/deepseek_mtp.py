"""DeepSeek-V3's multi-token-prediction (MTP) layers in a Hugging Face checkpoint, as the
library's MTP modules (lm/mtp.py, ModelConfig.mtp; the flat name mtp_depth). No math here.

config.json's num_nextn_predict_layers counts them (transformers 5 reads it as num_mtp_layers,
default 1); the checkpoint holds module k (k = 0 .. n - 1) as one more decoder layer after
the trunk's N = num_hidden_layers layers, model.layers.{N + k}. ("T" transposed):

    library                          model.layers.{N + k}.
    mtp.depths.k.enorm.g (D,)        enorm.weight                 the next token's embedding
    mtp.depths.k.hnorm.g (D,)        hnorm.weight                 the previous hidden state
    mtp.depths.k.proj.W (2D, D)      eh_proj.weight (D, 2D)    T  inputs [enorm(e) | hnorm(h)]
    mtp.depths.k.block.<rest>        the decoder layer's names: self_attn.*, mlp.* (an MoE
                                     layer's experts and e_score_correction_bias too),
                                     input_layernorm, post_attention_layernorm (moe.py)
    mtp.depths.k.norm.g (D,)         shared_head.norm.weight
    embed.E (the trunk's)            embed_tokens.weight          a copy of the trunk's
    head.W (the trunk's; embed.E     shared_head.head.weight   T  a copy of lm_head.weight
            when tied)
The embedding and the head are shared with the trunk (DeepSeek-V3 sec. 2.2); the checkpoint
stores copies (Entry.copy), so saving writes them and loading checks that they equal the
trunk's tensors (mtp_layers) and reads the trunk's. A checkpoint whose config.json counts
MTP layers it does not hold (transformers' DeepseekV3ForCausalLM.save_pretrained writes
num_nextn_predict_layers = 1 and no MTP tensors) loads with the layers it holds.

transformers' DeepseekV3ForCausalLM does not run these layers: it drops them on loading
(_keys_to_ignore_on_load_unexpected names layer 61, the full model's, so a smaller
checkpoint's MTP layers come back as unexpected keys). Its generic MtpModel
(modeling_layers.py, for generate(use_mtp=True)) builds them from layer 61's pattern, each
block as decoder layer k of the config (a dense MLP while k < first_k_dense_replace, where
DeepSeek-V3's MTP layer is an MoE layer), and passes each module's normed output on to the
next where DeepSeek-V3's equations (and lm/mtp.py) pass h^k before the norm: the two agree
for one MTP layer of an all-MoE (or all-dense) config, as the fixture checks
(tools/make_hf_fixtures_mtp.py).

Reference: huggingface/transformers src/transformers/modeling_layers.py (MtpLayer, MtpModel),
src/transformers/conversion_mapping.py (shared_head.norm -> post_norm),
src/transformers/models/deepseek_v3/configuration_deepseek_v3.py (num_mtp_layers).
Glossary: D model width, N trunk layers, n MTP layers, V vocabulary.
"""
from safetensors import safe_open

import numpy as np

from scratchllm.hub.families.base import TOP_NAMES, layer_entries
from scratchllm.hub.layout import Entry

_OWN = {"enorm.g": ("enorm.weight", False), "hnorm.g": ("hnorm.weight", False),
        "proj.W": ("eh_proj.weight", True), "norm.g": ("shared_head.norm.weight", False)}
_COPIES = (("embed_tokens.weight", "model.embed_tokens.weight"),
           ("shared_head.head.weight", "lm_head.weight"))


def mtp_entries(model, f, layer_names, experts, bias):
    """[Entry] of the MTP modules of `model` (none without cfg.mtp): their own tensors, their
    blocks named as decoder layer N + k (layer_names, experts as decoder_entries takes them;
    bias the selection bias's name in a layer), and the copies of the embedding and head."""
    if model.mtp is None:
        return []
    N, out = f.n_layers, []
    head = ("embed.E",) if f.tie_embeddings else ("head.W",)
    for name, p in model.named_parameters():
        if not name.startswith("mtp."):
            continue
        _, _, k, rest = name.split(".", 3)  # "mtp", "depths", k, "enorm.g" | "block.<rest>"
        layer = f"model.layers.{N + int(k)}."
        if rest in _OWN:
            out.append(Entry(layer + _OWN[rest][0], (name,), _OWN[rest][1]))
            continue
        out += layer_entries(layer, name, rest.removeprefix("block."), p,
                             (layer_names, experts), "deepseek_v3")
    for k in range(len(model.mtp.depths)):
        layer = f"model.layers.{N + k}."
        out += [Entry(layer + "embed_tokens.weight", ("embed.E",), False, copy=True),
                Entry(layer + "shared_head.head.weight", head, TOP_NAMES["head.W"][1],
                      copy=True)]
    return out + [Entry(f"model.layers.{N + int(name.split('.')[2])}.{bias}", (name,), False,
                        buffer=True) for name, _ in model.named_buffers()
                  if name.startswith("mtp.")]


def mtp_layers(f, stored):
    """How many of the f.mtp_depth MTP layers config.json counts the checkpoint holds (those
    with an eh_proj, in order from N); stored {name: (file, name in the file)}. ValueError
    when a held layer's copy of the embedding or head differs from the trunk's tensor."""
    held = 0
    while held < f.mtp_depth and f"model.layers.{f.n_layers + held}.eh_proj.weight" in stored:
        held += 1
    for k in range(held):
        for copy, trunk in _COPIES:
            copy = f"model.layers.{f.n_layers + k}.{copy}"
            trunk = "model.embed_tokens.weight" if f.tie_embeddings and \
                trunk == "lm_head.weight" and trunk not in stored else trunk
            if copy in stored and trunk in stored and not np.array_equal(
                    *(_tensor(stored[n]) for n in (copy, trunk))):
                raise ValueError(f"load_pretrained: {copy} differs from {trunk}; the "
                                 f"library's MTP modules share the trunk's embedding and "
                                 f"head")
    return held


def _tensor(where):
    file, name = where
    with safe_open(file, framework="np") as f:
        return f.get_tensor(name)
