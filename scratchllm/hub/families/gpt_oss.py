"""The gpt_oss family (OpenAI's gpt-oss). No math here: every piece is an option of the
library's pairs.

    attention  GQA with biases on q, k, v and o, and a learned sink logit per head (a softmax
               column with no value: sdpa_forward / flash_sdpa_forward `sinks=`);
               layer_types alternate sliding_attention (window W) and full_attention; RoPE
               with YaRN (truncate: false), the same on both kinds of layer
    MoE        on every layer: logits s = x W_r + b_r, top-k of s, gates softmax(s_K)
               (router_forward with b_router, softmax scores, norm_topk_prob);
               experts with biases, gate/up columns interleaved in gate_up_proj, clamped SwiGLU
               (gate = min(gate, limit), up = clip(up, -limit, limit),
               e = (gate sigmoid(alpha gate) (up + 1)) W_down + b_down: clamped_swiglu_forward)
    norms      RMSNorm pre-norm (gain g), untied head by default

Names (model.layers.i. prefix; the rest as llama's: base.py's LAYER_NAMES):

    library                         transformers (gpt_oss)
    mixer.sinks (H,)                self_attn.sinks (H,)
    mixer.bo (D,)                   self_attn.o_proj.bias
    ffn.w_router (D, E)             mlp.router.weight (E, D)                     T
    ffn.b_router (E,)               mlp.router.bias
    ffn.gate_up (E, D, 2F)          mlp.experts.gate_up_proj (E, D, 2F)  both interleaved:
                                    column 2f is gate f, column 2f + 1 is up f
    ffn.gate_up_b (E, 2F)           mlp.experts.gate_up_proj_bias
    ffn.down (E, F, D)              mlp.experts.down_proj
    ffn.down_b (E, D)               mlp.experts.down_proj_bias
The experts are stored (in, out) as the library stores them, so only the router transposes.
MoE losses: transformers adds router_aux_loss_coef times its balance loss only with
output_router_logits; the config's balance_coef follows that, and z_coef is 0.

Reference: huggingface/transformers src/transformers/models/gpt_oss/modeling_gpt_oss.py and
configuration_gpt_oss.py (the defaults below).
Glossary: D model width, H query heads, E experts, F expert hidden width, W window.
"""
from scratchllm.hub.families.base import (DECODER_FIELDS, LAYER_NAMES, Family, decoder_entries,
                                          differences, head_dim, over, refuse, require, rope_of,
                                          write_pad_id)

_DEFAULTS = dict(num_local_experts=128, num_experts_per_tok=4, head_dim=64,
                 num_key_value_heads=8, sliding_window=128, tie_word_embeddings=False,
                 rms_norm_eps=1e-5, swiglu_alpha=1.702, swiglu_limit=7.0, attention_bias=True,
                 router_aux_loss_coef=0.001, output_router_logits=False,
                 max_position_embeddings=131072)
_DEFAULT_ROPE = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                     truncate=False, original_max_position_embeddings=4096,
                     rope_theta=150000.0)
_NEEDS = dict(attention="gqa", positions="rope", rope_style="half", attn_sinks=True,
              qk_norm=False, n_sink=0, block="pre", attn_softcap=None,
              logit_softcap=None, norm="rmsnorm", norm_offset=0.0,
              embed_scale=False, attn_scale=None, layer_pattern=None, ffn="moe", moe_every=1,
              experts="clamped", router_bias=True, score="softmax", norm_topk_prob=True,
              n_shared=0, capacity_factor=None, n_group=1, routed_scaling_factor=1.0,
              rope_local_base=None, bias_gamma=0.0, z_coef=0.0)
_LAYER = dict({k: v for k, v in LAYER_NAMES.items() if not k.startswith("ffn.")}, **{
    "mixer.sinks": ("self_attn.sinks", False), "mixer.bo": ("self_attn.o_proj.bias", False),
    "ffn.w_router": ("mlp.router.weight", True), "ffn.b_router": ("mlp.router.bias", False),
    "ffn.gate_up": ("mlp.experts.gate_up_proj", False),
    "ffn.gate_up_b": ("mlp.experts.gate_up_proj_bias", False),
    "ffn.down": ("mlp.experts.down_proj", False),
    "ffn.down_b": ("mlp.experts.down_proj_bias", False)})


def _from_hf(hf):
    require(hf, DECODER_FIELDS, "gpt_oss")
    hf = {**_DEFAULTS, **hf}
    if hf.get("rope_parameters") is None and hf.get("rope_scaling") is None:
        hf["rope_parameters"] = dict(_DEFAULT_ROPE, rope_theta=hf.get("rope_theta", 150000.0))
    L = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else
                                      "full_attention" for i in range(L)]
    theta, scaling = rope_of(hf)
    bias = bool(hf["attention_bias"])
    return dict(
        name="gpt_oss", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=L,
        n_heads=hf["num_attention_heads"], n_kv_heads=hf["num_key_value_heads"],
        head_dim=hf["head_dim"], d_ff=hf["intermediate_size"],
        norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        rope_base=theta, rope_scaling=scaling, layer_types=list(types),
        window=hf["sliding_window"], qkv_bias=bias, o_bias=bias, attn_sinks=True,
        ffn="moe", n_experts=hf["num_local_experts"], top_k=hf["num_experts_per_tok"],
        router_bias=True, experts="clamped", swiglu_alpha=float(hf["swiglu_alpha"]),
        swiglu_limit=float(hf["swiglu_limit"]), z_coef=0.0,
        balance_coef=float(hf["router_aux_loss_coef"]) if hf["output_router_logits"] else 0.0,
        pad_id=hf.get("pad_token_id"))  # nn.Embedding(padding_idx=pad_token_id)


def _to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_parameters", "rope_theta"))
    hf["output_router_logits"] = f.balance_coef > 0  # the aux loss only with router logits
    if f.balance_coef > 0:
        hf["router_aux_loss_coef"] = f.balance_coef
    hf.update(architectures=[GPT_OSS.architecture], model_type=GPT_OSS.model_type,
              vocab_size=f.vocab_size, hidden_size=f.d_model, intermediate_size=f.d_ff,
              num_hidden_layers=f.n_layers, num_attention_heads=f.n_heads,
              num_key_value_heads=f.n_kv_heads, head_dim=head_dim(f), rms_norm_eps=f.norm_eps,
              tie_word_embeddings=f.tie_embeddings, attention_bias=f.qkv_bias,
              sliding_window=f.window, num_local_experts=f.n_experts,
              num_experts_per_tok=f.top_k, swiglu_alpha=f.swiglu_alpha,
              swiglu_limit=f.swiglu_limit, dtype=dtype_name,
              layer_types=list(f.layer_types or ["full_attention"] * f.n_layers),
              rope_parameters={"rope_type": "default", **(f.rope_scaling or {}),
                               "rope_theta": f.rope_base})
    return write_pad_id(hf, f)


def _check(f):
    """_NEEDS, and biases on all of q, k, v, o or none (config.json's one attention_bias)."""
    differ = differences(f, {**_NEEDS, "pad_id": f.pad_id})  # any pad id
    if f.qkv_bias != f.o_bias:
        differ["o_bias"] = f"o_bias={f.qkv_bias!r} (= qkv_bias: attention_bias)"
    refuse(f, "gpt_oss", differ)


GPT_OSS = Family(
    "gpt_oss", "GptOssForCausalLM", _from_hf, _to_hf,
    claims=lambda f: f.experts == "clamped",  # the clamped SwiGLU experts are gpt-oss's own
    check=_check, names=lambda model, f: decoder_entries(model, "gpt_oss", _LAYER))
