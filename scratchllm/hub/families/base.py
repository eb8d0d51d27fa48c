"""What every family record shares: the Family record type, the errors for a config.json the
library cannot read (fail_config) and for a config a family cannot express (refuse), RoPE's
config.json fields, and llama's tensor names, which most decoder families extend.

A family reads a model config through its flat view (hub/registry.py's flat_of): the flat
names as attributes, f.n_heads, f.window, ...; head_dim(f) and layer_kinds(f) are the two
values derived from them.

Reference: huggingface/transformers src/transformers/modeling_rope_utils.py (rope_parameters
and the older rope_theta + rope_scaling).
"""
from dataclasses import dataclass
from typing import Callable

from scratchllm.hub.layout import Entry
from scratchllm.lm import LM

# config.json fields every llama-style decoder has (model_type: the family's own names)
DECODER_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                  "num_attention_heads")


@dataclass(frozen=True)
class Family:
    """One Hugging Face model_type: everything the hub needs to read and write it.

    model_type     config.json's model_type; a loaded LM's config keeps it as its name
    architecture   config.json's architectures entry (the transformers class)
    from_hf(hf)    config.json dict -> {flat name: value}; ValueError (fail_config) naming a field
                   whose value the library does not implement
    to_hf(f, dtype_name, base)  a config's flat view -> config.json dict, written over
                   `base` (the loaded config.json or None: token ids and the fields the
                   library does not use survive a round trip)
    claims(f)      whether a config not named after a family has this family's shape (the
                   registry offers such a config, a preset's, to every family; at most one
                   claims it)
    check(f)       ValueError (refuse) naming every option of f the family cannot express
    names(model, f)  [layout.Entry]: every HF tensor of the LM and the library arrays it is
                   made of (read both ways by layout.py)
    bare_prefix    a prefix that checkpoints of the headless model leave out of every tensor
                   name but lm_head's ("transformer." for GPT-2's GPT2Model); "" for none
    model_class    the model built from the config: LM (a causal LM: forward(ids)), or
                   another with LM's Params and backward (MaskedLM: forward(input_ids,
                   token_type_ids=None))
    tied_names     tensors a checkpoint may hold beside the embedding when the head is tied
                   (copies of it: read past on loading, never written)
    renames        ((old, new), ...): parts of older checkpoints' tensor names read as the
                   names() give them (BERT's TF-era "LayerNorm.gamma" for .weight); saving
                   writes the new names
    unused         prefixes of tensors a checkpoint may carry for heads the model does not
                   have (BertForPreTraining's pooler and next-sentence head): read past
    mtp_layers(f, stored)  for a family whose from_hf sets mtp_depth: how many of those
                   multi-token-prediction layers the checkpoint's tensors {name: (file,
                   name)} hold (deepseek_mtp.py); None for the others
    """
    model_type: str
    architecture: str
    from_hf: Callable
    to_hf: Callable
    claims: Callable
    check: Callable
    names: Callable
    bare_prefix: str = ""
    model_class: type = LM
    tied_names: tuple = ("lm_head.weight",)
    renames: tuple = ()
    unused: tuple = ()
    mtp_layers: Callable = None


def fail_config(msg):
    """Raise the ValueError of a config.json the library cannot read; msg names the field."""
    raise ValueError(f"load_pretrained: config.json: {msg}")


def require(hf, fields, family):
    """fail_config unless config.json (hf) has every one of `fields`."""
    missing = [k for k in fields if k not in hf]
    if missing:
        fail_config(f"missing field(s) {missing} (model_type {family!r})")


def only(hf, fixed, family):
    """fail_config for a field of config.json whose value is not the one the library implements
    (fixed: {field: that value}; an absent field has that value)."""
    for field, value in fixed.items():
        if hf.get(field, value) != value:
            fail_config(f"{field} = {hf[field]!r} is not implemented for {family} "
                        f"(only {value!r})")


# what every causal LM family needs unless its needs say otherwise (the encoder options)
CAUSAL_LM = dict(causal=True, type_vocab_size=0, embed_norm=False, final_norm=True,
                 mlm_head=False, pad_id=None)
CAUSAL_LM.update(attention_chunk=None, nope_layers=None, moe_gate_input=False)  # Llama 4's
CAUSAL_LM.update(index_topk=None, shared_gate=False, attn_temperature=None,
                 rope_partial=1.0, attn_output_gate=False)  # DeepSeek-V3.2's, Qwen3-Next's
CAUSAL_LM.update(rescale_every=0)  # RWKV's inference rescale
CAUSAL_LM.update(mtp_depth=0)  # multi-token prediction: deepseek_v3's alone (deepseek_mtp.py)


def write_pad_id(hf, f):
    """hf (a config.json dict) with pad_token_id = f.pad_id, for a family whose transformers
    model embeds with nn.Embedding(vocab, D, padding_idx=config.pad_token_id) and whose config
    class defaults it to None (a pad_id None stays out of an hf that has no pad_token_id)."""
    if f.pad_id is not None or "pad_token_id" in hf:
        hf["pad_token_id"] = f.pad_id
    return hf


def differences(f, needs):
    """{flat name: "name=value"} for every field of needs ({flat name: value}, over
    CAUSAL_LM's where f is a model config's flat view: a vision config's view has none of
    them) that f has another value of, in the order of needs."""
    needs = {**{k: v for k, v in CAUSAL_LM.items() if hasattr(f, k)}, **needs}
    return {k: f"{k}={v!r}" for k, v in needs.items() if getattr(f, k) != v}


