"""The model families of Hugging Face checkpoints as ModelConfigs: config.json -> ModelConfig
(`from_hf_config`) and back (`to_hf_config`). No math here: each family is a set of
ModelConfig options that the LM builds from the library's own pairs.

    llama    RMSNorm pre-norm, GQA + RoPE (with its rope_scaling: linear, dynamic, yarn,
             llama3), SwiGLU                    (Touvron et al. 2023, arXiv 2302.13971)
    mistral  llama + a sliding window W of keys (rolling KV state when decoding)
                                                (Jiang et al. 2023, arXiv 2310.06825)
    qwen2    llama + biases on the q, k, v projections      (Yang et al. 2024, arXiv 2407.10671)
    qwen3    llama + QK-norm (RMSNorm over each q and k head before RoPE), explicit head_dim
                                                (Yang et al. 2025, arXiv 2505.09388)
    gpt2     LayerNorm with bias, learned absolute positions, multi-head attention with
             biases (fused c_attn), GELU-tanh MLP with biases, tied head (Radford et al. 2019)
    gemma3_text  sandwich norms, RMSNorm gains 1 + w, embedding * sqrt(D), QK-norm, softmax
             scale query_pre_attn_scalar^-1/2, GeGLU (GELU-tanh gate), per-layer
             layer_types: sliding layers (window, local RoPE base) and full layers (global
             base and rope_scaling), tied head             (Gemma Team 2025, arXiv 2503.19786)
    gpt_oss  sink logits, q/k/v/o biases, sliding/full layer_types, YaRN, a biased router and
             clamped SwiGLU experts with biases               (families_gpt_oss.py)
    mamba, jamba  the state-space families: families_ssm.py

Where a field is absent from config.json, the transformers configuration class's default
applies (huggingface/transformers src/transformers/models/llama/configuration_llama.py and
its siblings); a field whose value the library does not implement is an error naming it.
"""
import importlib

from scratchllm.hub import families_ssm
from scratchllm.hub.families_ssm import SSM_FAMILIES

EXTRA_FAMILIES = ("gpt_oss",)  # each in a module of its own, families_<name>.py beside this
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gpt2", "gemma3_text") + EXTRA_FAMILIES \
    + SSM_FAMILIES
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "gpt2": "GPT2LMHeadModel", "gemma3_text": "Gemma3ForCausalLM",
                 "gpt_oss": "GptOssForCausalLM", **families_ssm.ARCHITECTURES}
_GELU = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu": "none"}  # HF ACT2FN names
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads")
_DEFAULTS = {  # transformers' defaults for the fields that change the math
    "llama": dict(rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=None,
                  max_position_embeddings=2048),
    "mistral": dict(rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=None,
                    sliding_window=4096, max_position_embeddings=4096 * 32),
    "qwen2": dict(rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=None,
                  max_position_embeddings=32768),
    "qwen3": dict(rms_norm_eps=1e-6, tie_word_embeddings=False, head_dim=128,
                  max_position_embeddings=32768),
}
_UNSUPPORTED = {  # field: (the value the library implements, the families that have the field)
    "hidden_act": ("silu", FAMILIES),
    "attention_bias": (False, ("llama", "qwen3")),
    "mlp_bias": (False, ("llama",)),
    "use_sliding_window": (False, ("qwen2", "qwen3")),
    "pretraining_tp": (1, ("llama",)),
}


def extra_family(name):
    """The module of a family kept in a file of its own (families_<name>.py), with the same
    from_hf_config, family_of, to_hf_config, and the names' entries(model); imported when
    first asked for, as it builds on this module and names.py."""
    return importlib.import_module(f"scratchllm.hub.families_{name}")


def _fail(msg):
    raise ValueError(f"load_pretrained: config.json: {msg}")


