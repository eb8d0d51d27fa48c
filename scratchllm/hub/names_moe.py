"""Which Hugging Face tensor each Param of a Mixtral or DeepSeek-V3 LM is, and in what layout
(names.py has the rule: the library's W (Din, Dout) is torch's weight (Dout, Din), "T").

The library stacks the experts of a layer into one Param per matrix (w1, w3 (E, D, F), w2
(E, F, D)); the checkpoints hold one tensor per expert, so expert e is the slice [e] of a
stacked Param. That is what transformers' save_pretrained writes and what the published
checkpoints hold (transformers 5 fuses the experts in memory, experts.gate_up_proj
(E, 2F, D) = [w1[e]^T; w3[e]^T], and converts on loading and saving).

    library                         mixtral: model.layers.i.block_sparse_moe.
    ffn.w_router (D, E)             gate.weight (E, D)                                  T
    ffn.w1[e] / w3[e] (D, F)        experts.e.w1.weight / experts.e.w3.weight (F, D)    T
    ffn.w2[e] (F, D)                experts.e.w2.weight (D, F)                          T
(attention, norms, embedding and head as llama: names.py)

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

Glossary: D model width, E experts, F expert width, H heads, dn / dr / dv the nope / rope /
value head dims, Dc kv_lora_rank, Dq q_lora_rank.
"""
from scratchllm.hub.families_moe import moe_family
from scratchllm.hub.names import _TOP, LAYER_NAMES, Entry

_MLA = {
    "mixer.wq": ("self_attn.q_proj.weight", True),
    "mixer.wq_a": ("self_attn.q_a_proj.weight", True),
    "mixer.q_norm": ("self_attn.q_a_layernorm.weight", False),
    "mixer.wq_b": ("self_attn.q_b_proj.weight", True),
    "mixer.wkv_a": ("self_attn.kv_a_proj_with_mqa.weight", True),
    "mixer.kv_norm": ("self_attn.kv_a_layernorm.weight", False),
    "mixer.wkv_b": ("self_attn.kv_b_proj.weight", True),
    "mixer.wo": ("self_attn.o_proj.weight", True),
}
_LAYERS = {
    "mixtral": dict(LAYER_NAMES, **{"ffn.w_router": ("block_sparse_moe.gate.weight", True)}),
    "deepseek_v3": dict(LAYER_NAMES, **_MLA, **{
        "ffn.w_router": ("mlp.gate.weight", True),
        "ffn.shared_w1": ("mlp.shared_experts.gate_proj.weight", True),
        "ffn.shared_w3": ("mlp.shared_experts.up_proj.weight", True),
        "ffn.shared_w2": ("mlp.shared_experts.down_proj.weight", True)}),
}
_EXPERTS = {  # family: (prefix in the layer, {library Param: per-expert tensor})
    "mixtral": ("block_sparse_moe.experts", {"ffn.w1": "w1", "ffn.w3": "w3", "ffn.w2": "w2"}),
    "deepseek_v3": ("mlp.experts", {"ffn.w1": "gate_proj", "ffn.w3": "up_proj",
                                    "ffn.w2": "down_proj"}),
}
_BIAS = "mlp.gate.e_score_correction_bias"  # deepseek_v3's selection bias


def entries(model):
    """[Entry] for every Param (and DeepSeek-V3's selection-bias buffers) of a Mixtral- or
    DeepSeek-V3-shaped LM."""
    family = moe_family(model.cfg)
    layer_names = _LAYERS[family]
    prefix, experts = _EXPERTS[family]
    out = []
    for name, p in model.named_parameters():
        if name in _TOP:
            out.append(Entry(_TOP[name][0], (name,), _TOP[name][1]))
            continue
        _, i, rest = name.split(".", 2)  # "layers", i, "ffn.w1"
        layer = f"model.layers.{i}."
        if rest in experts:
            out += [Entry(f"{layer}{prefix}.{e}.{experts[rest]}.weight", (name,), True, e)
                    for e in range(p.data.shape[0])]
        elif rest in layer_names:
            out.append(Entry(layer + layer_names[rest][0], (name,), layer_names[rest][1]))
        else:
            raise ValueError(f"hub: parameter {name!r} has no {family} name")
    if family == "deepseek_v3":
        out += [Entry(f"model.layers.{name.split('.')[1]}.{_BIAS}", (name,), False,
                      buffer=True) for name, _ in model.named_buffers()]
    return out