def refuse(f, family, differ):
    """Raise the ValueError of a config the family cannot express, when differ ({flat name:
    what the family needs}, as differences gives it) is not empty: it names what the family
    needs and the values f has."""
    if differ:
        got = ", ".join(f"{k}={getattr(f, k)!r}" for k in differ)
        raise ValueError(f"save_pretrained: config {f.name!r} is a {family} checkpoint only "
                         f"with {', '.join(differ.values())}: {family} cannot express {got}")


def head_dim(f):
    """Dh, the attention head dim: head_dim, or d_model / n_heads when that is None."""
    return f.head_dim or f.d_model // f.n_heads


def layer_kinds(f):
    """One letter per layer: "A" attention, "M" Mamba, or a recurrent mixer (L, R, G, D, S,
    W: none of them a Hugging Face family's)."""
    return f.layer_pattern or "A" * f.n_layers


def over(base, drop=()):
    """A copy of `base` (the loaded config.json, or None) without torch_dtype,
    transformers_version and the fields in `drop`: the start of every to_hf."""
    hf = dict(base or {})
    for key in ("torch_dtype", "transformers_version", *drop):
        hf.pop(key, None)
    return hf


def rope_of(hf, *, partial=False):
    """(rope_theta, rope_scaling dict or None) from config.json's `rope_parameters`
    (transformers >= 5) or its older `rope_theta` + `rope_scaling`; with partial=True (a
    family whose transformers model turns only part of each head: Qwen3-Next)
    (rope_theta, rope_scaling, partial_rotary_factor), the factor read from rope_parameters
    or the top level (older configs), 1.0 when absent. Without partial, a factor other than 1
    is an error naming it."""
    params = hf.get("rope_parameters")
    if params is None:
        params = dict(hf.get("rope_scaling") or {})
        theta = hf.get("rope_theta", 10000.0)
    else:
        params = dict(params)
        theta = params.pop("rope_theta", hf.get("rope_theta", 10000.0))
    factor = params.pop("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        fail_config(f"partial_rotary_factor = {factor!r} must be a number in (0, 1]")
    if factor != 1.0 and not partial:
        fail_config(f"partial_rotary_factor = {factor!r} (a partial rotary dim) is not "
                    f"implemented for model_type {hf.get('model_type')!r}")
    theta, scaling = _rope_type(hf, params, theta)
    return (theta, scaling, float(factor)) if partial else (theta, scaling)


def _rope_type(hf, params, theta):
    """(theta, the rope_scaling dict or None) of rope_parameters without theta and factor."""
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type == "dynamic":  # HF's dynamic NTK starts from max_position_embeddings
        params["original_max_position_embeddings"] = hf["max_position_embeddings"]
    if rope_type == "yarn":
        params.setdefault("original_max_position_embeddings", hf["max_position_embeddings"])
        if params.get("factor") is None:  # DeepSeek-style configs: the ratio of the lengths
            params["factor"] = hf["max_position_embeddings"] / params[
                "original_max_position_embeddings"]
    return float(theta), {"rope_type": rope_type, **params}


def rope_parameters(f, max_pos):
    """(rope_parameters dict, max_position_embeddings) for config.json: HF's dynamic NTK
    reads its original length from max_position_embeddings, so that takes it; a partial
    rotary dim (f.rope_partial < 1) is its partial_rotary_factor."""
    scaling = dict(f.rope_scaling or {"rope_type": "default"})
    if scaling.get("rope_type") == "dynamic":
        max_pos = scaling.pop("original_max_position_embeddings")
    if f.rope_partial != 1.0:
        scaling["partial_rotary_factor"] = f.rope_partial
    return {**scaling, "rope_theta": f.rope_base}, max_pos


# ---------------------------------------------------------------------------- tensor names
TOP_NAMES = {"embed.E": ("model.embed_tokens.weight", False),
             "norm.g": ("model.norm.weight", False), "head.W": ("lm_head.weight", True)}
LAYER_NAMES = {  # library name in layers.i -> (name in model.layers.i, transposed)
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


def decoder_entries(model, family, layer_names, experts=None):
    """[Entry] for every Param of a decoder named the llama way: TOP_NAMES, and
    model.layers.i.<layer_names[rest]> for layers.i.<rest>. experts = (prefix, {rest: tensor})
    names a stacked expert Param (E, ...) one tensor per expert:
    model.layers.i.<prefix>.<e>.<tensor>.weight, transposed. ValueError for a Param of
    neither table."""
    out = []
    for name, p in model.named_parameters():
        if name.startswith("mtp."):  # a family with MTP layers names them (deepseek_mtp.py)
            continue
        if name in TOP_NAMES:
            out.append(Entry(TOP_NAMES[name][0], (name,), TOP_NAMES[name][1]))
            continue
        _, i, rest = name.split(".", 2)  # "layers", i, "mixer.wq"
        out += layer_entries(f"model.layers.{i}.", name, rest, p, (layer_names, experts),
                             family)
    return out


def layer_entries(layer, name, rest, p, tables, family):
    """[Entry] of Param p (library name `name`) of a decoder layer whose HF names start with
    `layer` ("model.layers.3."): rest its name inside the layer, tables (layer_names,
    experts) as decoder_entries takes them. ValueError for a Param of neither table."""
    layer_names, (prefix, per_expert) = tables[0], tables[1] or ("", {})
    if rest in per_expert:
        return [Entry(f"{layer}{prefix}.{e}.{per_expert[rest]}.weight", (name,), True, e)
                for e in range(p.data.shape[0])]
    if rest in layer_names:
        return [Entry(layer + layer_names[rest][0], (name,), layer_names[rest][1])]
    raise ValueError(f"hub: parameter {name!r} has no {family} tensor name")