def rope_of(hf):
    """(rope_theta, rope_scaling dict or None) from config.json's `rope_parameters`
    (transformers >= 5) or its older `rope_theta` + `rope_scaling`."""
    params = hf.get("rope_parameters")
    if params is None:
        params = dict(hf.get("rope_scaling") or {})
        theta = hf.get("rope_theta", 10000.0)
    else:
        params = dict(params)
        theta = params.pop("rope_theta", hf.get("rope_theta", 10000.0))
    if params.pop("partial_rotary_factor", 1.0) != 1.0:
        _fail("partial_rotary_factor != 1 (a partial rotary dim) is not implemented")
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type == "dynamic":  # HF's dynamic NTK starts from max_position_embeddings
        params["original_max_position_embeddings"] = hf["max_position_embeddings"]
    if rope_type == "yarn":
        params.setdefault("original_max_position_embeddings", hf["max_position_embeddings"])
        if params.get("factor") is None:  # DeepSeek-style configs: the ratio of the lengths
            params["factor"] = hf["max_position_embeddings"] / params[
                "original_max_position_embeddings"]
    return float(theta), {"rope_type": rope_type, **params}


def from_hf_config(hf):
    """ModelConfig fields (a dict) of a transformers config.json dict; ValueError naming the
    field for an unsupported model_type or option."""
    family = hf.get("model_type")
    if family not in FAMILIES:
        _fail(f"model_type {family!r} is not supported; supported: {list(FAMILIES)}")
    if family in EXTRA_FAMILIES:
        return extra_family(family).from_hf_config(hf)
    if family in SSM_FAMILIES:  # mamba, jamba: families_ssm.py
        return families_ssm.from_ssm_config(hf)
    if family == "gpt2":
        return _from_gpt2(hf)
    if family == "gemma3_text":
        return _from_gemma3(hf)
    missing = [k for k in _REQUIRED if k not in hf]
    if missing:
        _fail(f"missing field(s) {missing} (model_type {family!r})")
    hf = {**_DEFAULTS[family], **hf}
    for field, (value, families) in _UNSUPPORTED.items():
        if family in families and hf.get(field, value) != value:
            _fail(f"{field} = {hf[field]!r} is not implemented for {family} (only {value!r})")
    layer_types = hf.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types) and family != "mistral":
        _fail(f"layer_types {layer_types} has sliding layers; only full_attention is "
              f"implemented for {family}")
    theta, scaling = rope_of(hf)
    H = hf["num_attention_heads"]
    head_dim = hf["head_dim"]
    return dict(
        name=family, vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"], n_heads=H,
        n_kv_heads=hf.get("num_key_value_heads") or H, d_ff=hf["intermediate_size"],
        norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        rope_base=theta, rope_scaling=scaling,
        head_dim=None if head_dim in (None, hf["hidden_size"] // H) else head_dim,
        window=hf["sliding_window"] if family == "mistral" else None,
        qkv_bias=family == "qwen2", qk_norm=family == "qwen3")


def _from_gpt2(hf):
    """GPT-2's config.json (its own field names: n_embd, n_layer, ...)."""
    missing = [k for k in ("vocab_size", "n_embd", "n_layer", "n_head") if k not in hf]
    if missing:
        _fail(f"missing field(s) {missing} (model_type 'gpt2')")
    act = hf.get("activation_function", "gelu_new")
    if act not in _GELU:
        _fail(f"activation_function = {act!r} is not implemented (only {sorted(_GELU)})")
    for field, value in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx",
                                                        False), ("add_cross_attention", False)):
        if hf.get(field, value) != value:
            _fail(f"{field} = {hf[field]!r} is not implemented for gpt2 (only {value!r})")
    D, H = hf["n_embd"], hf["n_head"]
    return dict(name="gpt2", vocab_size=hf["vocab_size"], d_model=D, n_layers=hf["n_layer"],
                n_heads=H, n_kv_heads=H, d_ff=hf.get("n_inner") or 4 * D,
                norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
                tie_embeddings=bool(hf.get("tie_word_embeddings", True)), qkv_bias=True,
                o_bias=True, norm="layernorm", positions="learned",
                max_positions=hf.get("n_positions", 1024), ffn="gelu_mlp",
                gelu_approx=_GELU[act])


_GEMMA3 = dict(rms_norm_eps=1e-6, tie_word_embeddings=True, head_dim=256,
               num_key_value_heads=4, hidden_activation="gelu_pytorch_tanh",
               query_pre_attn_scalar=256, sliding_window=4096, max_position_embeddings=131072)


