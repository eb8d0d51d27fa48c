"""RWKV-4, rwkv (RwkvForCausalLM). No math here: every layer is the library's RWKV-4 time mix
(the mixer, layer_pattern "W": linear_attention/rwkv_blocks.py RWKV4TimeMix) and channel
mix (the FFN, FFNSpec kind "channel_mix": RWKV4ChannelMix, which keeps the previous
token's x when decoding), pre-norm LayerNorms with biases, and transformers'
blocks.0.pre_ln as the LM's norm on the embeddings (embed_norm); no positions (the token
shift and the decay are the model's sense of order).

    rwkv   x_0 = pre_ln(E[ids]); per block h = x + time_mix(ln1(x)),
           y = h + channel_mix(ln2(h)); logits = ln_out(x_L) W_head
                                               (Peng et al. 2023, arXiv 2305.13048)

rescale_every N (transformers' default 6) as transformers' inference runs it
(RwkvModel._rescale_layers, in eval mode): block i's attention.output and feed_forward.value
weights divided by 2^(i // N) (on load: the library holds them so, Entry.scale; a save
multiplies them back, so the files keep the checkpoint's weights, and their gradients in
grad_dict are those of the files' weights), and the hidden state halved after every N-th
block (LayerSpec.out_scale 0.5: flat rescale_every). The halving and the division cancel but
for the LayerNorms' eps, which sees a 4^k smaller variance: transformers' training mode (no
rescale) differs from its inference by that; the library runs the inference form, training
too. 0 turns it off, as does a value above num_hidden_layers (it reaches no block; saved as
0).

Not implemented, each an error naming it: attention_hidden_size other than hidden_size,
layer_norm_epsilon other than 1e-5 (ln_out keeps LayerNorm's default eps whatever the config
says), a tied head.

Names ("T" transposed), in rwkv.blocks.i.:

    library                            transformers
    embed.E                            rwkv.embeddings.weight
    embed_norm.g / .b                  rwkv.blocks.0.pre_ln.weight / .bias
    norm1.g / .b, norm2.g / .b         ln1.weight / .bias, ln2.weight / .bias
    mixer.mix_k / mix_v / mix_r (D,)   attention.time_mix_key / _value / _receptance (1, 1, D)
    mixer.time_decay / time_first      attention.time_decay / time_first (D,)
    mixer.Wk / Wv / Wr / Wo            attention.key / value / receptance / output.weight  T
    ffn.mix_k / mix_r (D,)             feed_forward.time_mix_key / _receptance (1, 1, D)
    ffn.Wk / Wr / Wv                   feed_forward.key / receptance / value.weight        T
    norm.g / .b, head.W                rwkv.ln_out.weight / .bias, head.weight              T

Reference: huggingface/transformers src/transformers/models/rwkv/modeling_rwkv.py
(RwkvSelfAttention, RwkvFeedForward, RwkvBlock, RwkvModel), and
src/transformers/models/rwkv/configuration_rwkv.py (the defaults).
Glossary: D model width, F channel-mix width.
"""
from scratchllm.hub.families.base import (Family, differences, fail_config, layer_kinds, only,
                                          over, refuse, require)
from scratchllm.hub.layout import Entry

_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers")
_DEFAULTS = dict(context_length=1024, attention_hidden_size=None, intermediate_size=None,
                 layer_norm_epsilon=1e-5, rescale_every=6, tie_word_embeddings=False)
_NEEDS = dict(ffn="channel_mix", norm="layernorm", norm_eps=1e-5, block="pre",
              embed_norm=True, tie_embeddings=False, norm_offset=0.0, embed_scale=False,
              logit_softcap=None)
