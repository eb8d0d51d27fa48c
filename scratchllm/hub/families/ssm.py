"""The state-space families: mamba and jamba. No math here: the LM builds both from the
library's Mamba block (ssm/mamba.py), GQA attention and MoE pairs.

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

Names (layout.py: "T" transposed, nn.Linear's (out, in); "[e]" expert e of a stacked Param;
"+1" Conv1d's size-1 axis):

    library (Mamba block)          HF MambaMixer (mamba: backbone.layers.i.mixer.*,
                                                  jamba: model.layers.i.mamba.*)
    mixer.W_in (D, 2Di)            in_proj.weight (2Di, D)                          T
    mixer.conv_w (Di, K), conv_b   conv1d.weight (Di, 1, K), conv1d.bias            +1
    mixer.W_x (Di, R+2N)           x_proj.weight (R+2N, Di)                         T
    mixer.W_dt (R, Di), b_dt       dt_proj.weight (Di, R), dt_proj.bias             T
    mixer.A_log (Di, N), D (Di,)   A_log, D
    mixer.W_out (Di, D)            out_proj.weight (D, Di)                          T
    mixer.dt_norm, B_norm, C_norm  dt_layernorm, b_layernorm, c_layernorm .weight (jamba)

    mamba                          embed.E = backbone.embeddings.weight, norm1.g =
                                   backbone.layers.i.norm.weight, norm.g =
                                   backbone.norm_f.weight, head.W = lm_head.weight (T, untied)
    jamba                          model.embed_tokens.weight, model.layers.i.input_layernorm
                                   (norm1), .pre_ff_layernorm (norm2), self_attn.{q,k,v,o}_proj
                                   (T), model.final_layernorm (norm), lm_head.weight (T)
    ffn.W1 / W3 / W2 (SwiGLU)      feed_forward.gate_proj / up_proj / down_proj.weight   T
    ffn.w_router (D, E)            feed_forward.router.weight (E, D)                     T
    ffn.w1 / w3 (E, D, F)          feed_forward.experts.e.gate_proj / up_proj.weight  [e] T
    ffn.w2 (E, F, D)               feed_forward.experts.e.down_proj.weight (D, F)     [e] T
The experts are stored one per tensor, as transformers' save_pretrained writes them (its
JambaExperts fuses them into 3-D gate_up_proj / down_proj only in memory).

Glossary: D model width, Di inner width, N state size, R dt rank, K conv kernel, E experts,
F expert width.
"""
import math
from typing import NamedTuple

from scratchllm.hub.families.base import (DECODER_FIELDS, Family, differences, fail_config,
                                          head_dim, layer_kinds, only, over, refuse, require)
from scratchllm.hub.layout import Entry

_MAMBA = dict(layer_norm_epsilon=1e-5, state_size=16, conv_kernel=4, expand=2,
              time_step_rank="auto", tie_word_embeddings=True)
_JAMBA = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, num_key_value_heads=8,
              num_experts_per_tok=2, num_experts=16, expert_layer_period=2,
              expert_layer_offset=1, attn_layer_period=8, attn_layer_offset=4, mamba_d_state=16,
              mamba_d_conv=4, mamba_expand=2, mamba_dt_rank="auto", router_aux_loss_coef=0.001)
_BLOCK = dict(norm="rmsnorm", block="pre", norm_offset=0.0, embed_scale=False,
              attn_softcap=None, logit_softcap=None)
_JAMBA_NEEDS = dict(_BLOCK, positions="nope", mamba_inner_norms=True, attention="gqa",
                    window=None, n_sink=0, attn_sinks=False, qkv_bias=False, qk_norm=False,
                    o_bias=False, attn_scale=None, layer_types=None)
_JAMBA_MOE_NEEDS = dict(score="softmax", norm_topk_prob=False, n_shared=0, router_bias=False,
                        experts="swiglu", n_group=1, routed_scaling_factor=1.0,
                        capacity_factor=None, bias_gamma=0.0)


def _dt_rank(value, d_model):
    """HF's time_step_rank / mamba_dt_rank: "auto" is ceil(D / 16)."""
    return math.ceil(d_model / 16) if value == "auto" else value


# ---------------------------------------------------------------------------- names
_MIXER = {"W_in": ("in_proj.weight", True), "conv_b": ("conv1d.bias", False),
          "W_x": ("x_proj.weight", True), "W_dt": ("dt_proj.weight", True),
          "b_dt": ("dt_proj.bias", False), "A_log": ("A_log", False), "D": ("D", False),
          "W_out": ("out_proj.weight", True), "dt_norm": ("dt_layernorm.weight", False),
          "B_norm": ("b_layernorm.weight", False), "C_norm": ("c_layernorm.weight", False)}
