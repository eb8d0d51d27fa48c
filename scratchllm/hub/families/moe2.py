"""More Mixture-of-Experts families: qwen3_moe and deepseek_v2. No math here: the LM builds
them from the library's pairs (attention/gqa.py, attention/mla.py, moe/layer.py,
moe/router.py).

    qwen3_moe   qwen3's attention (GQA + RoPE, QK-norm over each head, explicit head_dim) and
                an MoE of SwiGLU experts in layer i when (i + 1) % decoder_sparse_step == 0
                and i is not in mlp_only_layers (else a dense SwiGLU of intermediate_size):
                softmax router, top-k of the probabilities, gates renormalised over the k
                when norm_topk_prob (else the chosen probabilities themselves), no shared
                expert                                   (Yang et al. 2025, arXiv 2505.09388)
    deepseek_v2 deepseek_v3's MLA (q_proj or q_a_proj -> q_a_layernorm -> q_b_proj; the
                latent kv_a_proj_with_mqa -> kv_a_layernorm -> kv_b_proj; RoPE always on
                (2i, 2i + 1) pairs, transformers' complex rotation; YaRN's mscale_all_dim in
                the softmax scale) and its layers (the first first_k_dense_replace dense),
                with DeepSeek-V2's router: softmax scores, top-k of the scores ("greedy")
                or inside the topk_group groups of highest max score
                ("group_limited_greedy": a group scores its best expert, group_top 1), the
                chosen scores times routed_scaling_factor, never renormalised (transformers
                reads no norm_topk_prob here), no selection bias; n_shared_experts shared
                experts as one SwiGLU           (DeepSeek-AI 2024, arXiv 2405.04434)

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
deepseek_v2's names are deepseek_v3's (moe.py) without e_score_correction_bias.
Glossary: D model width, E experts, F expert width, H heads.
"""
from scratchllm.hub.families.base import (DECODER_FIELDS, LAYER_NAMES, Family, decoder_entries,
                                          differences, fail_config, head_dim, layer_kinds, only,
                                          over, refuse, require, rope_of, rope_parameters,
                                          write_pad_id)
from scratchllm.hub.families.moe import (DEEPSEEK_EXPERTS, DEEPSEEK_LAYER, MLA_NORM_EPS,
                                         MOE_NEEDS, deepseek_check, moe_common,
                                         moe_common_to_hf)

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
        norm_topk_prob=bool(hf["norm_topk_prob"]), pad_id=hf.get("pad_token_id"),
        **_TRAINING_ONLY)  # pad_id: nn.Embedding(padding_idx=pad_token_id)


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
    return write_pad_id(hf, f)


def _qwen3_moe_check(f):
    """_QWEN3_MOE_NEEDS and every layer attention."""
    differ = differences(f, {**_QWEN3_MOE_NEEDS, "pad_id": f.pad_id})  # any pad id
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


# ---------------------------------------------------------------------------- deepseek_v2
_DEEPSEEK_V2 = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=2048,
                    rope_theta=10000.0, moe_intermediate_size=1407, n_shared_experts=2,
                    n_routed_experts=64, routed_scaling_factor=1.0, kv_lora_rank=512,
                    q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
                    qk_nope_head_dim=128, n_group=None, topk_group=None, topk_method="greedy",
                    first_k_dense_replace=0, num_key_value_heads=None)
_DEEPSEEK_V2_NEEDS = dict(MOE_NEEDS, score="softmax", mla_norm_eps=MLA_NORM_EPS,
                          norm_topk_prob=False, rope_style="interleaved", group_top=1,
                          bias_gamma=0.0)
_TOPK_METHODS = ("greedy", "group_limited_greedy")


def _deepseek_v2_from_hf(hf):
    require(hf, (*DECODER_FIELDS, "num_experts_per_tok"), "deepseek_v2")
    hf = {**_DEEPSEEK_V2, **hf}
    if "num_experts" in hf:  # its attribute_map's other name of n_routed_experts
        hf["n_routed_experts"] = hf["num_experts"]
    only(hf, dict(hidden_act="silu", attention_bias=False, mlp_bias=False, pretraining_tp=1),
         "deepseek_v2")
    H = hf["num_attention_heads"]
    if hf["num_key_value_heads"] not in (None, H):
        fail_config(f"num_key_value_heads = {hf['num_key_value_heads']!r} is not implemented for "
                    f"deepseek_v2 (MLA has num_attention_heads = {H} key heads)")
    if hf["topk_method"] not in _TOPK_METHODS:
        fail_config(f"topk_method = {hf['topk_method']!r} is not implemented for deepseek_v2 "
                    f"(only {list(_TOPK_METHODS)}, as transformers' DeepseekV2TopkRouter)")
    if not hf["n_shared_experts"]:
        fail_config("n_shared_experts = 0 is not implemented for deepseek_v2 (only >= 1)")
    grouped = hf["topk_method"] == "group_limited_greedy"
    return dict(
        moe_common(hf, "deepseek_v2"), attention="mla", n_kv_heads=H, mla_norm_eps=MLA_NORM_EPS,
        q_lora_rank=hf["q_lora_rank"] or 0, kv_lora_rank=hf["kv_lora_rank"],
        qk_nope_head_dim=hf["qk_nope_head_dim"], qk_rope_head_dim=hf["qk_rope_head_dim"],
        v_head_dim=hf["v_head_dim"], rope_style="interleaved", d_ff=hf["moe_intermediate_size"],
        dense_d_ff=hf["intermediate_size"], first_k_dense=hf["first_k_dense_replace"] or 0,
        n_experts=hf["n_routed_experts"], n_shared=hf["n_shared_experts"], score="softmax",
        n_group=hf["n_group"] if grouped else 1, topk_group=hf["topk_group"] if grouped else 1,
        group_top=1, norm_topk_prob=False,
        routed_scaling_factor=float(hf["routed_scaling_factor"]))


def _deepseek_v2_to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_theta", "head_dim", "num_experts"))
    moe_common_to_hf(f, hf, DEEPSEEK_V2, dtype_name, _DEEPSEEK_V2["max_position_embeddings"])
    dense = f.dense_d_ff or hf.get("intermediate_size", f.d_ff)  # kept when no layer is dense
    grouped = f.n_group > 1
    hf.update(intermediate_size=dense, moe_intermediate_size=f.d_ff,
              num_key_value_heads=f.n_heads, q_lora_rank=f.q_lora_rank or None,
              kv_lora_rank=f.kv_lora_rank, qk_nope_head_dim=f.qk_nope_head_dim,
              qk_rope_head_dim=f.qk_rope_head_dim, v_head_dim=f.v_head_dim,
              attention_bias=False, mlp_bias=False, first_k_dense_replace=f.first_k_dense,
              n_routed_experts=f.n_experts, n_shared_experts=f.n_shared,
              topk_method="group_limited_greedy" if grouped else "greedy",
              n_group=f.n_group if grouped else None,
              topk_group=f.topk_group if grouped else None, norm_topk_prob=False,
              routed_scaling_factor=f.routed_scaling_factor)
    return hf


DEEPSEEK_V2 = Family(
    "deepseek_v2", "DeepseekV2ForCausalLM", _deepseek_v2_from_hf, _deepseek_v2_to_hf,
    claims=lambda f: (set(layer_kinds(f)) == {"A"} and f.attention == "mla"
                      and f.experts == "swiglu" and f.score == "softmax"),
    check=deepseek_check(_DEEPSEEK_V2_NEEDS, "deepseek_v2"),
    names=lambda model, f: decoder_entries(
        model, "deepseek_v2", DEEPSEEK_LAYER, DEEPSEEK_EXPERTS))