_LAYER = {  # library name in layers.i -> (name in rwkv.blocks.i, transposed, reshaped)
    "norm1.g": ("ln1.weight", False, False), "norm1.b": ("ln1.bias", False, False),
    "norm2.g": ("ln2.weight", False, False), "norm2.b": ("ln2.bias", False, False),
    "mixer.mix_k": ("attention.time_mix_key", False, True),
    "mixer.mix_v": ("attention.time_mix_value", False, True),
    "mixer.mix_r": ("attention.time_mix_receptance", False, True),
    "mixer.time_decay": ("attention.time_decay", False, False),
    "mixer.time_first": ("attention.time_first", False, False),
    "mixer.Wk": ("attention.key.weight", True, False),
    "mixer.Wv": ("attention.value.weight", True, False),
    "mixer.Wr": ("attention.receptance.weight", True, False),
    "mixer.Wo": ("attention.output.weight", True, False),
    "ffn.mix_k": ("feed_forward.time_mix_key", False, True),
    "ffn.mix_r": ("feed_forward.time_mix_receptance", False, True),
    "ffn.Wk": ("feed_forward.key.weight", True, False),
    "ffn.Wr": ("feed_forward.receptance.weight", True, False),
    "ffn.Wv": ("feed_forward.value.weight", True, False)}
_RESCALED = ("mixer.Wo", "ffn.Wv")  # divided by 2^(i // rescale_every): the blocks' outputs
_TOP = {"embed.E": "rwkv.embeddings.weight", "embed_norm.g": "rwkv.blocks.0.pre_ln.weight",
        "embed_norm.b": "rwkv.blocks.0.pre_ln.bias", "norm.g": "rwkv.ln_out.weight",
        "norm.b": "rwkv.ln_out.bias"}


def _from_hf(hf):
    require(hf, _FIELDS, "rwkv")
    hf = {**_DEFAULTS, **hf}
    D, L = hf["hidden_size"], hf["num_hidden_layers"]
    only(hf, dict(layer_norm_epsilon=1e-5, tie_word_embeddings=False), "rwkv")
    if hf["attention_hidden_size"] not in (None, D):
        fail_config(f"attention_hidden_size = {hf['attention_hidden_size']!r} is not "
                    f"implemented for rwkv (only hidden_size = {D})")
    N = hf["rescale_every"]
    if isinstance(N, bool) or not isinstance(N, int) or N < 0:
        fail_config(f"rescale_every = {N!r} is not implemented for rwkv (an integer >= 0; 0 "
                    f"turns the rescale off)")
    return dict(name="rwkv", vocab_size=hf["vocab_size"], d_model=D, n_layers=L,
                rescale_every=N if N <= L else 0,
                layer_pattern="W" * L, ffn="channel_mix",
                d_ff=hf["intermediate_size"] or 4 * D,
                norm="layernorm", norm_eps=1e-5, embed_norm=True, tie_embeddings=False,
                max_positions=hf["context_length"])


def _to_hf(f, dtype_name, base=None):
    hf = over(base)
    hf.update(architectures=[RWKV.architecture], model_type="rwkv", vocab_size=f.vocab_size,
              hidden_size=f.d_model, num_hidden_layers=f.n_layers, attention_hidden_size=None,
              intermediate_size=f.d_ff, layer_norm_epsilon=f.norm_eps,
              context_length=f.max_positions, rescale_every=f.rescale_every,
              tie_word_embeddings=False,
              dtype=dtype_name)
    return hf


def _check(f):
    """_NEEDS and RWKV-4 time mixing in every layer."""
    differ = differences(f, _NEEDS)
    differ.pop("rescale_every", None)  # any N: rwkv's own
    if set(layer_kinds(f)) != {"W"}:
        differ["layer_pattern"] = "layer_pattern of 'W' only (RWKV-4 time mixing)"
    refuse(f, "rwkv", differ)


def _names(model, f):
    out = [Entry(hf, (lib,), False) for lib, hf in _TOP.items()]
    for i in range(f.n_layers):
        scale = 2.0 ** -(i // f.rescale_every) if f.rescale_every else 1.0
        out += [Entry(f"rwkv.blocks.{i}.{hf}", (f"layers.{i}.{lib}",), t,
                      reshape=(1, 1, f.d_model) if shaped else None,
                      scale=scale if lib in _RESCALED else 1.0)
                for lib, (hf, t, shaped) in _LAYER.items()]
    return out + [Entry("head.weight", ("head.W",), True)]


RWKV = Family("rwkv", "RwkvForCausalLM", _from_hf, _to_hf,
              claims=lambda f: f.ffn == "channel_mix", check=_check, names=_names,
              tied_names=("head.weight",))
