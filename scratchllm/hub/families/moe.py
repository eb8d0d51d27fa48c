"""The Mixture-of-Experts families: mixtral and deepseek_v3. No math here: the LM builds them
from the library's pairs (attention/gqa.py, attention/mla.py, moe/layer.py, moe/router.py).

    mixtral      llama (RMSNorm pre-norm, GQA + RoPE), a sliding window of sliding_window
                 keys when it is set, and in every layer a top-k MoE of SwiGLU experts
                 (w1 gate, w3 up, w2 down): softmax router, top-k of the probabilities,
                 gates renormalised over the chosen k      (Jiang et al. 2024, arXiv 2401.04088)
    deepseek_v3  MLA: q_proj, or q_a_proj -> q_a_layernorm -> q_b_proj when q_lora_rank is
                 set; kv_a_proj_with_mqa -> kv_a_layernorm -> kv_b_proj; RoPE on the
                 qk_rope_head_dim part, in (2i, 2i + 1) pairs when rope_interleave; YaRN
                 with mscale_all_dim in the softmax scale. The first first_k_dense_replace
                 layers have a dense SwiGLU of intermediate_size, the others an MoE of
                 moe_intermediate_size experts: sigmoid scores, e_score_correction_bias added
                 for the choice only, group-limited (n_group, topk_group), norm_topk_prob,
                 routed_scaling_factor, and n_shared_experts shared experts, one SwiGLU of
                 n_shared_experts * moe_intermediate_size      (DeepSeek-AI 2024, arXiv 2412.19437);
                 num_nextn_predict_layers MTP layers after the trunk (deepseek_mtp.py)

Training-only knobs. These configs have no field for the library's balance loss, z-loss or
aux-loss-free bias update (balance_coef, z_coef, bias_gamma; Mixtral's router_aux_loss_coef
weighs a loss averaged over all layers at once, and only with output_router_logits): a
loaded model has all three 0, as transformers' forward has no auxiliary loss, and
save_pretrained does not write them. The selection bias itself is DeepSeek-V3's
e_score_correction_bias, saved and loaded as that tensor, so a model trained with
bias_gamma > 0 keeps its routing; after loading, it changes only if bias_gamma is set again.
Mixtral has no such tensor, so a Mixtral-shaped config with bias_gamma > 0 does not save.

Names: the library stacks the experts of a layer into one Param per matrix (w1, w3 (E, D, F),
w2 (E, F, D)); the checkpoints hold one tensor per expert, so expert e is the slice [e] of a
stacked Param, as transformers' save_pretrained writes them (transformers 5 fuses them in
memory only). Attention, norms, embedding and head as llama's (base.py), "T" transposed:

    library                         mixtral: model.layers.i.block_sparse_moe.
    ffn.w_router (D, E)             gate.weight (E, D)                                  T
    ffn.w1[e] / w3[e] (D, F)        experts.e.w1.weight / experts.e.w3.weight (F, D)    T
    ffn.w2[e] (F, D)                experts.e.w2.weight (D, F)                          T

    library                         deepseek_v3: model.layers.i.
    mixer.wq (D, H(dn+dr))          self_attn.q_proj.weight                (q_lora_rank null) T
    mixer.wq_a (D, Dq)              self_attn.q_a_proj.weight                               T
    mixer.q_norm (Dq,)              self_attn.q_a_layernorm.weight
    mixer.wq_b (Dq, H(dn+dr))       self_attn.q_b_proj.weight                               T
    mixer.wkv_a (D, Dc+dr)          self_attn.kv_a_proj_with_mqa.weight                     T
    mixer.kv_norm (Dc,)             self_attn.kv_a_layernorm.weight
    mixer.wkv_b (Dc, H(dn+dv))      self_attn.kv_b_proj.weight                              T
    mixer.wo (H dv, D)              self_attn.o_proj.weight                                 T
    ffn.W1 / W3 / W2                mlp.gate_proj / up_proj / down_proj.weight  (dense)     T
    ffn.w_router (D, E)             mlp.gate.weight (E, D)                                  T
    ffn.selection_bias (E,)         mlp.gate.e_score_correction_bias (a buffer: no gradient)
    ffn.w1[e] / w3[e] / w2[e]       mlp.experts.e.gate_proj / up_proj / down_proj.weight    T
    ffn.shared_w1 / w3 / w2         mlp.shared_experts.gate_proj / up_proj / down_proj.weight T
Both split their heads the library's way: q per head [nope | rope], kv_a [latent | rope],
kv_b per head [k_nope | v].

Reference: huggingface/transformers src/transformers/models/mixtral/configuration_mixtral.py,
src/transformers/models/deepseek_v3/configuration_deepseek_v3.py (the defaults below).
Glossary: D model width, E experts, F expert width, H heads, dn / dr / dv the nope / rope /
value head dims, Dc kv_lora_rank, Dq q_lora_rank.
"""
from scratchllm.hub.families.base import (DECODER_FIELDS, LAYER_NAMES, Family, decoder_entries,
                                          differences, fail_config, head_dim, layer_kinds, only,
                                          over, refuse, require, rope_of, rope_parameters,
                                          write_pad_id)