def _gemma3_rope(hf):
    """(global theta, its scaling, local theta): rope_parameters per layer type
    (transformers >= 5), or rope_theta + rope_scaling + rope_local_base_freq."""
    per_type = hf.get("rope_parameters") or {}
    if "full_attention" in per_type:
        theta, scaling = rope_of({**hf, "rope_parameters": per_type["full_attention"]})
        local, local_scaling = rope_of({**hf, "rope_parameters": per_type.get(
            "sliding_attention") or {"rope_theta": 10000.0}})
        if local_scaling is not None:
            _fail("rope_parameters['sliding_attention'] with a rope_type other than default "
                  "is not implemented")
        return theta, scaling, local
    theta, scaling = rope_of({**hf, "rope_theta": hf.get("rope_theta", 1e6)})
    return theta, scaling, float(hf.get("rope_local_base_freq", 10000.0))


def _from_gemma3(hf):
    """Gemma 3's text config.json (model_type gemma3_text)."""
    missing = [k for k in _REQUIRED if k not in hf]
    if missing:
        _fail(f"missing field(s) {missing} (model_type 'gemma3_text')")
    hf = {**_GEMMA3, **hf}
    for field, value in (("hidden_activation", "gelu_pytorch_tanh"), ("attention_bias", False),
                         ("final_logit_softcapping", None), ("attn_logit_softcapping", None),
                         ("use_bidirectional_attention", False)):
        if hf.get(field, value) != value:
            _fail(f"{field} = {hf[field]!r} is not implemented for gemma3_text (only "
                  f"{value!r})")
    L = hf["num_hidden_layers"]
    types = hf.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else
                                      "sliding_attention" for i in range(L)]
    theta, scaling, local = _gemma3_rope(hf)
    H = hf["num_attention_heads"]
    return dict(
        name="gemma3_text", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=L,
        n_heads=H, n_kv_heads=hf["num_key_value_heads"], d_ff=hf["intermediate_size"],
        head_dim=hf["head_dim"], norm_eps=float(hf["rms_norm_eps"]),
        tie_embeddings=bool(hf["tie_word_embeddings"]), rope_base=theta, rope_scaling=scaling,
        rope_local_base=local, layer_types=list(types), window=hf["sliding_window"],
        qk_norm=True, ffn="geglu", gelu_approx="tanh", block="sandwich", norm_offset=1.0,
        embed_scale=True, attn_scale=float(hf["query_pre_attn_scalar"]) ** -0.5)


def family_of(cfg):
    """The transformers family a ModelConfig is an instance of (its name when that is one);
    ValueError for a config no family covers (MoE, MLA, attention sinks)."""
    if cfg.name in EXTRA_FAMILIES:
        return extra_family(cfg.name).family_of(cfg)
    if families_ssm.is_ssm(cfg):  # Mamba layers: families_ssm.py
        return families_ssm.ssm_family_of(cfg)
    gpt2 = dict(norm="layernorm", positions="learned", ffn="gelu_mlp", qkv_bias=True,
                o_bias=True, qk_norm=False, window=None, head_dim=None, n_sink=0,
                layer_pattern=None, attention="gqa", n_kv_heads=cfg.n_heads)
    if cfg.block == "sandwich" or cfg.name == "gemma3_text":
        gemma = dict(ffn="geglu", block="sandwich", norm_offset=1.0, embed_scale=True,
                     qk_norm=True, norm="rmsnorm", positions="rope", qkv_bias=False,
                     o_bias=False, n_sink=0, layer_pattern=None, attention="gqa")
        differ = [k for k, v in gemma.items() if getattr(cfg, k) != v]
        if differ:
            raise ValueError(f"save_pretrained: a sandwich-norm config is gemma3_text only, "
                             f"which needs {', '.join(f'{k}={gemma[k]!r}' for k in differ)}")
        return "gemma3_text"
    if cfg.norm == "layernorm" or cfg.name == "gpt2":
        differ = [k for k, v in gpt2.items() if getattr(cfg, k) != v]
        if differ:
            raise ValueError(f"save_pretrained: a LayerNorm config is gpt2 only, and gpt2 "
                             f"needs {', '.join(f'{k}={gpt2[k]!r}' for k in differ)}")
        return "gpt2"
    if (cfg.ffn != "swiglu" or cfg.attention != "gqa" or cfg.layer_pattern or cfg.n_sink
            or cfg.positions != "rope" or cfg.o_bias or cfg.layer_types or cfg.embed_scale
            or cfg.norm_offset or cfg.attn_scale is not None):
        raise ValueError(f"save_pretrained: config {cfg.name!r} (ffn={cfg.ffn!r}, attention="
                         f"{cfg.attention!r}, layer_pattern={cfg.layer_pattern!r}, n_sink="
                         f"{cfg.n_sink}) is not one of the families {list(FAMILIES)}")
    options = (cfg.window is not None, cfg.qkv_bias, cfg.qk_norm)
    wanted = {"llama": (False, False, False), "mistral": (True, False, False),
              "qwen2": (False, True, False), "qwen3": (False, False, True)}
    if cfg.name in FAMILIES and wanted[cfg.name] == options:
        return cfg.name
    for family, opts in wanted.items():
        if opts == options:
            return family
    raise ValueError(f"save_pretrained: no family has window={cfg.window}, qkv_bias="
                     f"{cfg.qkv_bias} and qk_norm={cfg.qk_norm} together")


