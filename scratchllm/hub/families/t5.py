"""The encoder-decoder family t5 (T5ForConditionalGeneration; Raffel et al. 2019, arXiv
1910.10683, and T5 v1.1's gated-GELU FFN), as the library's Seq2SeqLM (lm/seq2seq.py): pre-norm
blocks with T5LayerNorm (rmsnorm, no bias), unscaled multi-head attention (scale 1) with the
relative position bias of each stack's first layer, no biases anywhere, the FFN of
feed_forward_proj ("relu": relu_mlp; "gated-gelu": geglu with gelu_new (tanh); "gated-silu":
swiglu), one shared embedding, the head tied to it with the decoder output scaled by
d_model^-1/2 (scale_decoder_outputs) or untied (lm_head.weight) without that scale.

    library                         transformers (t5)
    embed.E                         shared.weight (encoder./decoder.embed_tokens: copies)
    encoder.i.norm1.g               encoder.block.i.layer.0.layer_norm.weight
    encoder.i.mixer.wq (wk, wv, wo) encoder.block.i.layer.0.SelfAttention.q (k, v, o).weight  T
    encoder.0.mixer.rel_table       encoder.block.0.layer.0.SelfAttention
                                    .relative_attention_bias.weight (num_buckets, H)
    encoder.i.norm2.g               encoder.block.i.layer.1.layer_norm.weight
    encoder.i.ffn.W1 (W3, W2)       encoder.block.i.layer.1.DenseReluDense.wi or wi_0 (wi_1,
                                    wo).weight                                                T
    decoder.i.*                     decoder.block.i.layer.0 (self-attention), layer.1
                                    (norm_cross, cross: EncDecAttention), layer.2 (the FFN)
    enc_norm.g, dec_norm.g          encoder. / decoder.final_layer_norm.weight
    head.W (untied)                 lm_head.weight                                            T
transformers 5 ties the head whenever lm_head.weight is absent or equal to shared.weight
(T5Config always sets tie_word_embeddings) and reads the scale from scale_decoder_outputs
(older configs: tie_word_embeddings); loading does the same (ModuleFamily.tied_head).

Reference: huggingface/transformers src/transformers/models/t5/modeling_t5.py and
configuration_t5.py.
Glossary: D model width, H heads, V vocabulary.
"""
from types import SimpleNamespace

from scratchllm.hub.families.base import differences, fail_config, over, refuse, require
from scratchllm.hub.families.modules import ModuleFamily
from scratchllm.hub.layout import Entry
from scratchllm.lm.seq2seq import Seq2SeqLM
from scratchllm.specs import (AttentionSpec, FFNSpec, LayerSpec, Mask, MoESpec, NormSpec,
                              RelativeBiasSpec)
from scratchllm.specs.seq2seq import Seq2SeqConfig

# feed_forward_proj -> (FFNSpec kind, gelu_approx); "gated-gelu" is gelu_new (tanh) in HF
FFN_KINDS = {"relu": ("relu_mlp", "tanh"), "gated-gelu": ("geglu", "tanh"),
             "gated-gelu_new": ("geglu", "tanh"), "gated-gelu_pytorch_tanh": ("geglu", "tanh"),
             "gated-silu": ("swiglu", "tanh")}
FFN_NAMES = {"relu_mlp": "relu", "geglu": "gated-gelu", "swiglu": "gated-silu"}  # and back
T5_FIELDS = ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads")
# library name in a block -> (HF name in a T5Block's layer list, ffn sub-layer index below)
SELF = {"norm1.g": "layer.0.layer_norm.weight", "mixer.wq": "layer.0.SelfAttention.q.weight",
        "mixer.wk": "layer.0.SelfAttention.k.weight", "mixer.wv": "layer.0.SelfAttention.v.weight",
        "mixer.wo": "layer.0.SelfAttention.o.weight",
        "mixer.rel_table": "layer.0.SelfAttention.relative_attention_bias.weight"}
CROSS = {"norm_cross.g": "layer.1.layer_norm.weight",
         "cross.wq": "layer.1.EncDecAttention.q.weight",
         "cross.wk": "layer.1.EncDecAttention.k.weight",
         "cross.wv": "layer.1.EncDecAttention.v.weight",
         "cross.wo": "layer.1.EncDecAttention.o.weight"}
DENSE = {"relu_mlp": {"ffn.W1": "wi", "ffn.W2": "wo"},
         "geglu": {"ffn.W1": "wi_0", "ffn.W3": "wi_1", "ffn.W2": "wo"},
         "swiglu": {"ffn.W1": "wi_0", "ffn.W3": "wi_1", "ffn.W2": "wo"}}


def ffn_of(hf, family):
    """(FFNSpec kind, gelu_approx) of config.json's feed_forward_proj (or dense_act_fn)."""
    proj = hf.get("feed_forward_proj", hf.get("dense_act_fn", "relu"))
    if proj not in FFN_KINDS:
        fail_config(f"feed_forward_proj = {proj!r} is not implemented for {family} (only "
                    f"{sorted(FFN_KINDS)})")
    return FFN_KINDS[proj]