from scratchllm.hub.families.deepseek_mtp import mtp_entries, mtp_layers
from scratchllm.hub.layout import Entry

_MIXTRAL = dict(rms_norm_eps=1e-5, tie_word_embeddings=False, head_dim=None,
                sliding_window=None, max_position_embeddings=4096 * 32, rope_theta=1e6,
                num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                hidden_act="silu")
_DEEPSEEK = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=4096,
                 rope_theta=10000.0, moe_intermediate_size=2048, n_shared_experts=1,
                 n_routed_experts=256, routed_scaling_factor=2.5, kv_lora_rank=512,
                 q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128,
                 n_group=8, topk_group=4, num_experts_per_tok=8, first_k_dense_replace=3,
                 norm_topk_prob=True, rope_interleave=True, attention_bias=False,
                 hidden_act="silu", num_nextn_predict_layers=1)
# HF's DeepseekV3RMSNorm(q_lora_rank) and (kv_lora_rank) keep their default eps, whatever
# rms_norm_eps says: the library's MLA norms take it as mla_norm_eps.
MLA_NORM_EPS = 1e-6
_TRAINING_ONLY = dict(balance_coef=0.0, z_coef=0.0, bias_gamma=0.0)
MOE_NEEDS = dict(ffn="moe", positions="rope", norm="rmsnorm", block="pre", n_sink=0,
             attn_softcap=None, logit_softcap=None,
             attn_sinks=False, o_bias=False, qkv_bias=False, qk_norm=False, layer_types=None,
             embed_scale=False, norm_offset=0.0, attn_scale=None, capacity_factor=None,
             experts="swiglu", router_bias=False, moe_every=1)
_MIXTRAL_NEEDS = dict(MOE_NEEDS, score="softmax", n_shared=0, n_group=1, topk_group=1,
                      norm_topk_prob=True, routed_scaling_factor=1.0, first_k_dense=0,
                      rope_style="half", bias_gamma=0.0)
_DEEPSEEK_NEEDS = dict(MOE_NEEDS, score="sigmoid", mla_norm_eps=MLA_NORM_EPS, group_top=2)
DEEPSEEK_LAYER = dict(LAYER_NAMES, **{
    "mixer.wq": ("self_attn.q_proj.weight", True),
    "mixer.wq_a": ("self_attn.q_a_proj.weight", True),
    "mixer.q_norm": ("self_attn.q_a_layernorm.weight", False),
    "mixer.wq_b": ("self_attn.q_b_proj.weight", True),
    "mixer.wkv_a": ("self_attn.kv_a_proj_with_mqa.weight", True),
    "mixer.kv_norm": ("self_attn.kv_a_layernorm.weight", False),
    "mixer.wkv_b": ("self_attn.kv_b_proj.weight", True),
    "mixer.wo": ("self_attn.o_proj.weight", True),
    "ffn.w_router": ("mlp.gate.weight", True),
    "ffn.shared_w1": ("mlp.shared_experts.gate_proj.weight", True),
    "ffn.shared_w3": ("mlp.shared_experts.up_proj.weight", True),
    "ffn.shared_w2": ("mlp.shared_experts.down_proj.weight", True)})
DEEPSEEK_EXPERTS = ("mlp.experts", {"ffn.w1": "gate_proj", "ffn.w3": "up_proj",
                                     "ffn.w2": "down_proj"})
_BIAS = "mlp.gate.e_score_correction_bias"  # deepseek_v3's selection bias (a buffer)


def _attention_only(f):
    """Every layer is attention (the MoE families have no other mixer)."""
    return set(layer_kinds(f)) == {"A"}


