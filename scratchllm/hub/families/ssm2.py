"""More state-space families: mamba2. No math here: the LM builds it from the library's Mamba-2
block (ssm/mamba2.py, on the SSD pair of ssm/ssd.py).

    mamba2  Mamba-2 (Dao & Gu 2024, arXiv 2405.21060): every layer is x + mixer(rmsnorm(x))
            with the Mamba-2 block as the mixer and no FFN (ffn="none"); HF Mamba2ForCausalLM.
            n_groups G (the library's Mamba2Spec.n_groups, flat ssm_groups): B and C in G
            groups of N, each shared by H / G heads, and the gated RMSNorm over each of the
            G slices of Di apart (transformers' MambaRMSNormGated); the library's gated
            RMSNorm has eps 1e-5, so layer_norm_epsilon (which transformers uses for it and
            for the block norms) must be 1e-5.

Fields that change nothing in a float32 or float64 forward are accepted: residual_in_fp32,
chunk_size (another chunking of the same scan), the time_step_{min,max,floor} and
initializer fields (initialisation only); time_step_limit must be (0, inf) (no clamp). A field
whose other value changes the math but is not implemented (use_bias, use_conv_bias = false,
another layer_norm_epsilon) is an error naming it.

Names (layout.py: "T" transposed, nn.Linear's (out, in); "+1" Conv1d's size-1 axis; "|"
concatenated along the library's last axis, in this order):

    library (Mamba2 block)                  HF Mamba2Mixer: backbone.layers.i.mixer.*
    mixer.Wz | Wx | WB | WC | Wdt (D, ...)  in_proj.weight (Di + Di + 2GN + H, D)    T |
    mixer.conv_w (Di + 2GN, K), conv_b      conv1d.weight (Di + 2GN, 1, K), conv1d.bias +1
    mixer.dt_bias, A_log, D (H,)            dt_bias, A_log, D
    mixer.norm (Di,)                        norm.weight
    mixer.Wout (Di, D)                      out_proj.weight (D, Di)                   T
    embed.E, norm1.g, norm.g, head.W        backbone.embeddings.weight,
                                            backbone.layers.i.norm.weight,
                                            backbone.norm_f.weight, lm_head.weight (T)
Reference: huggingface/transformers src/transformers/models/mamba2/modeling_mamba2.py
(Mamba2Mixer, MambaRMSNormGated, Mamba2Block), configuration_mamba2.py (the defaults below).
Glossary: D model width, Di inner width (expand * D), H heads, N state size, G groups, K
conv kernel.
"""
from scratchllm.hub.families.base import (Family, differences, fail_config, layer_kinds, only,
                                          over, refuse, require)
from scratchllm.hub.layout import Entry

_MAMBA2 = dict(layer_norm_epsilon=1e-5, state_size=128, conv_kernel=4, expand=2, n_groups=8,
               num_heads=128, head_dim=64, tie_word_embeddings=False,
               time_step_limit=(0.0, float("inf")))
_GATED_NORM_EPS = 1e-5  # ssm/mamba2.py's NORM_EPS
_MAMBA2_NEEDS = dict(norm="rmsnorm", block="pre", norm_offset=0.0, embed_scale=False,
                     ffn="none", norm_eps=_GATED_NORM_EPS, logit_softcap=None)
_IN_PROJ = ("Wz", "Wx", "WB", "WC", "Wdt")
_MIXER = {"dt_bias": "dt_bias", "A_log": "A_log", "D": "D", "norm": "norm.weight",
          "conv_b": "conv1d.bias"}
_TOP = {"embed.E": "backbone.embeddings.weight", "norm.g": "backbone.norm_f.weight"}


