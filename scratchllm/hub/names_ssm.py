"""Which Hugging Face tensor each library Param of a Mamba or Jamba LM is, and in what layout
(layout.py: "T" transposed, nn.Linear's (out, in); "[e]" expert e of a stacked Param; "+1"
Conv1d's size-1 axis).

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
from scratchllm.hub.families_ssm import is_ssm, ssm_family_of
from scratchllm.hub.layout import Entry

__all__ = ["is_ssm", "ssm_entries"]

_MIXER = {"W_in": ("in_proj.weight", True), "conv_b": ("conv1d.bias", False),
          "W_x": ("x_proj.weight", True), "W_dt": ("dt_proj.weight", True),
          "b_dt": ("dt_proj.bias", False), "A_log": ("A_log", False), "D": ("D", False),
          "W_out": ("out_proj.weight", True), "dt_norm": ("dt_layernorm.weight", False),
          "B_norm": ("b_layernorm.weight", False), "C_norm": ("c_layernorm.weight", False)}
_ATTENTION = {f"w{x}": (f"self_attn.{x}_proj.weight", True) for x in "qkvo"}
_FFN = {"W1": "gate_proj", "W3": "up_proj", "W2": "down_proj"}
_EXPERTS = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_TOP = {"mamba": {"embed.E": "backbone.embeddings.weight", "norm.g": "backbone.norm_f.weight"},
        "jamba": {"embed.E": "model.embed_tokens.weight", "norm.g": "model.final_layernorm.weight"}}
_PREFIX = {"mamba": ("backbone.layers", "mixer"), "jamba": ("model.layers", "mamba")}
_NORMS = {"mamba": {"norm1.g": "norm.weight"},
          "jamba": {"norm1.g": "input_layernorm.weight", "norm2.g": "pre_ff_layernorm.weight"}}


def _layer_entries(family, layer, i, attention, rest):
    """[Entry] of Param `layers.i.<rest>`; `layer` the Block (for the expert count)."""
    prefix, mixer = _PREFIX[family]
    p, lib = f"{prefix}.{i}.", (f"layers.{i}.{rest}",)
    group, _, leaf = rest.partition(".")
    if rest in _NORMS[family]:
        return [Entry(p + _NORMS[family][rest], lib, False)]
    if group == "mixer" and attention:
        hf, t = _ATTENTION[leaf]
        return [Entry(p + hf, lib, t)]
    if group == "mixer" and leaf == "conv_w":
        return [Entry(p + f"{mixer}.conv1d.weight", lib, False, unsqueeze=1)]
    if group == "mixer":
        hf, t = _MIXER[leaf]
        return [Entry(p + f"{mixer}.{hf}", lib, t)]
    if leaf in _FFN:
        return [Entry(p + f"feed_forward.{_FFN[leaf]}.weight", lib, True)]
    if leaf == "w_router":
        return [Entry(p + "feed_forward.router.weight", lib, True)]
    return [Entry(p + f"feed_forward.experts.{e}.{_EXPERTS[leaf]}.weight", lib, True, expert=e)
            for e in range(layer.ffn.w1.data.shape[0])]


def ssm_entries(model):
    """[Entry] for every Param of a Mamba or Jamba LM; ValueError (naming the option) for a
    config neither family expresses."""
    family = ssm_family_of(model.cfg)
    kinds = model.cfg.layer_kinds()
    out = []
    for name, _ in model.named_parameters():
        if name in _TOP[family]:
            out.append(Entry(_TOP[family][name], (name,), False))
        elif name == "head.W":
            out.append(Entry("lm_head.weight", (name,), True))
        else:
            _, i, rest = name.split(".", 2)  # "layers", i, "mixer.W_in"
            out += _layer_entries(family, model.layers[int(i)], i, kinds[int(i)] == "A", rest)
    return out