def moe_differences(f, needs):
    """differences(f, needs) (any pad_id: transformers' padding_idx), and a layer_pattern
    with other mixers than attention."""
    differ = differences(f, {**needs, "pad_id": f.pad_id})
    if not _attention_only(f):
        differ["layer_pattern"] = "layer_pattern=None (every layer attention)"
    return differ


def moe_common(hf, family):
    """The flat fields both families read the same way (hf with its defaults applied)."""
    theta, scaling = rope_of(hf)
    return dict(name=family, vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
                n_layers=hf["num_hidden_layers"], n_heads=hf["num_attention_heads"],
                norm_eps=float(hf["rms_norm_eps"]),
                tie_embeddings=bool(hf["tie_word_embeddings"]), rope_base=theta,
                rope_scaling=scaling, ffn="moe", top_k=hf["num_experts_per_tok"],
                pad_id=hf.get("pad_token_id"),  # nn.Embedding(padding_idx=pad_token_id)
                **_TRAINING_ONLY)


def moe_common_to_hf(f, hf, family, dtype_name, max_pos):
    """hf (over the loaded config.json) with the fields both families write the same way;
    max_pos the family's default max_position_embeddings."""
    rope, max_pos = rope_parameters(f, hf.get("max_position_embeddings", max_pos))
    hf.update(architectures=[family.architecture], model_type=family.model_type,
              vocab_size=f.vocab_size, hidden_size=f.d_model, num_hidden_layers=f.n_layers,
              num_attention_heads=f.n_heads, hidden_act="silu", rms_norm_eps=f.norm_eps,
              tie_word_embeddings=f.tie_embeddings, max_position_embeddings=max_pos,
              rope_parameters=rope, num_experts_per_tok=f.top_k, dtype=dtype_name)
    return write_pad_id(hf, f)


# ---------------------------------------------------------------------------- mixtral
_MIXTRAL_LAYER = dict(LAYER_NAMES, **{"ffn.w_router": ("block_sparse_moe.gate.weight", True)})
_MIXTRAL_EXPERTS = ("block_sparse_moe.experts", {"ffn.w1": "w1", "ffn.w3": "w3", "ffn.w2": "w2"})