_ATTENTION = {f"w{x}": (f"self_attn.{x}_proj.weight", True) for x in "qkvo"}
_FFN = {"W1": "gate_proj", "W3": "up_proj", "W2": "down_proj"}
_EXPERTS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


class _Naming(NamedTuple):
    """Where a family puts the tensors of a Mamba or Jamba LM: top {library: HF name} (the
    embedding, the final norm), layers.i -> <layers>.i., the Mamba block under <mixer>, and
    the block's norms {library name in the layer: HF name}."""
    top: dict
    layers: str
    mixer: str
    norms: dict


_MAMBA_NAMING = _Naming(
    {"embed.E": "backbone.embeddings.weight", "norm.g": "backbone.norm_f.weight"},
    "backbone.layers", "mixer", {"norm1.g": "norm.weight"})
_JAMBA_NAMING = _Naming(
    {"embed.E": "model.embed_tokens.weight", "norm.g": "model.final_layernorm.weight"},
    "model.layers", "mamba",
    {"norm1.g": "input_layernorm.weight", "norm2.g": "pre_ff_layernorm.weight"})


def _names(model, f, naming):
    """[Entry] for every Param of a Mamba or Jamba LM."""
    kinds = layer_kinds(f)
    out = []
    for name, p in model.named_parameters():
        if name in naming.top:
            out.append(Entry(naming.top[name], (name,), False))
        elif name == "head.W":
            out.append(Entry("lm_head.weight", (name,), True))
        else:
            out += _layer_entries(naming, name, p, kinds)
    return out


def _layer_entries(naming, name, p, kinds):
    """[Entry] of the Param p named layers.i.<rest>, in a layer of kind kinds[i] ("A"
    attention or "M" Mamba)."""
    _, i, rest = name.split(".", 2)  # "layers", i, "mixer.W_in"
    layer, lib, kind = f"{naming.layers}.{i}.", (name,), kinds[int(i)]
    group, _, leaf = rest.partition(".")
    if rest in naming.norms:
        return [Entry(layer + naming.norms[rest], lib, False)]
    if group == "mixer" and kind == "A":
        return [Entry(layer + _ATTENTION[leaf][0], lib, _ATTENTION[leaf][1])]
    if group == "mixer" and leaf == "conv_w":
        return [Entry(layer + f"{naming.mixer}.conv1d.weight", lib, False, unsqueeze=1)]
    if group == "mixer":
        return [Entry(layer + f"{naming.mixer}.{_MIXER[leaf][0]}", lib, _MIXER[leaf][1])]
    if leaf in _FFN:
        return [Entry(layer + f"feed_forward.{_FFN[leaf]}.weight", lib, True)]
    if leaf == "w_router":
        return [Entry(layer + "feed_forward.router.weight", lib, True)]
    return [Entry(layer + f"feed_forward.experts.{e}.{_EXPERTS[leaf]}.weight", lib, True,
                  expert=e) for e in range(p.data.shape[0])]


# ---------------------------------------------------------------------------- mamba
def _mamba_from_hf(hf):
    require(hf, ("vocab_size", "hidden_size", "num_hidden_layers"), "mamba")
    only(hf, dict(use_bias=False, use_conv_bias=True, hidden_act="silu"), "mamba")
    hf = {**_MAMBA, **hf}
    D, L = hf["hidden_size"], hf["num_hidden_layers"]
    return dict(name="mamba", vocab_size=hf["vocab_size"], d_model=D, n_layers=L,
                layer_pattern="M" * L, ffn="none", n_heads=1, n_kv_heads=1, positions="nope",
                d_state=hf["state_size"], d_conv=hf["conv_kernel"], expand=hf["expand"],
                dt_rank=_dt_rank(hf["time_step_rank"], D),
                norm_eps=float(hf["layer_norm_epsilon"]),
                tie_embeddings=bool(hf["tie_word_embeddings"]))


def _mamba_to_hf(f, dtype_name, base=None):
    hf = over(base)
    hf.update(architectures=[MAMBA.architecture], model_type=MAMBA.model_type,
              vocab_size=f.vocab_size, hidden_size=f.d_model, num_hidden_layers=f.n_layers,
              tie_word_embeddings=f.tie_embeddings, hidden_act="silu", dtype=dtype_name,
              state_size=f.d_state, conv_kernel=f.d_conv, expand=f.expand,
              intermediate_size=f.expand * f.d_model,
              time_step_rank=f.dt_rank or math.ceil(f.d_model / 16),
              layer_norm_epsilon=f.norm_eps, use_bias=False, use_conv_bias=True)
    return hf


def _mamba_claims(f):
    """Mamba layers only, and no FFN."""
    return set(layer_kinds(f)) == {"M"} and f.ffn == "none"


