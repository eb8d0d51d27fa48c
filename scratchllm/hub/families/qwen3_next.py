"""The qwen3_next family (Qwen3-Next, "Qwen3.5": Qwen team 2025): a hybrid of gated DeltaNet
and gated attention layers with a Mixture of Experts. No math here: the LM builds it from the
library's pairs (linear_attention/gated_deltanet.py, attention/gqa.py with its output gate,
moe/layer.py).

    layer i     "linear_attention" in layer_types: a gated DeltaNet ("N"; linear_num_key_heads
                of linear_key_head_dim for q and k, linear_num_value_heads of
                linear_value_head_dim, conv of linear_conv_kernel_dim); "full_attention": GQA
                with QK-norm per head, RoPE on the first partial_rotary_factor of each head
                and the output gate (q_proj yields each head's query and gate)
    norms       RMSNorm with gains 1 + w (the block's, the final one and QK-norm's; eps
                rms_norm_eps), the DeltaNet's RMSNormGated with gains w
    FFN         an MoE in layer i when (i + 1) % decoder_sparse_step == 0 and i is not in
                mlp_only_layers (the first k layers: the form the library has), else a dense
                SwiGLU of intermediate_size: softmax router, top-k renormalised when
                norm_topk_prob, a shared SwiGLU expert of shared_expert_intermediate_size (a
                multiple of moe_intermediate_size) times sigmoid(x . shared_expert_gate)

The published checkpoints carry a multi-token-prediction module (mtp.*), which
transformers' Qwen3NextForCausalLM ignores on loading (_keys_to_ignore_on_load_unexpected):
it is read past here too (unused), and not written back.
Training-only: router_aux_loss_coef weighs a loss only with output_router_logits, so a
loaded model has balance_coef = z_coef = 0 (as qwen3_moe). The DeltaNet's chunk length is
the library's (64; the forms agree to round-off); its l2-norm eps is transformers' 1e-6.

Names ("T" transposed; "groups n": the tensor interleaves its arrays run by run, layout.py):

    library (layers.i.)             model.layers.i.
    mixer.wq | mixer.wg             self_attn.q_proj.weight (2 H Dh, D)      T, groups H
    mixer.wk, wv, wo, q_norm, k_norm  self_attn.k_proj, v_proj, o_proj (T), q_norm, k_norm
    mixer.Wq | Wk | Wv | Wz          linear_attn.in_proj_qkvz.weight          T, groups Hk
    mixer.Wb | Wa                   linear_attn.in_proj_ba.weight (2 Hv, D)  T, groups Hk
    mixer.conv_w (C, K)             linear_attn.conv1d.weight (C, 1, K)
    mixer.dt_bias, A_log, norm      linear_attn.dt_bias, A_log, norm.weight
    mixer.Wout                      linear_attn.out_proj.weight              T
    ffn.w_router, w1/w3/w2[e]       mlp.gate.weight, mlp.experts.e.{gate,up,down}_proj.weight
    ffn.shared_w1 / w3 / w2         mlp.shared_expert.gate_proj / up_proj / down_proj   T
    ffn.shared_gate (D,)            mlp.shared_expert_gate.weight (1, D)
    ffn.W1 / W3 / W2, norm1, norm2  as llama's (base.py's LAYER_NAMES)
Reference: huggingface/transformers src/transformers/models/qwen3_next/modeling_qwen3_next.py,
configuration_qwen3_next.py (the defaults below).
Glossary: D model width, H heads of Dh, Hk key heads, Hv value heads, C conv channels,
K conv width.
"""
from scratchllm.hub.families.base import (DECODER_FIELDS, LAYER_NAMES, TOP_NAMES, Family,
                                          differences, fail_config, head_dim, layer_kinds,
                                          only, over, refuse, require, rope_of,
                                          rope_parameters, write_pad_id)
from scratchllm.hub.layout import Entry

