"""More Mixture-of-Experts families: qwen3_moe. No math here: the LM builds them from the
library's pairs (attention/gqa.py, moe/layer.py, moe/router.py).

    qwen3_moe   qwen3's attention (GQA + RoPE, QK-norm over each head, explicit head_dim) and
                an MoE of SwiGLU experts in layer i when (i + 1) % decoder_sparse_step == 0
                and i is not in mlp_only_layers (else a dense SwiGLU of intermediate_size):
                softmax router, top-k of the probabilities, gates renormalised over the k
                when norm_topk_prob (else the chosen probabilities themselves), no shared
                expert                                   (Yang et al. 2025, arXiv 2505.09388)

Training-only knobs as in moe.py: router_aux_loss_coef weighs a loss only with
output_router_logits, so a loaded model has balance_coef = z_coef = bias_gamma = 0.

Names: the checkpoint holds one tensor per expert (transformers 5 fuses them in memory only;
its save_pretrained writes them apart), expert e the slice [e] of a stacked Param, "T"
transposed; attention, norms, embedding and head as qwen3's (base.py's LAYER_NAMES):

    library                         qwen3_moe: model.layers.i.
    ffn.w_router (D, E)             mlp.gate.weight (E, D)                              T
    ffn.w1[e] / w3[e] (D, F)        mlp.experts.e.gate_proj / up_proj.weight (F, D)     T
    ffn.w2[e] (F, D)                mlp.experts.e.down_proj.weight (D, F)               T
    ffn.W1 / W3 / W2 (dense layers) mlp.gate_proj / up_proj / down_proj.weight          T

The expert count is num_local_experts (transformers 5's name) or num_experts (earlier
configs; a saved config keeps the name it was loaded with). mlp_only_layers is read as
first_k_dense when it is the first k layers (the form the library
has); any other list is an error naming it.
Reference: huggingface/transformers src/transformers/models/qwen3_moe/modeling_qwen3_moe.py
(Qwen3MoeTopKRouter, Qwen3MoeDecoderLayer), configuration_qwen3_moe.py (the defaults below).
Glossary: D model width, E experts, F expert width.
"""
from scratchllm.hub.families.base import (DECODER_FIELDS, LAYER_NAMES, Family, decoder_entries,
                                          differences, fail_config, head_dim, layer_kinds, only,
                                          over, refuse, require, rope_of, rope_parameters)

_QWEN3_MOE = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=32768,
                  num_key_value_heads=4, head_dim=None, decoder_sparse_step=1,
                  moe_intermediate_size=768, num_experts_per_tok=8, num_local_experts=128,
                  norm_topk_prob=False, mlp_only_layers=None, sliding_window=4096)
_TRAINING_ONLY = dict(balance_coef=0.0, z_coef=0.0, bias_gamma=0.0)
_QWEN3_MOE_NEEDS = dict(
    attention="gqa", positions="rope", rope_style="half", layer_types=None, window=None,
    n_sink=0, attn_sinks=False, qkv_bias=False, o_bias=False, qk_norm=True, attn_scale=None,
    ffn="moe", experts="swiglu", score="softmax", router_bias=False, n_shared=0, n_group=1,
    topk_group=1, routed_scaling_factor=1.0, capacity_factor=None, moe_offset=None,
    norm="rmsnorm", block="pre", norm_offset=0.0, embed_scale=False, bias_gamma=0.0,
    attn_softcap=None, logit_softcap=None)
_QWEN3_MOE_LAYER = dict(LAYER_NAMES, **{"ffn.w_router": ("mlp.gate.weight", True)})
_QWEN3_MOE_EXPERTS = ("mlp.experts", {"ffn.w1": "gate_proj", "ffn.w3": "up_proj",
                                      "ffn.w2": "down_proj"})


def _qwen3_moe_from_hf(hf):
    require(hf, DECODER_FIELDS, "qwen3_moe")
    hf = {**_QWEN3_MOE, **hf}
    if "num_experts" in hf:  # transformers < 5 names it so (5: num_local_experts)
        hf["num_local_experts"] = hf["num_experts"]
    only(hf, dict(hidden_act="silu", attention_bias=False, use_sliding_window=False),
         "qwen3_moe")
    dense = sorted(hf["mlp_only_layers"] or [])
    if dense != list(range(len(dense))):
        fail_config(f"mlp_only_layers = {hf['mlp_only_layers']!r} is not implemented for "
                    f"qwen3_moe (only the first k layers: [0, 1, ..., k - 1])")
    theta, scaling = rope_of(hf)
    H, D = hf["num_attention_heads"], hf["hidden_size"]
    return dict(
        name="qwen3_moe", vocab_size=hf["vocab_size"], d_model=D,
        n_layers=hf["num_hidden_layers"], n_heads=H, n_kv_heads=hf["num_key_value_heads"] or H,
        head_dim=None if hf["head_dim"] in (None, D // H) else hf["head_dim"],
        norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        rope_base=theta, rope_scaling=scaling, qk_norm=True, ffn="moe",
        d_ff=hf["moe_intermediate_size"], dense_d_ff=hf["intermediate_size"],
        moe_every=hf["decoder_sparse_step"], first_k_dense=len(dense),
        n_experts=hf["num_local_experts"], top_k=hf["num_experts_per_tok"], score="softmax",
        norm_topk_prob=bool(hf["norm_topk_prob"]), **_TRAINING_ONLY)


def _qwen3_moe_to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_theta"))
    rope, max_pos = rope_parameters(f, hf.get("max_position_embeddings",
                                              _QWEN3_MOE["max_position_embeddings"]))
    hf.update(
        architectures=[QWEN3_MOE.architecture], model_type="qwen3_moe",
        vocab_size=f.vocab_size, hidden_size=f.d_model, num_hidden_layers=f.n_layers,
        num_attention_heads=f.n_heads, num_key_value_heads=f.n_kv_heads, head_dim=head_dim(f),
        hidden_act="silu", attention_bias=False, use_sliding_window=False,
        rms_norm_eps=f.norm_eps, tie_word_embeddings=f.tie_embeddings,
        max_position_embeddings=max_pos, rope_parameters=rope,
        intermediate_size=f.dense_d_ff or hf.get("intermediate_size", f.d_ff),
        moe_intermediate_size=f.d_ff, decoder_sparse_step=f.moe_every,
        mlp_only_layers=list(range(f.first_k_dense)),
        num_experts_per_tok=f.top_k, norm_topk_prob=f.norm_topk_prob, dtype=dtype_name)
    hf["num_experts" if "num_experts" in hf else "num_local_experts"] = f.n_experts
    return hf


def _qwen3_moe_check(f):
    """_QWEN3_MOE_NEEDS and every layer attention."""
    differ = differences(f, _QWEN3_MOE_NEEDS)
    if set(layer_kinds(f)) != {"A"}:
        differ["layer_pattern"] = "layer_pattern=None (every layer attention)"
    refuse(f, "qwen3_moe", differ)


def _qwen3_moe_claims(f):
    """GQA with QK-norm in every layer and an MoE of SwiGLU experts."""
    return (set(layer_kinds(f)) == {"A"} and f.attention == "gqa" and f.ffn == "moe"
            and f.experts == "swiglu" and f.qk_norm is True and not f.attn_sinks)


QWEN3_MOE = Family(
    "qwen3_moe", "Qwen3MoeForCausalLM", _qwen3_moe_from_hf, _qwen3_moe_to_hf, _qwen3_moe_claims,
    _qwen3_moe_check, names=lambda model, f: decoder_entries(
        model, "qwen3_moe", _QWEN3_MOE_LAYER, _QWEN3_MOE_EXPERTS))
