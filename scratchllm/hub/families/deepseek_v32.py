"""DeepSeek-V3.2, deepseek_v32 (DeepseekV32ForCausalLM): deepseek_v3's model (moe.py: MLA
with q_lora_rank, dense then MoE layers of sigmoid scores with a selection bias, groups,
shared experts) with DeepSeek Sparse Attention in every layer: a lightning indexer picks
each query's index_topk keys and MLA attends to those only (the library's MLASpec.indexer,
attention/dsa.py; flat index_topk, index_n_heads, index_head_dim). No math here.

What transformers' DeepseekV32Attention fixes, and the library with it: RoPE in (2i, 2i + 1)
pairs for MLA (there is no rope_interleave field) and rotate-half in the indexer; the query
always through q_a_proj (q_lora_rank must be set: the indexer reads its latent); the
indexer's key LayerNorm with eps 1e-6. The indexer runs under no_grad there, and its choice
is discrete here: the gradient of the LM's output in its weights is 0 on both sides.

Names: deepseek_v3's (moe.py), and in model.layers.i.self_attn.indexer. ("T" transposed):

    library                       transformers
    mixer.idx_wq (Dq, HI*DI)      wq_b.weight (HI*DI, Dq)                  T
    mixer.idx_wk (D, DI)          wk.weight (DI, D)                        T
    mixer.idx_k_norm / _b (DI,)   k_norm.weight / k_norm.bias
    mixer.idx_w (D, HI)           weights_proj.weight (HI, D)              T

Reference: huggingface/transformers
src/transformers/models/deepseek_v32/modeling_deepseek_v32.py (DeepseekV32Indexer,
DeepseekV32Attention), src/transformers/models/deepseek_v32/configuration_deepseek_v32.py
(the defaults); deepseek-ai/DeepSeek-V3.2-Exp inference/model.py.
Glossary: D model width, Dq q_lora_rank, HI indexer heads, DI indexer head dim.
"""
from scratchllm.hub.families.base import (DECODER_FIELDS, Family, decoder_entries, fail_config,
                                          refuse, require)
from scratchllm.hub.families.moe import (DEEPSEEK_EXPERTS, DEEPSEEK_LAYER, DEEPSEEK_V3,
                                         MLA_NORM_EPS, MOE_NEEDS, moe_differences)
from scratchllm.hub.layout import Entry

_DEFAULTS = dict(max_position_embeddings=163840, index_topk=2048, index_head_dim=128,
                 index_n_heads=64, first_k_dense_replace=3, mlp_layer_types=None,
                 layer_types=None, q_lora_rank=1536)
_NEEDS = dict(MOE_NEEDS, score="sigmoid", mla_norm_eps=MLA_NORM_EPS, group_top=2,
              rope_style="interleaved")
_LAYER = dict(DEEPSEEK_LAYER, **{
    "mixer.idx_wq": ("self_attn.indexer.wq_b.weight", True),
    "mixer.idx_wk": ("self_attn.indexer.wk.weight", True),
    "mixer.idx_k_norm": ("self_attn.indexer.k_norm.weight", False),
    "mixer.idx_k_norm_b": ("self_attn.indexer.k_norm.bias", False),
    "mixer.idx_w": ("self_attn.indexer.weights_proj.weight", True)})
_BIAS = "mlp.gate.e_score_correction_bias"  # the selection bias (a buffer), as deepseek_v3's


def _from_hf(hf):
    require(hf, DECODER_FIELDS, "deepseek_v32")
    hf = {**_DEFAULTS, **hf}
    if not hf["q_lora_rank"]:
        fail_config(f"q_lora_rank = {hf['q_lora_rank']!r} is not implemented for deepseek_v32 "
                    f"(its attention always has q_a_proj, whose latent the indexer reads)")
    L = hf["num_hidden_layers"]
    types = list(hf["layer_types"] or ["indexed_attention"] * L)
    if set(types) != {"indexed_attention"}:
        fail_config(f"layer_types = {types!r} is not implemented for deepseek_v32 (only "
                    f"'indexed_attention')")
    mlp = list(hf["mlp_layer_types"] or ["dense"] * min(hf["first_k_dense_replace"], L)
               + ["sparse"] * max(L - hf["first_k_dense_replace"], 0))
    k = mlp.count("dense")
    if mlp != ["dense"] * k + ["sparse"] * (L - k):
        fail_config(f"mlp_layer_types = {mlp!r} is not implemented for deepseek_v32 (only "
                    f"dense layers first, then sparse ones)")
    flat = DEEPSEEK_V3.from_hf({**hf, "rope_interleave": True, "first_k_dense_replace": k,
                                "num_nextn_predict_layers": 0})  # no MTP layers here
    return dict(flat, name="deepseek_v32", index_topk=hf["index_topk"],
                index_n_heads=hf["index_n_heads"], index_head_dim=hf["index_head_dim"])


def _mlp_types(f):
    """mlp_layer_types of the flat view f: "sparse" where a layer has an MoE."""
    if f.ffn != "moe":
        return ["dense"] * f.n_layers
    offset = f.moe_every - 1 if f.moe_offset is None else f.moe_offset
    return ["sparse" if i >= f.first_k_dense and i % f.moe_every == offset else "dense"
            for i in range(f.n_layers)]


def _to_hf(f, dtype_name, base=None):
    hf = DEEPSEEK_V3.to_hf(f, dtype_name, base)
    mlp = _mlp_types(f)
    for key in ("rope_interleave", "num_nextn_predict_layers"):  # deepseek_v3's fields
        hf.pop(key, None)
    hf.update(architectures=[DEEPSEEK_V32.architecture], model_type="deepseek_v32",
              head_dim=f.qk_rope_head_dim, index_topk=f.index_topk,
              index_n_heads=f.index_n_heads, index_head_dim=f.index_head_dim,
              layer_types=["indexed_attention"] * f.n_layers, mlp_layer_types=mlp,
              first_k_dense_replace=mlp.count("dense"))
    return hf


def _check(f):
    """deepseek_v3's needs with interleaved RoPE, a query latent, an indexer, a shared
    expert, and the MoE layers after the dense ones (in whatever moe_every pattern the flat
    names found for them)."""
    differ = moe_differences(f, dict(_NEEDS, index_topk=f.index_topk))
    mlp = _mlp_types(f)
    if mlp == sorted(mlp):  # "dense" ... "sparse": the flat pattern is free
        differ.pop("moe_every", None)
    if f.n_group == 1:  # without groups the group score plays no part
        differ.pop("group_top", None)
    for name, bad, needs in (("n_shared", f.n_shared < 1, "n_shared >= 1"),
                             ("q_lora_rank", not f.q_lora_rank, "q_lora_rank > 0"),
                             ("index_topk", f.index_topk is None, "index_topk set")):
        if bad:
            differ[name] = needs
    refuse(f, "deepseek_v32", differ)


def _names(model, f):
    """Every Param, and each MoE layer's selection bias (a buffer: e_score_correction_bias)."""
    out = decoder_entries(model, "deepseek_v32", _LAYER, DEEPSEEK_EXPERTS)
    return out + [Entry(f"model.layers.{name.split('.')[1]}.{_BIAS}", (name,), False,
                        buffer=True) for name, _ in model.named_buffers()]


DEEPSEEK_V32 = Family(
    "deepseek_v32", "DeepseekV32ForCausalLM", _from_hf, _to_hf,
    claims=lambda f: f.attention == "mla" and f.index_topk is not None, check=_check,
    names=_names)