_QWEN3_NEXT = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, max_position_embeddings=32768,
                   num_key_value_heads=2, head_dim=256, linear_conv_kernel_dim=4,
                   linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                   linear_num_value_heads=32, decoder_sparse_step=1, moe_intermediate_size=512,
                   shared_expert_intermediate_size=512, num_experts_per_tok=10,
                   num_experts=512, norm_topk_prob=True, mlp_only_layers=None,
                   attention_bias=False, partial_rotary_factor=0.25)
_KINDS = {"linear_attention": "N", "full_attention": "A"}
_NEEDS = dict(attention="gqa", positions="rope", rope_style="half", layer_types=None,
              window=None, n_sink=0, attn_sinks=False, qk_norm=True, attn_scale=None,
              attn_output_gate=True, experts="swiglu", score="softmax", router_bias=False,
              n_group=1, topk_group=1, routed_scaling_factor=1.0, capacity_factor=None,
              moe_offset=None, norm="rmsnorm", block="pre", norm_offset=1.0, embed_scale=False,
              bias_gamma=0.0, attn_softcap=None, logit_softcap=None, attn_impl="sdpa",
              causal=True)


def _layer_pattern(hf):
    """One letter per layer from layer_types (or full_attention_interval, older configs)."""
    L = hf["num_hidden_layers"]
    types = hf.get("layer_types") or [
        "full_attention" if (i + 1) % hf.get("full_attention_interval", 4) == 0
        else "linear_attention" for i in range(L)]
    if len(types) != L or set(types) - set(_KINDS):
        fail_config(f"layer_types = {types!r} must be {L} of {list(_KINDS)}")
    return "".join(_KINDS[t] for t in types)


def _ffn(hf):
    """The FFN fields: an MoE with its shared expert, or dense SwiGLUs (num_experts 0)."""
    L, E = hf["num_hidden_layers"], hf["num_experts"]
    dense = sorted(hf["mlp_only_layers"] or [])
    if dense != list(range(len(dense))):
        fail_config(f"mlp_only_layers = {hf['mlp_only_layers']!r} is not implemented for "
                    f"qwen3_next (only the first k layers: [0, 1, ..., k - 1])")
    step = hf["decoder_sparse_step"]
    if not E or not any((i + 1) % step == 0 for i in range(len(dense), L)):
        return dict(ffn="swiglu", d_ff=hf["intermediate_size"])
    F, Fs = hf["moe_intermediate_size"], hf["shared_expert_intermediate_size"]
    if not Fs or Fs % F:
        fail_config(f"shared_expert_intermediate_size = {Fs!r} is not implemented for "
                    f"qwen3_next (only a positive multiple of moe_intermediate_size = {F})")
    return dict(ffn="moe", d_ff=F, dense_d_ff=hf["intermediate_size"], moe_every=step,
                first_k_dense=len(dense), n_experts=E, top_k=hf["num_experts_per_tok"],
                score="softmax", norm_topk_prob=bool(hf["norm_topk_prob"]), n_shared=Fs // F,
                shared_gate=True, balance_coef=0.0, z_coef=0.0, bias_gamma=0.0)


