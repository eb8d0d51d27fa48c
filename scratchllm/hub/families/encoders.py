"""The encoder families: bert (BertForMaskedLM, Devlin et al. 2018, arXiv 1810.04805). No math
here: lm/encoder.py's MaskedLM builds BERT from the ModelConfig options it needs (flat names
in brackets): bidirectional attention (causal=False) with biases, post-norm LayerNorm blocks
(block="post"), a GELU MLP with biases (ffn="gelu_mlp", erf unless hidden_act says tanh),
learned positions, token types (type_vocab_size), pad_token_id's row without lookup gradient
(pad_id: torch's padding_idx), a LayerNorm on the embeddings (embed_norm),
no final norm (final_norm=False) and the MLM head: dense + GELU + LayerNorm, then the tied
projection with an output bias (mlm_head).

    library                          transformers (bert)
    embed.E, pos.E, types.E          bert.embeddings.word_embeddings / position_embeddings /
                                     token_type_embeddings .weight
    embed_norm.g / .b                bert.embeddings.LayerNorm.weight / .bias
    layers.i.mixer.wq, bq (wk, wv)   bert.encoder.layer.i.attention.self.query.weight, .bias  T
    layers.i.mixer.wo, bo            ...attention.output.dense.weight, .bias                  T
    layers.i.norm1.g / .b            ...attention.output.LayerNorm.weight / .bias
    layers.i.ffn.W1, b1 (W2, b2)     ...intermediate.dense (output.dense) .weight, .bias      T
    layers.i.norm2.g / .b            ...output.LayerNorm.weight / .bias
    transform.dense.W, b             cls.predictions.transform.dense.weight, .bias            T
    transform.norm.g / .b            cls.predictions.transform.LayerNorm.weight / .bias
    head_bias                        cls.predictions.bias (= cls.predictions.decoder.bias)
Checkpoints converted from Google's TensorFlow release (google-bert/bert-base-uncased) name
the LayerNorm gains and biases gamma and beta and carry BertForPreTraining's pooler and
next-sentence head: both read as transformers' BertForMaskedLM reads them (renamed; unused).
The decoder is tied to the word embeddings: an untied BertForMaskedLM (tie_word_embeddings
false) keeps a second output bias that nothing reads (transformers unties cls.predictions.bias
from decoder.bias too), which this library does not model: refused by name.

Reference: huggingface/transformers src/transformers/models/bert/modeling_bert.py
(BertEmbeddings, BertLayer, BertLMPredictionHead) and configuration_bert.py (the defaults).
Glossary: V vocabulary, D model width.
"""
from scratchllm.hub.families.base import (Family, differences, fail_config, only, over, refuse,
                                          require)
from scratchllm.hub.layout import Entry
from scratchllm.lm import MaskedLM

_GELU = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}  # HF ACT2FN names
_FIXED = dict(is_decoder=False, add_cross_attention=False,
              position_embedding_type="absolute", tie_word_embeddings=True)
_NEEDS = dict(attention="gqa", positions="learned", layer_pattern=None, layer_types=None,
              window=None, n_sink=0, attn_sinks=False, head_dim=None, qkv_bias=True,
              o_bias=True, qk_norm=False, attn_scale=None, ffn="gelu_mlp", norm="layernorm",
              block="post", embed_scale=False, causal=False, embed_norm=True,
              final_norm=False, mlm_head=True, tie_embeddings=True)
_TOP = {"embed.E": "bert.embeddings.word_embeddings.weight",
        "pos.E": "bert.embeddings.position_embeddings.weight",
        "types.E": "bert.embeddings.token_type_embeddings.weight",
        "embed_norm.g": "bert.embeddings.LayerNorm.weight",
        "embed_norm.b": "bert.embeddings.LayerNorm.bias",
        "transform.norm.g": "cls.predictions.transform.LayerNorm.weight",
        "transform.norm.b": "cls.predictions.transform.LayerNorm.bias",
        "head_bias": "cls.predictions.bias"}
_TOP_T = {"transform.dense.W": "cls.predictions.transform.dense.weight",
          "transform.dense.b": "cls.predictions.transform.dense.bias"}
