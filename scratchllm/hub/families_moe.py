"""The Mixture-of-Experts families of Hugging Face checkpoints: config.json -> ModelConfig
(`from_hf_config`) and back (`to_hf_config`) for Mixtral and DeepSeek-V3, on the helpers of
families.py (catalog.py chooses between the two modules). No math here: the LM builds them from the
library's pairs (attention/gqa.py, attention/mla.py, moe/layer.py, moe/router.py).

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
                 n_shared_experts * moe_intermediate_size      (DeepSeek-AI 2024, arXiv 2412.19437)

Training-only knobs. These configs have no field for the library's balance loss, z-loss or
aux-loss-free bias update (balance_coef, z_coef, bias_gamma; Mixtral's router_aux_loss_coef
weighs a loss averaged over all layers at once, and only with output_router_logits): a
loaded model has all three 0, as transformers' forward has no auxiliary loss, and
save_pretrained does not write them. The selection bias itself is DeepSeek-V3's
e_score_correction_bias, saved and loaded as that tensor, so a model trained with
bias_gamma > 0 keeps its routing; after loading, it changes only if bias_gamma is set again.
Mixtral has no such tensor, so a Mixtral-shaped config with bias_gamma > 0 does not save.

Where a field is absent from config.json, the transformers configuration class's default
applies (huggingface/transformers src/transformers/models/mixtral/configuration_mixtral.py,
src/transformers/models/deepseek_v3/configuration_deepseek_v3.py).
"""
from scratchllm.hub.families import _REQUIRED, EXTRA_FAMILIES, _fail, rope_of

FAMILIES = ("mixtral", "deepseek_v3")
ARCHITECTURES = {"mixtral": "MixtralForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM"}
_DEFAULTS = {  # transformers' defaults for the fields that change the math
    "mixtral": dict(rms_norm_eps=1e-5, tie_word_embeddings=False, head_dim=None,
                    sliding_window=None, max_position_embeddings=4096 * 32, rope_theta=1e6,
                    num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2,
                    hidden_act="silu"),
    "deepseek_v3": dict(rms_norm_eps=1e-6, tie_word_embeddings=False,
                        max_position_embeddings=4096, rope_theta=10000.0,
                        moe_intermediate_size=2048, n_shared_experts=1, n_routed_experts=256,
                        routed_scaling_factor=2.5, kv_lora_rank=512, q_lora_rank=1536,
                        qk_rope_head_dim=64, v_head_dim=128, qk_nope_head_dim=128, n_group=8,
                        topk_group=4, num_experts_per_tok=8, first_k_dense_replace=3,
                        norm_topk_prob=True, rope_interleave=True, attention_bias=False,
                        hidden_act="silu"),
}
# HF's DeepseekV3RMSNorm(q_lora_rank) and (kv_lora_rank) keep their default eps, whatever
# rms_norm_eps says; the library's MLA norms use norm_eps, so the two must agree.
MLA_NORM_EPS = 1e-6
_TRAINING_ONLY = dict(balance_coef=0.0, z_coef=0.0, bias_gamma=0.0)


def moe_family(cfg):
    """The family of this module a ModelConfig saves as (None for any other config):
    deepseek_v3 for MLA attention, mixtral for an MoE FFN of SwiGLU experts; hybrid layer
    patterns and gpt-oss (sinks, clamped experts: families_gpt_oss.py) are not theirs."""
    if (cfg.layer_pattern or cfg.name in EXTRA_FAMILIES or cfg.experts != "swiglu"
            or cfg.attn_sinks):
        return None
    if cfg.attention == "mla":
        return "deepseek_v3"
    return "mixtral" if cfg.ffn == "moe" else None