def _from_hf(hf):
    require(hf, DECODER_FIELDS, "qwen3_next")
    hf = {**_QWEN3_NEXT, **hf}
    only(hf, dict(hidden_act="silu"), "qwen3_next")
    theta, scaling, partial = rope_of(hf, partial=True)
    H, D = hf["num_attention_heads"], hf["hidden_size"]
    bias = bool(hf["attention_bias"])
    return dict(
        name="qwen3_next", vocab_size=hf["vocab_size"], d_model=D,
        n_layers=hf["num_hidden_layers"], layer_pattern=_layer_pattern(hf), n_heads=H,
        n_kv_heads=hf["num_key_value_heads"] or H,
        head_dim=None if hf["head_dim"] in (None, D // H) else hf["head_dim"],
        qkv_bias=bias, o_bias=bias, qk_norm=True, attn_output_gate=True, norm_offset=1.0,
        norm_eps=float(hf["rms_norm_eps"]), tie_embeddings=bool(hf["tie_word_embeddings"]),
        rope_base=theta, rope_scaling=scaling, rope_partial=partial,
        gdn_k_heads=hf["linear_num_key_heads"], gdn_v_heads=hf["linear_num_value_heads"],
        gdn_k_head_dim=hf["linear_key_head_dim"], gdn_v_head_dim=hf["linear_value_head_dim"],
        d_conv=hf["linear_conv_kernel_dim"], pad_id=hf.get("pad_token_id"), **_ffn(hf))


def _to_hf(f, dtype_name, base=None):
    hf = over(base, ("rope_scaling", "rope_theta", "partial_rotary_factor",
                     "full_attention_interval"))
    rope, max_pos = rope_parameters(f, hf.get("max_position_embeddings",
                                              _QWEN3_NEXT["max_position_embeddings"]))
    rope.setdefault("partial_rotary_factor", 1.0)  # absent, transformers reads 0.25
    moe = f.ffn == "moe"
    hf.update(
        architectures=[QWEN3_NEXT.architecture], model_type="qwen3_next",
        vocab_size=f.vocab_size, hidden_size=f.d_model, num_hidden_layers=f.n_layers,
        num_attention_heads=f.n_heads, num_key_value_heads=f.n_kv_heads, head_dim=head_dim(f),
        hidden_act="silu", attention_bias=f.qkv_bias, rms_norm_eps=f.norm_eps,
        tie_word_embeddings=f.tie_embeddings, max_position_embeddings=max_pos,
        rope_parameters=rope, dtype=dtype_name,
        layer_types=["full_attention" if k == "A" else "linear_attention"
                     for k in layer_kinds(f)],
        linear_num_key_heads=f.gdn_k_heads, linear_num_value_heads=f.gdn_v_heads,
        linear_key_head_dim=f.gdn_k_head_dim, linear_value_head_dim=f.gdn_v_head_dim,
        linear_conv_kernel_dim=f.d_conv,
        intermediate_size=(f.dense_d_ff or hf.get("intermediate_size", f.d_ff)) if moe
        else f.d_ff, num_experts=f.n_experts if moe else 0,
        moe_intermediate_size=f.d_ff if moe else hf.get("moe_intermediate_size", f.d_ff),
        shared_expert_intermediate_size=f.n_shared * f.d_ff if moe else hf.get(
            "shared_expert_intermediate_size", f.d_ff),
        decoder_sparse_step=f.moe_every if moe else 1,
        mlp_only_layers=list(range(f.first_k_dense)) if moe else [],
        num_experts_per_tok=f.top_k, norm_topk_prob=f.norm_topk_prob)
    return write_pad_id(hf, f)


def _check(f):
    """_NEEDS, only N and A layers, qkv_bias == o_bias (attention_bias sets both), and an
    MoE with a shared expert (or dense SwiGLUs)."""
    differ = differences(f, {**_NEEDS, "pad_id": f.pad_id,  # any pad id and rotary fraction
                             "rope_partial": f.rope_partial, "shared_gate": f.ffn == "moe"})
    if set(layer_kinds(f)) - set("NA"):
        differ["layer_pattern"] = "layer_pattern of N (gated DeltaNet) and A (attention) only"
    if f.qkv_bias != f.o_bias:
        differ["o_bias"] = f"o_bias={f.qkv_bias!r} (attention_bias sets qkv_bias and o_bias)"
    if f.ffn not in ("moe", "swiglu"):
        differ["ffn"] = "ffn='moe' or 'swiglu'"
    if f.ffn == "moe" and not f.n_shared:
        differ["n_shared"] = "n_shared >= 1 (Qwen3-Next's shared expert)"
    refuse(f, "qwen3_next", differ)


def _claims(f):
    """Gated DeltaNet layers among others."""
    return "N" in layer_kinds(f)


# ---------------------------------------------------------------------------- names
_ATTENTION = {"mixer.wk": "k_proj.weight", "mixer.wv": "v_proj.weight",
              "mixer.wo": "o_proj.weight", "mixer.bk": "k_proj.bias",
              "mixer.bv": "v_proj.bias", "mixer.bo": "o_proj.bias",
              "mixer.q_norm": "q_norm.weight", "mixer.k_norm": "k_norm.weight"}
_DELTANET = {"mixer.dt_bias": "dt_bias", "mixer.A_log": "A_log", "mixer.norm": "norm.weight",
             "mixer.Wout": "out_proj.weight"}
_GROUPED = {  # the first library array of a grouped tensor -> (its arrays, HF name)
    "mixer.wq": (("wq", "wg"), "self_attn.q_proj.weight"),
    "mixer.bq": (("bq", "bg"), "self_attn.q_proj.bias"),
    "mixer.Wq": (("Wq", "Wk", "Wv", "Wz"), "linear_attn.in_proj_qkvz.weight"),
    "mixer.Wb": (("Wb", "Wa"), "linear_attn.in_proj_ba.weight")}
_IN_GROUP = {"mixer.wg", "mixer.bg", "mixer.Wk", "mixer.Wv", "mixer.Wz", "mixer.Wa"}
_FFN = dict({k: v[0] for k, v in LAYER_NAMES.items() if k.startswith(("ffn.", "norm"))},
            **{"ffn.w_router": "mlp.gate.weight",
               "ffn.shared_w1": "mlp.shared_expert.gate_proj.weight",
               "ffn.shared_w3": "mlp.shared_expert.up_proj.weight",
               "ffn.shared_w2": "mlp.shared_expert.down_proj.weight"})
_EXPERTS = {"ffn.w1": "gate_proj", "ffn.w3": "up_proj", "ffn.w2": "down_proj"}


def _names(model, f):
    """[Entry] for every Param of a Qwen3-Next LM (the table in the module docstring)."""
    kinds, out = layer_kinds(f), []
    for name, p in model.named_parameters():
        if name in TOP_NAMES:
            out.append(Entry(TOP_NAMES[name][0], (name,), TOP_NAMES[name][1]))
            continue
        _, i, rest = name.split(".", 2)  # "layers", i, "mixer.wq"
        layer = f"model.layers.{i}."
        heads = f.n_heads if kinds[int(i)] == "A" else f.gdn_k_heads
        if rest in _GROUPED:
            arrays, hf = _GROUPED[rest]
            out.append(Entry(layer + hf, tuple(f"layers.{i}.mixer.{a}" for a in arrays),
                             not rest.startswith("mixer.b"), groups=heads))
        elif rest in _IN_GROUP:
            continue
        elif rest == "mixer.conv_w":
            out.append(Entry(layer + "linear_attn.conv1d.weight", (name,), False, unsqueeze=1))
        elif rest in _DELTANET:
            out.append(Entry(layer + "linear_attn." + _DELTANET[rest], (name,),
                             rest == "mixer.Wout"))
        elif rest in _ATTENTION:
            out.append(Entry(layer + "self_attn." + _ATTENTION[rest], (name,),
                             rest in ("mixer.wk", "mixer.wv", "mixer.wo")))
        elif rest == "ffn.shared_gate":
            out.append(Entry(layer + "mlp.shared_expert_gate.weight", (name,), False,
                             unsqueeze=0))
        elif rest in _FFN:
            out.append(Entry(layer + _FFN[rest], (name,), rest.startswith("ffn.")))
        elif rest in _EXPERTS:
            out += [Entry(f"{layer}mlp.experts.{e}.{_EXPERTS[rest]}.weight", (name,), True, e)
                    for e in range(p.data.shape[0])]
        else:
            raise ValueError(f"hub: parameter {name!r} has no qwen3_next tensor name")
    return out


QWEN3_NEXT = Family("qwen3_next", "Qwen3NextForCausalLM", _from_hf, _to_hf, _claims, _check,
                    names=_names, unused=("mtp.",))
