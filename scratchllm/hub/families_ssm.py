"""The state-space families of Hugging Face checkpoints as ModelConfigs: config.json ->
ModelConfig fields (`from_ssm_config`), back (`to_ssm_config`), and which of the two a
ModelConfig is (`ssm_family_of`). No math here: the LM builds both from the library's Mamba
block (ssm/mamba.py), GQA attention and MoE pairs.

    mamba  Mamba-1 (Gu & Dao 2023, arXiv 2312.00752): every layer is x + mixer(rmsnorm(x))
           with the Mamba block as the mixer and no FFN (ffn="none"), tied head by default.
           HF MambaForCausalLM.
    jamba  Jamba (Lieber et al. 2024, arXiv 2403.19887): layer i is attention when
           i % attn_layer_period == attn_layer_offset, else Mamba with RMSNorms on dt, B and C
           (mamba_inner_norms); its FFN is an MoE when i % expert_layer_period ==
           expert_layer_offset (and num_experts > 1), else SwiGLU. Attention is GQA with no
           positional encoding (positions="nope"); the router is softmax -> top-k with the
           chosen probabilities as gates, not renormalised (norm_topk_prob=False).
           HF JambaForCausalLM.

Fields that change nothing in a float32 or float64 forward are accepted: residual_in_fp32
(the residual stream is already float32 or wider here), the time_step_{scale,min,max,floor,
init_scheme} and initializer fields (initialisation only), use_mambapy and
use_associative_scan (other ways to run the same scan). A field whose other value changes
the math but is not implemented (use_bias, use_conv_bias=False, mamba_proj_bias, ...) is an
error naming it.

Jamba's router_aux_loss_coef weighs HF's load_balancing_loss_func, which concatenates the
router logits of all layers before averaging; the library's balance loss is per layer, so a
loaded Jamba trains with balance_coef = z_coef = 0 (HF's loss too unless
output_router_logits), and save_pretrained writes balance_coef as router_aux_loss_coef.
z_coef and the MoE selection bias have no Jamba field: a config with bias_gamma > 0 is refused.
Reference: huggingface/transformers src/transformers/models/mamba/configuration_mamba.py,
src/transformers/models/jamba/configuration_jamba.py (the defaults below).
"""
import math

SSM_FAMILIES = ("mamba", "jamba")
ARCHITECTURES = {"mamba": "MambaForCausalLM", "jamba": "JambaForCausalLM"}
_MAMBA = dict(layer_norm_epsilon=1e-5, state_size=16, conv_kernel=4, expand=2,
              time_step_rank="auto", tie_word_embeddings=True)
_JAMBA = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, num_key_value_heads=8,
              num_experts_per_tok=2, num_experts=16, expert_layer_period=2,
              expert_layer_offset=1, attn_layer_period=8, attn_layer_offset=4, mamba_d_state=16,
              mamba_d_conv=4, mamba_expand=2, mamba_dt_rank="auto", router_aux_loss_coef=0.001)
_FIXED = {  # field: the one value the library implements, per family
    "mamba": dict(use_bias=False, use_conv_bias=True, hidden_act="silu"),
    "jamba": dict(mamba_proj_bias=False, mamba_conv_bias=True, hidden_act="silu")}
_REQUIRED = {"mamba": ("vocab_size", "hidden_size", "num_hidden_layers"),
             "jamba": ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                       "num_attention_heads")}


def is_ssm(cfg):
    """Whether a ModelConfig is one of the state-space families (it has Mamba layers)."""
    return cfg.name in SSM_FAMILIES or "M" in cfg.layer_kinds()


def _fail(msg):
    raise ValueError(f"load_pretrained: config.json: {msg}")


def _dt_rank(value, d_model):
    """HF's time_step_rank / mamba_dt_rank: "auto" is ceil(D / 16)."""
    return math.ceil(d_model / 16) if value == "auto" else value