def from_hf_config(hf):
    """ModelConfig fields (a dict) of a mixtral or deepseek_v3 config.json dict; ValueError
    naming the field for an option the library does not implement."""
    family = hf["model_type"]
    missing = [k for k in _REQUIRED if k not in hf]
    if missing:
        _fail(f"missing field(s) {missing} (model_type {family!r})")
    hf = {**_DEFAULTS[family], **hf}
    fixed = {"hidden_act": "silu"} if family == "mixtral" else {
        "hidden_act": "silu", "attention_bias": False, "rms_norm_eps": MLA_NORM_EPS}
    for field, value in fixed.items():
        if hf[field] != value:
            why = (" for every RMSNorm: transformers' q_a_layernorm and kv_a_layernorm keep "
                   "eps 1e-6 whatever rms_norm_eps is") if field == "rms_norm_eps" else ""
            _fail(f"{field} = {hf[field]!r} is not implemented for {family} (only "
                  f"{value!r}{why})")
    theta, scaling = rope_of(hf)
    H = hf["num_attention_heads"]
    common = dict(name=family, vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
                  n_layers=hf["num_hidden_layers"], n_heads=H,
                  norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(
                      hf["tie_word_embeddings"]), rope_base=theta, rope_scaling=scaling,
                  ffn="moe", top_k=hf["num_experts_per_tok"], **_TRAINING_ONLY)
    if family == "mixtral":
        head_dim = hf["head_dim"]
        return dict(common, n_kv_heads=hf["num_key_value_heads"] or H,
                    d_ff=hf["intermediate_size"], window=hf["sliding_window"],
                    head_dim=None if head_dim in (None, hf["hidden_size"] // H) else head_dim,
                    n_experts=hf["num_local_experts"], score="softmax")
    if not hf["n_shared_experts"]:
        _fail("n_shared_experts = 0 is not implemented for deepseek_v3 (only >= 1)")
    return dict(
        common, attention="mla", n_kv_heads=H, q_lora_rank=hf["q_lora_rank"] or 0,
        kv_lora_rank=hf["kv_lora_rank"], qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"],
        rope_style="interleaved" if hf["rope_interleave"] else "half",
        d_ff=hf["moe_intermediate_size"], dense_d_ff=hf["intermediate_size"],
        first_k_dense=hf["first_k_dense_replace"] or 0, n_experts=hf["n_routed_experts"],
        n_shared=hf["n_shared_experts"], score="sigmoid", n_group=hf["n_group"] or 1,
        topk_group=hf["topk_group"] or 1, norm_topk_prob=bool(hf["norm_topk_prob"]),
        routed_scaling_factor=float(hf["routed_scaling_factor"]))


_BOTH = dict(ffn="moe", positions="rope", norm="rmsnorm", block="pre", n_sink=0, o_bias=False,
             qkv_bias=False, qk_norm=False, layer_types=None, embed_scale=False,
             norm_offset=0.0, attn_scale=None, capacity_factor=None, router_bias=False,
             moe_every=1)
_NEEDS = {
    "mixtral": dict(_BOTH, score="softmax", n_shared=0, n_group=1, topk_group=1,
                    norm_topk_prob=True, routed_scaling_factor=1.0, first_k_dense=0,
                    rope_style="half", bias_gamma=0.0),
    "deepseek_v3": dict(_BOTH, score="sigmoid", norm_eps=MLA_NORM_EPS),
}


def family_of(cfg):
    """mixtral or deepseek_v3 for a config moe_family names; ValueError naming every option
    of cfg that the family cannot express (e.g. capacity_factor: HF drops no tokens)."""
    family = moe_family(cfg)
    needs = _NEEDS[family]
    differ = {k: f"{k}={v!r}" for k, v in needs.items() if getattr(cfg, k) != v}
    if family == "deepseek_v3" and cfg.n_shared < 1:  # HF always has a shared expert
        differ["n_shared"] = "n_shared >= 1"
    if differ:
        got = ", ".join(f"{k}={getattr(cfg, k)!r}" for k in differ)
        want = ", ".join(differ.values())
        raise ValueError(f"save_pretrained: config {cfg.name!r} is {family}-shaped, but "
                         f"{family} cannot express {got} (it needs {want})")
    return family


def _rope_parameters(cfg, max_pos):
    """(rope_parameters, max_position_embeddings) for config.json: HF's dynamic NTK reads its
    original length from max_position_embeddings."""
    scaling = dict(cfg.rope_scaling or {"rope_type": "default"})
    if scaling.get("rope_type") == "dynamic":
        max_pos = scaling.pop("original_max_position_embeddings")
    return {**scaling, "rope_theta": cfg.rope_base}, max_pos


def to_hf_config(cfg, dtype_name, base=None):
    """A config.json dict for a mixtral- or deepseek_v3-shaped ModelConfig, over `base` (the
    loaded config.json, whose token ids and other unused fields survive a round trip)."""
    family = family_of(cfg)
    hf = dict(base or {})
    for key in ("rope_scaling", "rope_theta", "torch_dtype", "transformers_version"):
        hf.pop(key, None)
    rope, max_pos = _rope_parameters(cfg, hf.get("max_position_embeddings", _DEFAULTS[
        family]["max_position_embeddings"]))
    hf.update(architectures=[ARCHITECTURES[family]], model_type=family,
              vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
              num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
              hidden_act="silu", rms_norm_eps=cfg.norm_eps,
              tie_word_embeddings=cfg.tie_embeddings, max_position_embeddings=max_pos,
              rope_parameters=rope, num_experts_per_tok=cfg.top_k, dtype=dtype_name)
    if family == "mixtral":
        hf.update(intermediate_size=cfg.d_ff, num_key_value_heads=cfg.n_kv_heads,
                  head_dim=cfg.dh, sliding_window=cfg.window, num_local_experts=cfg.n_experts)
        return hf
    hf.pop("head_dim", None)  # transformers sets it to qk_rope_head_dim
    hf.update(intermediate_size=cfg.dense_d_ff or cfg.d_ff, moe_intermediate_size=cfg.d_ff,
              num_key_value_heads=cfg.n_heads, q_lora_rank=cfg.q_lora_rank or None,
              kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
              qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
              rope_interleave=cfg.rope_style == "interleaved", attention_bias=False,
              first_k_dense_replace=cfg.first_k_dense, n_routed_experts=cfg.n_experts,
              n_shared_experts=cfg.n_shared, n_group=cfg.n_group, topk_group=cfg.topk_group,
              norm_topk_prob=cfg.norm_topk_prob,
              routed_scaling_factor=cfg.routed_scaling_factor,
              num_nextn_predict_layers=0)  # the library has no multi-token-prediction layers
    return hf
