"""The gpt-oss family (model_type "gpt_oss") as a ModelConfig: config.json -> ModelConfig
(`from_hf_config`), back (`to_hf_config`), and its tensor names (`entries`). No math here:
every piece is an option of the library's pairs.

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

Names (model.layers.i. prefix; the rest as llama's in names.py):

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
from scratchllm.hub.families import ARCHITECTURES, rope_of
from scratchllm.hub.names import LAYER_NAMES, named_entries

_DEFAULTS = dict(num_local_experts=128, num_experts_per_tok=4, head_dim=64,
                 num_key_value_heads=8, sliding_window=128, tie_word_embeddings=False,
                 rms_norm_eps=1e-5, swiglu_alpha=1.702, swiglu_limit=7.0, attention_bias=True,
                 router_aux_loss_coef=0.001, output_router_logits=False,
                 max_position_embeddings=131072)
_DEFAULT_ROPE = dict(rope_type="yarn", factor=32.0, beta_fast=32.0, beta_slow=1.0,
                     truncate=False, original_max_position_embeddings=4096,
                     rope_theta=150000.0)
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads")
_LAYER = dict({k: v for k, v in LAYER_NAMES.items() if not k.startswith("ffn.")}, **{
    "mixer.sinks": ("self_attn.sinks", False), "mixer.bo": ("self_attn.o_proj.bias", False),
    "ffn.w_router": ("mlp.router.weight", True), "ffn.b_router": ("mlp.router.bias", False),
    "ffn.gate_up": ("mlp.experts.gate_up_proj", False),
    "ffn.gate_up_b": ("mlp.experts.gate_up_proj_bias", False),
    "ffn.down": ("mlp.experts.down_proj", False),
    "ffn.down_b": ("mlp.experts.down_proj_bias", False)})


def _fail(msg):
    raise ValueError(f"load_pretrained: config.json: {msg}")


def from_hf_config(hf):
    """ModelConfig fields (a dict) of a gpt_oss config.json dict."""
    missing = [k for k in _REQUIRED if k not in hf]
    if missing:
        _fail(f"missing field(s) {missing} (model_type 'gpt_oss')")
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
        balance_coef=float(hf["router_aux_loss_coef"]) if hf["output_router_logits"] else 0.0)


_FIXED = dict(attention="gqa", positions="rope", rope_style="half", attn_sinks=True,
              qk_norm=False, n_sink=0, block="pre", norm="rmsnorm", norm_offset=0.0,
              embed_scale=False, attn_scale=None, layer_pattern=None, ffn="moe", moe_every=1,
              experts="clamped", router_bias=True, score="softmax", norm_topk_prob=True,
              n_shared=0, capacity_factor=None, n_group=1, routed_scaling_factor=1.0,
              rope_local_base=None, bias_gamma=0.0, z_coef=0.0)


def family_of(cfg):
    """'gpt_oss' when the ModelConfig is one (the options above); ValueError naming those
    that differ."""
    differ = [f"{k}={v!r}" for k, v in _FIXED.items() if getattr(cfg, k) != v]
    if cfg.qkv_bias != cfg.o_bias:
        differ.append("qkv_bias == o_bias (attention_bias)")
    if differ:
        raise ValueError(f"save_pretrained: a gpt_oss config needs {', '.join(differ)}")
    return "gpt_oss"


def to_hf_config(cfg, dtype_name, base=None):
    """A gpt_oss config.json dict for the ModelConfig, over `base` (the loaded config.json)."""
    family_of(cfg)
    hf = dict(base or {})
    for key in ("rope_scaling", "rope_parameters", "rope_theta", "torch_dtype",
                "transformers_version"):
        hf.pop(key, None)
    hf["output_router_logits"] = cfg.balance_coef > 0  # the aux loss only with router logits
    if cfg.balance_coef > 0:
        hf["router_aux_loss_coef"] = cfg.balance_coef
    hf.update(architectures=[ARCHITECTURES["gpt_oss"]], model_type="gpt_oss", vocab_size=cfg.vocab_size,
              hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
              num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
              num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.dh, rms_norm_eps=cfg.norm_eps,
              tie_word_embeddings=cfg.tie_embeddings, attention_bias=cfg.qkv_bias,
              sliding_window=cfg.window, num_local_experts=cfg.n_experts,
              num_experts_per_tok=cfg.top_k, swiglu_alpha=cfg.swiglu_alpha,
              swiglu_limit=cfg.swiglu_limit, dtype=dtype_name,
              layer_types=list(cfg.layer_types or ["full_attention"] * cfg.n_layers),
              rope_parameters={"rope_type": "default", **(cfg.rope_scaling or {}),
                               "rope_theta": cfg.rope_base})
    return hf


def entries(model):
    """[names.Entry] for every Param of a gpt_oss LM."""
    return named_entries(model, _LAYER)