def stack_specs(hf, ffn):
    """(encoder layer, decoder layer, cross-attention) specs of a T5-style config.json: MHA
    of num_heads heads of d_kv, scale 1, each stack's relative bias, T5LayerNorm; ffn(i,
    decoder) -> the FFN spec of layer i of a stack."""
    H, dkv = hf["num_heads"], hf["d_kv"]
    nb, md = hf.get("relative_attention_num_buckets", 32), hf.get(
        "relative_attention_max_distance", 128)
    norm = NormSpec("rmsnorm", float(hf.get("layer_norm_epsilon", 1e-6)))

    def layer(i, decoder):
        attn = AttentionSpec(H, H, head_dim=dkv, scale=1.0, rope=None,
                             position_bias=RelativeBiasSpec(nb, md, not decoder),
                             mask=Mask(causal=decoder))
        return LayerSpec(attn, ffn(i, decoder), norm)

    cross = AttentionSpec(H, H, head_dim=dkv, scale=1.0, rope=None, mask=Mask(causal=False))
    return layer, cross, norm


def tie_and_scale(hf):
    """(tie_embeddings, scale_output) of config.json: transformers 5 writes
    scale_decoder_outputs; before it, tie_word_embeddings said both."""
    tie = hf.get("tie_word_embeddings", True) is not False
    return tie, bool(hf.get("scale_decoder_outputs", tie))


def seq2seq_config(hf, family, ffn):
    """The Seq2SeqConfig of a T5-style config.json; ffn(i, decoder) -> layer i's FFN spec."""
    require(hf, T5_FIELDS, family)
    if hf.get("is_encoder_decoder", True) is not True or hf.get("is_decoder", False):
        fail_config(f"is_encoder_decoder = {hf.get('is_encoder_decoder')!r}, is_decoder = "
                    f"{hf.get('is_decoder')!r}: {family} is an encoder-decoder")
    layer, cross, norm = stack_specs(hf, ffn)
    n_dec = hf.get("num_decoder_layers") or hf["num_layers"]
    tie, scale = tie_and_scale(hf)
    start = hf.get("decoder_start_token_id")
    return Seq2SeqConfig(
        name=family, vocab_size=hf["vocab_size"], d_model=hf["d_model"],
        encoder=tuple(layer(i, False) for i in range(hf["num_layers"])),
        decoder=tuple(layer(i, True) for i in range(n_dec)), cross=cross, norm=norm,
        tie_embeddings=tie, scale_output=scale, shared_bias=True,
        decoder_start_id=hf.get("pad_token_id", 0) if start is None else start)


def _from_hf(hf):
    kind, approx = ffn_of(hf, "t5")
    return seq2seq_config(hf, "t5", lambda i, decoder: FFNSpec(kind, hf["d_ff"], approx))


def common_hf(cfg, family, dtype_name, base):
    """config.json fields T5 and Switch share, over `base` (the loaded config.json)."""
    enc = cfg.encoder[0]
    hf = over(base, drop=("tie_word_embeddings", "scale_decoder_outputs"))
    hf.update(architectures=[family.architecture], model_type=family.model_type,
              vocab_size=cfg.vocab_size, d_model=cfg.d_model,
              d_kv=enc.mixer.dh(cfg.d_model), num_layers=len(cfg.encoder),
              num_decoder_layers=len(cfg.decoder), num_heads=enc.mixer.n_heads,
              relative_attention_num_buckets=enc.mixer.relative.num_buckets,
              relative_attention_max_distance=enc.mixer.relative.max_distance,
              layer_norm_epsilon=enc.norm.eps, is_encoder_decoder=True,
              decoder_start_token_id=cfg.decoder_start_id,
              tie_word_embeddings=cfg.tie_embeddings, scale_decoder_outputs=cfg.scale_output,
              dtype=dtype_name)
    hf.setdefault("pad_token_id", 0)
    hf.setdefault("eos_token_id", 1)
    return hf


def _to_hf(cfg, dtype_name, base=None):
    hf = common_hf(cfg, T5, dtype_name, base)
    ffn = cfg.encoder[0].ffn
    proj = FFN_NAMES[ffn.kind]
    if hf.get("feed_forward_proj") not in FFN_KINDS or FFN_KINDS[hf["feed_forward_proj"]] != (
            ffn.kind, "tanh"):  # a loaded name survives
        hf["feed_forward_proj"] = proj
    hf.pop("dense_act_fn", None)
    hf.pop("is_gated_act", None)
    hf["d_ff"] = ffn.d_ff
    return hf