def _mixtral_from_hf(hf):
    require(hf, DECODER_FIELDS, "mixtral")
    hf = {**_MIXTRAL, **hf}
    only(hf, dict(hidden_act="silu"), "mixtral")
    H, D = hf["num_attention_heads"], hf["hidden_size"]
    return dict(moe_common(hf, "mixtral"), n_kv_heads=hf["num_key_value_heads"] or H,
                d_ff=hf["intermediate_size"], window=hf["sliding_window"],
                head_dim=None if hf["head_dim"] in (None, D // H) else hf["head_dim"],
                n_experts=hf["num_local_experts"], score="softmax")


def _mixtral_to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_theta"))
    moe_common_to_hf(f, hf, MIXTRAL, dtype_name, _MIXTRAL["max_position_embeddings"])
    hf.update(intermediate_size=f.d_ff, num_key_value_heads=f.n_kv_heads, head_dim=head_dim(f),
              sliding_window=f.window, num_local_experts=f.n_experts)
    return hf


def _mixtral_claims(f):
    """GQA attention (without QK-norm: qwen3_moe's) in every layer and an MoE of SwiGLU
    experts."""
    return (_attention_only(f) and f.attention == "gqa" and f.ffn == "moe"
            and f.experts == "swiglu" and not f.attn_sinks and not f.qk_norm
            and not f.moe_gate_input)  # llama4_text's


MIXTRAL = Family(
    "mixtral", "MixtralForCausalLM", _mixtral_from_hf, _mixtral_to_hf, _mixtral_claims,
    check=lambda f: refuse(f, "mixtral", moe_differences(f, _MIXTRAL_NEEDS)),
    names=lambda model, f: decoder_entries(model, "mixtral", _MIXTRAL_LAYER, _MIXTRAL_EXPERTS))


# ---------------------------------------------------------------------------- deepseek_v3
def _deepseek_from_hf(hf):
    require(hf, DECODER_FIELDS, "deepseek_v3")
    hf = {**_DEEPSEEK, **hf}
    only(hf, dict(hidden_act="silu", attention_bias=False), "deepseek_v3")
    if not hf["n_shared_experts"]:
        fail_config("n_shared_experts = 0 is not implemented for deepseek_v3 (only >= 1)")
    return dict(
        moe_common(hf, "deepseek_v3"), attention="mla", n_kv_heads=hf["num_attention_heads"],
        mla_norm_eps=MLA_NORM_EPS,
        q_lora_rank=hf["q_lora_rank"] or 0, kv_lora_rank=hf["kv_lora_rank"],
        qk_nope_head_dim=hf["qk_nope_head_dim"], qk_rope_head_dim=hf["qk_rope_head_dim"],
        v_head_dim=hf["v_head_dim"], rope_style="interleaved" if hf["rope_interleave"] else
        "half", d_ff=hf["moe_intermediate_size"], dense_d_ff=hf["intermediate_size"],
        first_k_dense=hf["first_k_dense_replace"] or 0, n_experts=hf["n_routed_experts"],
        n_shared=hf["n_shared_experts"], score="sigmoid", n_group=hf["n_group"] or 1,
        topk_group=hf["topk_group"] or 1, norm_topk_prob=bool(hf["norm_topk_prob"]),
        routed_scaling_factor=float(hf["routed_scaling_factor"]),
        mtp_depth=hf["num_nextn_predict_layers"] or 0)  # those held: deepseek_mtp.mtp_layers


def _deepseek_to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_theta", "head_dim"))  # HF: head_dim = rope part
    moe_common_to_hf(f, hf, DEEPSEEK_V3, dtype_name, _DEEPSEEK["max_position_embeddings"])
    dense = f.dense_d_ff or hf.get("intermediate_size", f.d_ff)  # kept when no layer is dense
    hf.update(intermediate_size=dense, moe_intermediate_size=f.d_ff,
              num_key_value_heads=f.n_heads, q_lora_rank=f.q_lora_rank or None,
              kv_lora_rank=f.kv_lora_rank, qk_nope_head_dim=f.qk_nope_head_dim,
              qk_rope_head_dim=f.qk_rope_head_dim, v_head_dim=f.v_head_dim,
              rope_interleave=f.rope_style == "interleaved", attention_bias=False,
              first_k_dense_replace=f.first_k_dense, n_routed_experts=f.n_experts,
              n_shared_experts=f.n_shared, n_group=f.n_group, topk_group=f.topk_group,
              norm_topk_prob=f.norm_topk_prob, routed_scaling_factor=f.routed_scaling_factor,
              num_nextn_predict_layers=f.mtp_depth)  # MTP layers: deepseek_mtp.py
    return hf


def deepseek_check(needs, family, mtp=False):
    """The check of a DeepSeek family: `needs`, every layer attention, and a shared expert
    (HF always has one); with mtp, any number of MTP layers (deepseek_mtp.py)."""
    def check(f):
        differ = moe_differences(f, needs)
        if mtp:
            differ.pop("mtp_depth", None)
        if f.n_group == 1:  # without groups the group score plays no part
            differ.pop("group_top", None)
        if f.n_shared < 1:
            differ["n_shared"] = "n_shared >= 1"
        refuse(f, family, differ)
    return check


def _deepseek_names(model, f):
    """Every Param, and each MoE layer's selection bias (a buffer: e_score_correction_bias)."""
    out = decoder_entries(model, "deepseek_v3", DEEPSEEK_LAYER, DEEPSEEK_EXPERTS)
    return out + [Entry(f"model.layers.{name.split('.')[1]}.{_BIAS}", (name,), False,
                        buffer=True) for name, _ in model.named_buffers()
                  if name.startswith("layers.")] + mtp_entries(
        model, f, DEEPSEEK_LAYER, DEEPSEEK_EXPERTS, _BIAS)  # deepseek_mtp.py


def _deepseek_claims(f):
    """MLA attention in every layer (dense or MoE FFNs of SwiGLU experts), scores not softmax
    (deepseek_v2's)."""
    return (_attention_only(f) and f.attention == "mla" and f.experts == "swiglu"
            and not f.attn_sinks and f.score != "softmax"
            and f.index_topk is None)  # deepseek_v32's


DEEPSEEK_V3 = Family("deepseek_v3", "DeepseekV3ForCausalLM", _deepseek_from_hf,
                     _deepseek_to_hf, _deepseek_claims,
                     deepseek_check(_DEEPSEEK_NEEDS, "deepseek_v3", mtp=True), _deepseek_names,
                     mtp_layers=mtp_layers)