def from_ssm_config(hf):
    """ModelConfig fields of a mamba or jamba config.json dict; ValueError naming the field
    for a missing field or an option the library does not implement."""
    family = hf["model_type"]
    missing = [k for k in _REQUIRED[family] if k not in hf]
    if missing:
        _fail(f"missing field(s) {missing} (model_type {family!r})")
    for field, value in _FIXED[family].items():
        if hf.get(field, value) != value:
            _fail(f"{field} = {hf[field]!r} is not implemented for {family} (only {value!r})")
    return _from_mamba({**_MAMBA, **hf}) if family == "mamba" else _from_jamba({**_JAMBA, **hf})


def _from_mamba(hf):
    D, L = hf["hidden_size"], hf["num_hidden_layers"]
    return dict(name="mamba", vocab_size=hf["vocab_size"], d_model=D, n_layers=L,
                layer_pattern="M" * L, ffn="none", n_heads=1, n_kv_heads=1, positions="nope",
                d_state=hf["state_size"], d_conv=hf["conv_kernel"], expand=hf["expand"],
                dt_rank=_dt_rank(hf["time_step_rank"], D),
                norm_eps=float(hf["layer_norm_epsilon"]),
                tie_embeddings=bool(hf["tie_word_embeddings"]))


def _from_jamba(hf):
    D, L, H = hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"]
    if hf.get("head_dim", D // H) != D // H:
        _fail(f"head_dim = {hf['head_dim']!r} is not implemented for jamba (hidden_size / "
              f"num_attention_heads = {D // H})")
    periods = {"attn": ("attn_layer_period", "attn_layer_offset"),
               "expert": ("expert_layer_period", "expert_layer_offset")}
    for period, offset in periods.values():
        if not 0 <= hf[offset] < hf[period]:
            _fail(f"{offset} = {hf[offset]!r} must be in [0, {period} = {hf[period]!r})")
    P, o = hf["attn_layer_period"], hf["attn_layer_offset"]
    E = hf["num_experts"]
    moe = E > 1 and any(i % hf["expert_layer_period"] == hf["expert_layer_offset"]
                        for i in range(L))
    return dict(name="jamba", vocab_size=hf["vocab_size"], d_model=D, n_layers=L,
                layer_pattern="".join("A" if i % P == o else "M" for i in range(L)),
                n_heads=H, n_kv_heads=hf["num_key_value_heads"] or H, positions="nope",
                d_ff=hf["intermediate_size"], ffn="moe" if moe else "swiglu",
                n_experts=E if moe else 8, top_k=hf["num_experts_per_tok"] if moe else 2,
                moe_every=hf["expert_layer_period"], moe_offset=hf["expert_layer_offset"],
                norm_topk_prob=False, balance_coef=0.0, z_coef=0.0, mamba_inner_norms=True,
                d_state=hf["mamba_d_state"], d_conv=hf["mamba_d_conv"],
                expand=hf["mamba_expand"], dt_rank=_dt_rank(hf["mamba_dt_rank"], D),
                norm_eps=float(hf["rms_norm_eps"]),
                tie_embeddings=bool(hf["tie_word_embeddings"]))


# ---------------------------------------------------------------------------- saving
_BLOCK = dict(norm="rmsnorm", block="pre", norm_offset=0.0, embed_scale=False)
_JAMBA_NEEDS = dict(_BLOCK, positions="nope", mamba_inner_norms=True, attention="gqa",
                    window=None, n_sink=0, qkv_bias=False, qk_norm=False, o_bias=False,
                    attn_scale=None, layer_types=None)
_JAMBA_MOE_NEEDS = dict(score="softmax", norm_topk_prob=False, n_shared=0, router_bias=False,
                        n_group=1, routed_scaling_factor=1.0, capacity_factor=None,
                        bias_gamma=0.0)


def _refuse(cfg, family, needs):
    differ = [f"{k}={v!r}" for k, v in needs.items() if getattr(cfg, k) != v]
    if differ:
        raise ValueError(f"save_pretrained: config {cfg.name!r} is a {family} checkpoint "
                         f"only with {', '.join(differ)}")


def ssm_family_of(cfg):
    """"mamba" (Mamba layers only, no FFN) or "jamba" (Mamba and attention layers); a
    ValueError naming every option of cfg that the family cannot express."""
    kinds = cfg.layer_kinds()
    if set(kinds) - set("AM"):
        raise ValueError(f"save_pretrained: layer_pattern {kinds!r}: a Mamba or Jamba "
                         f"checkpoint has only M (Mamba) and A (attention) layers")
    if set(kinds) == {"M"} and cfg.ffn == "none":
        _refuse(cfg, "mamba", dict(_BLOCK, mamba_inner_norms=False))
        if cfg.positions not in ("rope", "nope"):  # the others change the embedding
            raise ValueError(f"save_pretrained: positions={cfg.positions!r}: Mamba has no "
                             f"position embedding")
        return "mamba"
    if cfg.ffn not in ("swiglu", "moe"):
        raise ValueError(f"save_pretrained: ffn={cfg.ffn!r}: a Jamba layer's FFN is SwiGLU "
                         f"or an MoE of SwiGLU experts")
    _refuse(cfg, "jamba", dict(_JAMBA_NEEDS, **(_JAMBA_MOE_NEEDS if cfg.ffn == "moe" else {})))
    if cfg.dh != cfg.d_model // cfg.n_heads:
        raise ValueError(f"save_pretrained: head_dim={cfg.head_dim}: Jamba's head dim is "
                         f"d_model / n_heads = {cfg.d_model // cfg.n_heads}")
    return "jamba"


def _period(flags):
    """(period, offset) with flags[i] == (i % period == offset) for every layer i: the
    smallest period (Jamba's attn_layer_period/offset); ValueError when none fits."""
    L = len(flags)
    for period in range(1, L + 2):
        for offset in range(period):
            if all(f == (i % period == offset) for i, f in enumerate(flags)):
                return period, offset
    raise ValueError(f"save_pretrained: layers {[i for i, f in enumerate(flags) if f]} of "
                     f"{L} are attention: not one every attn_layer_period layers")


def to_ssm_config(cfg, family, dtype_name, base=None):
    """A config.json dict for a mamba or jamba ModelConfig, over `base` (the loaded
    config.json: token ids and fields the library does not use survive a round trip)."""
    hf = dict(base or {})
    for key in ("torch_dtype", "transformers_version"):
        hf.pop(key, None)
    common = dict(architectures=[ARCHITECTURES[family]], model_type=family,
                  vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                  num_hidden_layers=cfg.n_layers, tie_word_embeddings=cfg.tie_embeddings,
                  hidden_act="silu", dtype=dtype_name)
    dt_rank = cfg.dt_rank or math.ceil(cfg.d_model / 16)
    if family == "mamba":
        hf.update(common, state_size=cfg.d_state, conv_kernel=cfg.d_conv, expand=cfg.expand,
                  intermediate_size=cfg.expand * cfg.d_model, time_step_rank=dt_rank,
                  layer_norm_epsilon=cfg.norm_eps, use_bias=False, use_conv_bias=True)
        return hf
    P, o = _period([k == "A" for k in cfg.layer_kinds()])
    moe = cfg.ffn == "moe"
    offset = cfg.moe_every - 1 if cfg.moe_offset is None else cfg.moe_offset
    hf.update(common, intermediate_size=cfg.d_ff, num_attention_heads=cfg.n_heads,
              num_key_value_heads=cfg.n_kv_heads, rms_norm_eps=cfg.norm_eps,
              attn_layer_period=P, attn_layer_offset=o,
              num_experts=cfg.n_experts if moe else 1, num_experts_per_tok=cfg.top_k if moe
              else 1, expert_layer_period=cfg.moe_every if moe else 1,
              expert_layer_offset=offset if moe else 0, mamba_d_state=cfg.d_state,
              mamba_d_conv=cfg.d_conv, mamba_expand=cfg.expand, mamba_dt_rank=dt_rank,
              mamba_conv_bias=True, mamba_proj_bias=False)
    if moe and cfg.balance_coef:
        hf["router_aux_loss_coef"] = cfg.balance_coef
    return hf