def shape_of(cfg, sparse=False):
    """{option: value}: what of a Seq2SeqConfig the T5-style families decide on (for
    refuse); sparse: MoE FFNs are allowed (Switch)."""
    enc, dec, cross = cfg.encoder[0].mixer, cfg.decoder[0].mixer, cfg.cross
    dense = [layer.ffn for layer in cfg.encoder + cfg.decoder
             if not isinstance(layer.ffn, MoESpec)]
    kinds = {(f.kind, f.gelu_approx if f.kind == "geglu" else "tanh") for f in dense
             if f is not None}
    same_attn = all(layer.mixer == enc for layer in cfg.encoder) and all(
        layer.mixer == dec for layer in cfg.decoder)
    norms = {layer.norm for layer in cfg.encoder + cfg.decoder} | {cfg.norm}
    return dict(
        same_attention=same_attn, mha=enc.n_heads == enc.n_kv_heads,
        plain=not any((enc.qkv_bias, enc.o_bias, enc.qk_norm, enc.sinks, enc.softcap,
                       cross.qkv_bias, cross.o_bias, cross.qk_norm, cross.sinks,
                       cross.softcap)),
        scale=(enc.scale, cross.scale), relative=enc.relative is not None and (
            dec.relative is not None and enc.relative.num_buckets == dec.relative.num_buckets
            and enc.relative.max_distance == dec.relative.max_distance),
        same_heads=(enc.n_heads, enc.head_dim) == (dec.n_heads, dec.head_dim) == (
            cross.n_heads, cross.head_dim) and cross.n_kv_heads == cross.n_heads,
        ffn=not dense or len(kinds) == 1 and next(iter(kinds))[0] in FFN_NAMES and next(
            iter(kinds))[1] == "tanh" and len({f.d_ff for f in dense}) == 1,
        moe=len(dense) < len(cfg.encoder) + len(cfg.decoder) if not sparse else sparse,
        norm=len(norms) == 1 and cfg.norm.kind == "rmsnorm" and not cfg.norm.offset,
        placement={layer.placement for layer in cfg.encoder + cfg.decoder} == {"pre"},
        shared_bias=cfg.shared_bias)


def refuse_shape(cfg, family, sparse=False):
    """base.refuse naming every option of cfg the family cannot express."""
    got = shape_of(cfg, sparse)
    need = dict(same_attention=True, mha=True, plain=True, scale=(1.0, 1.0), relative=True,
                same_heads=True, ffn=True, moe=sparse, norm=True, placement=True,
                shared_bias=True)
    view = SimpleNamespace(name=cfg.name, **got)
    refuse(view, family, differences(view, need))


def block_entries(model, stack, ffn_entries):
    """[Entry] of every Param of model.<stack> (encoder or decoder) under <stack>.block.i.,
    the FFN's from ffn_entries(i, block, rest, sub) (sub: the FFN's layer index, 1 or 2) ->
    [Entry] or None for a name that is not the FFN's."""
    out, sub = [], 2 if stack == "decoder" else 1
    names = {**SELF, **(CROSS if stack == "decoder" else {})}
    for i, blk in enumerate(getattr(model, stack)):
        q = f"{stack}.block.{i}."
        for rest, p in blk.named_parameters():
            lib = f"{stack}.{i}.{rest}"
            if rest == "mixer.rel_table" and i and model.cfg.shared_bias:
                continue  # the first layer's table (the same Param)
            if rest in names:
                out.append(Entry(q + names[rest], (lib,), p.data.ndim == 2 and "rel" not in rest))
            elif rest == "norm2.g":
                out.append(Entry(f"{q}layer.{sub}.layer_norm.weight", (lib,), False))
            else:
                got = ffn_entries(i, blk, rest, q + f"layer.{sub}.", lib)
                if got is None:
                    raise ValueError(f"hub: parameter {lib!r} has no {model.cfg.name} tensor "
                                     f"name")
                out += got
    return out


def top_entries(model):
    """[Entry] of the shared embedding, the final norms and the untied head."""
    out = [Entry("shared.weight", ("embed.E",), False),
           Entry("encoder.final_layer_norm.weight", ("enc_norm.g",), False),
           Entry("decoder.final_layer_norm.weight", ("dec_norm.g",), False)]
    return out + ([] if model.head is None else [Entry("lm_head.weight", ("head.W",), True)])


def _dense_entries(i, blk, rest, prefix, lib):
    hf = DENSE[blk.spec.ffn.kind].get(rest)
    return None if hf is None else [Entry(f"{prefix}DenseReluDense.{hf}.weight", (lib,), True)]


def _names(model, cfg):
    return (top_entries(model) + block_entries(model, "encoder", _dense_entries)
            + block_entries(model, "decoder", _dense_entries))


# tensors a T5 checkpoint may carry that the model reads from elsewhere or not at all
T5_UNUSED = ("encoder.embed_tokens.", "decoder.embed_tokens.",
             "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.")

T5 = ModuleFamily(
    "t5", "T5ForConditionalGeneration", _from_hf, _to_hf,
    claims=lambda cfg: isinstance(cfg, Seq2SeqConfig) and not shape_of(cfg)["moe"],
    check=lambda cfg: refuse_shape(cfg, "t5"), build=Seq2SeqLM, names=_names,
    unused=T5_UNUSED, tied_head=("lm_head.weight", "shared.weight"))