def to_hf_config(cfg, dtype_name, base=None):
    """A config.json dict for a ModelConfig, over `base` (the loaded config.json, kept so that
    token ids and other fields the library does not use survive a round trip)."""
    family = family_of(cfg)
    if family in EXTRA_FAMILIES:
        return extra_family(family).to_hf_config(cfg, dtype_name, base)
    if family in SSM_FAMILIES:
        return families_ssm.to_ssm_config(cfg, family, dtype_name, base)
    hf = dict(base or {})
    for key in ("rope_scaling", "rope_parameters", "torch_dtype", "transformers_version"):
        hf.pop(key, None)
    if family == "gemma3_text":
        hf.pop("rope_theta", None)
        hf.update(architectures=[ARCHITECTURES[family]], model_type=family,
                  vocab_size=cfg.vocab_size, hidden_size=cfg.d_model,
                  intermediate_size=cfg.d_ff, num_hidden_layers=cfg.n_layers,
                  num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_kv_heads,
                  head_dim=cfg.dh, rms_norm_eps=cfg.norm_eps,
                  tie_word_embeddings=cfg.tie_embeddings,
                  query_pre_attn_scalar=round((cfg.attn_scale or cfg.dh ** -0.5) ** -2),
                  sliding_window=cfg.window, layer_types=list(cfg.layer_types or
                                                              ["full_attention"] * cfg.n_layers),
                  hidden_activation="gelu_pytorch_tanh", dtype=dtype_name, rope_parameters={
                      "full_attention": {"rope_type": "default", **(cfg.rope_scaling or {}),
                                         "rope_theta": cfg.rope_base},
                      "sliding_attention": {"rope_type": "default", "rope_theta":
                                            cfg.rope_local_base or cfg.rope_base}})
        return hf
    if family == "gpt2":
        hf.update(architectures=[ARCHITECTURES[family]], model_type=family,
                  vocab_size=cfg.vocab_size, n_embd=cfg.d_model, n_layer=cfg.n_layers,
                  n_head=cfg.n_heads, n_inner=cfg.d_ff, n_positions=cfg.max_positions,
                  layer_norm_epsilon=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
                  activation_function="gelu_new" if cfg.gelu_approx == "tanh" else "gelu",
                  dtype=dtype_name)
        return hf
    scaling = dict(cfg.rope_scaling) if cfg.rope_scaling else None
    max_pos = hf.get("max_position_embeddings", _DEFAULTS[family]["max_position_embeddings"])
    if scaling and scaling.get("rope_type") == "dynamic":  # HF reads L0 from max_position
        max_pos = scaling.pop("original_max_position_embeddings")
    hf.update(
        architectures=[ARCHITECTURES[family]], model_type=family, vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads, head_dim=cfg.dh, hidden_act="silu",
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        max_position_embeddings=max_pos, rope_theta=cfg.rope_base, rope_scaling=scaling,
        dtype=dtype_name)
    if family == "mistral":
        hf["sliding_window"] = cfg.window
    if family in ("qwen2", "qwen3"):
        hf.update(use_sliding_window=False, layer_types=["full_attention"] * cfg.n_layers)
    return hf