def _mamba_check(f):
    differ = differences(f, dict(_BLOCK, mamba_inner_norms=False, ffn="none"))
    if set(layer_kinds(f)) != {"M"}:
        differ["layer_pattern"] = f"layer_pattern={'M' * f.n_layers!r}"
    if f.positions not in ("rope", "nope"):  # the others change the embedding
        differ["positions"] = "positions='nope' (Mamba has no position embedding)"
    refuse(f, "mamba", differ)


MAMBA = Family("mamba", "MambaForCausalLM", _mamba_from_hf, _mamba_to_hf, _mamba_claims,
               _mamba_check, names=lambda model, f: _names(model, f, _MAMBA_NAMING))


# ---------------------------------------------------------------------------- jamba
def _jamba_from_hf(hf):
    require(hf, DECODER_FIELDS, "jamba")
    only(hf, dict(mamba_proj_bias=False, mamba_conv_bias=True, hidden_act="silu"), "jamba")
    hf = {**_JAMBA, **hf}
    D, L, H = hf["hidden_size"], hf["num_hidden_layers"], hf["num_attention_heads"]
    if hf.get("head_dim", D // H) != D // H:
        fail_config(f"head_dim = {hf['head_dim']!r} is not implemented for jamba "
                    f"(hidden_size / num_attention_heads = {D // H})")
    for period, offset in (("attn_layer_period", "attn_layer_offset"),
                           ("expert_layer_period", "expert_layer_offset")):
        if not 0 <= hf[offset] < hf[period]:
            fail_config(f"{offset} = {hf[offset]!r} must be in [0, {period} = {hf[period]!r})")
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
                tie_embeddings=bool(hf["tie_word_embeddings"]),
                pad_id=hf.get("pad_token_id", 0))  # nn.Embedding(padding_idx=pad_token_id)


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


def _jamba_to_hf(f, dtype_name, base=None):
    hf = over(base)
    P, o = _period([k == "A" for k in layer_kinds(f)])
    moe = f.ffn == "moe"
    offset = f.moe_every - 1 if f.moe_offset is None else f.moe_offset
    dt_rank = f.dt_rank or math.ceil(f.d_model / 16)
    hf.update(architectures=[JAMBA.architecture], model_type=JAMBA.model_type,
              vocab_size=f.vocab_size, hidden_size=f.d_model, num_hidden_layers=f.n_layers,
              tie_word_embeddings=f.tie_embeddings, hidden_act="silu", dtype=dtype_name,
              intermediate_size=f.d_ff, num_attention_heads=f.n_heads,
              num_key_value_heads=f.n_kv_heads, rms_norm_eps=f.norm_eps,
              attn_layer_period=P, attn_layer_offset=o,
              num_experts=f.n_experts if moe else 1, num_experts_per_tok=f.top_k if moe
              else 1, expert_layer_period=f.moe_every if moe else 1,
              expert_layer_offset=offset if moe else 0, mamba_d_state=f.d_state,
              mamba_d_conv=f.d_conv, mamba_expand=f.expand, mamba_dt_rank=dt_rank,
              mamba_conv_bias=True, mamba_proj_bias=False, pad_token_id=f.pad_id)
    if moe and f.balance_coef:
        hf["router_aux_loss_coef"] = f.balance_coef
    return hf


def _jamba_claims(f):
    """Mamba layers among others (Mamba layers only with no FFN: mamba's)."""
    return "M" in layer_kinds(f) and not _mamba_claims(f)


def _jamba_check(f):
    """Mamba and attention layers only, every attention layer one period apart (checked by
    to_hf), SwiGLU or MoE FFNs, and _JAMBA_NEEDS."""
    kinds = layer_kinds(f)
    if set(kinds) - set("AM"):
        raise ValueError(f"save_pretrained: layer_pattern {kinds!r}: a Mamba or Jamba "
                         f"checkpoint has only M (Mamba) and A (attention) layers")
    differ = differences(f, dict(_JAMBA_NEEDS, **(_JAMBA_MOE_NEEDS if f.ffn == "moe" else {}),
                                 pad_id=f.pad_id))  # any pad id: transformers' padding_idx
    if f.ffn not in ("swiglu", "moe"):
        differ["ffn"] = "ffn='swiglu' or 'moe'"
    if head_dim(f) != f.d_model // f.n_heads:
        differ["head_dim"] = f"head_dim=None (d_model / n_heads = {f.d_model // f.n_heads})"
    refuse(f, "jamba", differ)


JAMBA = Family("jamba", "JambaForCausalLM", _jamba_from_hf, _jamba_to_hf, _jamba_claims,
               _jamba_check, names=lambda model, f: _names(model, f, _JAMBA_NAMING))