_LAYER = {  # library name in layers.i -> (name in bert.encoder.layer.i, transposed)
    "mixer.wq": ("attention.self.query.weight", True),
    "mixer.bq": ("attention.self.query.bias", False),
    "mixer.wk": ("attention.self.key.weight", True),
    "mixer.bk": ("attention.self.key.bias", False),
    "mixer.wv": ("attention.self.value.weight", True),
    "mixer.bv": ("attention.self.value.bias", False),
    "mixer.wo": ("attention.output.dense.weight", True),
    "mixer.bo": ("attention.output.dense.bias", False),
    "norm1.g": ("attention.output.LayerNorm.weight", False),
    "norm1.b": ("attention.output.LayerNorm.bias", False),
    "ffn.W1": ("intermediate.dense.weight", True), "ffn.b1": ("intermediate.dense.bias", False),
    "ffn.W2": ("output.dense.weight", True), "ffn.b2": ("output.dense.bias", False),
    "norm2.g": ("output.LayerNorm.weight", False), "norm2.b": ("output.LayerNorm.bias", False),
}


def _from_hf(hf):
    require(hf, ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size"), "bert")
    act = hf.get("hidden_act", "gelu")
    if act not in _GELU:
        fail_config(f"hidden_act = {act!r} is not implemented (only {sorted(_GELU)})")
    only(hf, _FIXED, "bert")
    H = hf["num_attention_heads"]
    return dict(name="bert", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
                n_layers=hf["num_hidden_layers"], n_heads=H, n_kv_heads=H,
                d_ff=hf["intermediate_size"], norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
                tie_embeddings=True, qkv_bias=True,
                o_bias=True, norm="layernorm", block="post", positions="learned",
                max_positions=hf.get("max_position_embeddings", 512), ffn="gelu_mlp",
                gelu_approx=_GELU[act], causal=False,
                type_vocab_size=hf.get("type_vocab_size", 2), embed_norm=True,
                final_norm=False, mlm_head=True, pad_id=hf.get("pad_token_id", 0))


def _to_hf(f, dtype_name, base=None):
    hf = over(base)
    act = hf.get("hidden_act") if _GELU.get(hf.get("hidden_act")) == f.gelu_approx else (
        "gelu" if f.gelu_approx == "none" else "gelu_new")  # a loaded name survives
    hf.update(architectures=[BERT.architecture], model_type=BERT.model_type,
              vocab_size=f.vocab_size, hidden_size=f.d_model, num_hidden_layers=f.n_layers,
              num_attention_heads=f.n_heads, intermediate_size=f.d_ff, hidden_act=act,
              max_position_embeddings=f.max_positions, type_vocab_size=f.type_vocab_size,
              layer_norm_eps=f.norm_eps, tie_word_embeddings=True,
              is_decoder=False, add_cross_attention=False, pad_token_id=f.pad_id,
              dtype=dtype_name)
    return hf


def _check(f):
    """BERT is multi-head attention (n_kv_heads = n_heads) with token types, besides _NEEDS."""
    needs = dict(_NEEDS, n_kv_heads=f.n_heads, type_vocab_size=f.type_vocab_size,
                 pad_id=f.pad_id)
    differ = differences(f, needs)
    if not f.type_vocab_size:
        differ["type_vocab_size"] = "type_vocab_size>0"
    refuse(f, "bert", differ)


def _names(model, f):
    out = [Entry(hf, (lib,), False) for lib, hf in _TOP.items()]
    out += [Entry(hf, (lib,), lib.endswith(".W")) for lib, hf in _TOP_T.items()]
    for i in range(f.n_layers):
        p, q = f"layers.{i}.", f"bert.encoder.layer.{i}."
        out += [Entry(q + hf, (p + lib,), t) for lib, (hf, t) in _LAYER.items()]
    return out


BERT = Family("bert", "BertForMaskedLM", _from_hf, _to_hf, claims=lambda f: f.mlm_head,
              check=_check, names=_names, model_class=MaskedLM,
              tied_names=("cls.predictions.decoder.weight", "cls.predictions.decoder.bias"),
              renames=(("LayerNorm.gamma", "LayerNorm.weight"),
                       ("LayerNorm.beta", "LayerNorm.bias")),
              unused=("bert.pooler.", "cls.seq_relationship."))