def _mamba2_from_hf(hf):
    require(hf, ("vocab_size", "hidden_size", "num_hidden_layers"), "mamba2")
    only(hf, dict(use_bias=False, use_conv_bias=True, hidden_act="silu"), "mamba2")
    hf = {**_MAMBA2, **hf}
    if float(hf["layer_norm_epsilon"]) != _GATED_NORM_EPS:
        fail_config(f"layer_norm_epsilon = {hf['layer_norm_epsilon']!r} is not implemented for "
                    f"mamba2 (only {_GATED_NORM_EPS!r}, the library's gated RMSNorm eps)")
    lo, hi = (_number(v) for v in hf["time_step_limit"])
    if lo != 0.0 or hi != float("inf"):
        fail_config(f"time_step_limit = {hf['time_step_limit']!r} is not implemented for "
                    f"mamba2 (only (0.0, inf): no clamp of the time step)")
    D, L, H = hf["hidden_size"], hf["num_hidden_layers"], hf["num_heads"]
    if hf["expand"] * D != H * hf["head_dim"]:
        fail_config(f"num_heads * head_dim = {H} * {hf['head_dim']} must equal expand * "
                    f"hidden_size = {hf['expand']} * {D}")
    return dict(name="mamba2", vocab_size=hf["vocab_size"], d_model=D, n_layers=L,
                layer_pattern="S" * L, ffn="none", n_heads=H, n_kv_heads=H, positions="nope",
                d_state=hf["state_size"], d_conv=hf["conv_kernel"], expand=hf["expand"],
                ssm_groups=hf["n_groups"], norm_eps=float(hf["layer_norm_epsilon"]),
                tie_embeddings=bool(hf["tie_word_embeddings"]))


def _number(value):
    """A config.json number; transformers writes inf as {"__float__": "Infinity"}."""
    return float(value["__float__"]) if isinstance(value, dict) else float(value)


def _mamba2_to_hf(f, dtype_name, base=None):
    hf = over(base)
    Di = f.expand * f.d_model
    hf.update(architectures=[MAMBA2.architecture], model_type="mamba2",
              vocab_size=f.vocab_size, hidden_size=f.d_model, num_hidden_layers=f.n_layers,
              tie_word_embeddings=f.tie_embeddings, hidden_act="silu", dtype=dtype_name,
              state_size=f.d_state, conv_kernel=f.d_conv, expand=f.expand,
              n_groups=f.ssm_groups,
              num_heads=f.n_heads, head_dim=Di // f.n_heads, layer_norm_epsilon=f.norm_eps,
              use_bias=False, use_conv_bias=True)
    return hf


def _mamba2_check(f):
    differ = differences(f, _MAMBA2_NEEDS)
    if set(layer_kinds(f)) != {"S"}:
        differ["layer_pattern"] = f"layer_pattern={'S' * f.n_layers!r}"
    if f.positions not in ("rope", "nope"):  # the others change the embedding
        differ["positions"] = "positions='nope' (Mamba-2 has no position embedding)"
    refuse(f, "mamba2", differ)


def _mamba2_names(model, f):
    """[Entry] for every Param: in_proj is the five input projections side by side."""
    out = [Entry(hf, (lib,), False) for lib, hf in _TOP.items()]
    if not f.tie_embeddings:
        out.append(Entry("lm_head.weight", ("head.W",), True))
    for i in range(f.n_layers):
        lib, hf = f"layers.{i}.", f"backbone.layers.{i}."
        out += [Entry(hf + "norm.weight", (lib + "norm1.g",), False),
                Entry(hf + "mixer.in_proj.weight", tuple(f"{lib}mixer.{n}" for n in _IN_PROJ),
                      True),
                Entry(hf + "mixer.conv1d.weight", (lib + "mixer.conv_w",), False, unsqueeze=1),
                Entry(hf + "mixer.out_proj.weight", (lib + "mixer.Wout",), True)]
        out += [Entry(f"{hf}mixer.{name}", (f"{lib}mixer.{leaf}",), False)
                for leaf, name in _MIXER.items()]
    return out


MAMBA2 = Family(
    "mamba2", "Mamba2ForCausalLM", _mamba2_from_hf, _mamba2_to_hf,
    claims=lambda f: set(layer_kinds(f)) == {"S"} and f.ffn == "none", check=_mamba2_check,
    names=_mamba2_names)
