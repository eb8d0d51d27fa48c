"""The qwen2_vl family (Qwen2VLForConditionalGeneration): the vision tower with its patch
merger and a qwen2 LM with M-RoPE, built as scratchllm/vision/qwen2_vl.py's Qwen2VL.

    library                     transformers (qwen2_vl; the names save_pretrained writes)
    tower.patch.W (CTPP, Dv)    visual.patch_embed.proj.weight (Dv, C, T, P, P): W^T reshaped
    tower.layers.i.norm1, 2     visual.blocks.i.norm1, norm2 (.weight, .bias)
    tower.layers.i.mixer.wq|wk|wv  visual.blocks.i.attn.qkv.weight (3 Dv, Dv): [q | k | v]^T
    tower.layers.i.mixer.bq|bk|bv  visual.blocks.i.attn.qkv.bias
    tower.layers.i.mixer.wo, bo visual.blocks.i.attn.proj (.weight (T), .bias)
    tower.layers.i.ffn.W1, b1   visual.blocks.i.mlp.fc1;  W2, b2: mlp.fc2
    tower.merger.g, b           visual.merger.ln_q
    tower.merger.W1, b1         visual.merger.mlp.0;  W2, b2: mlp.2
    lm.<name>                   the qwen2 family's name of <name> (model.embed_tokens.weight,
                                model.layers.i..., model.norm.weight, lm_head.weight)
config.json: vision_config (depth, embed_dim, num_heads, mlp_ratio, hidden_act, patch_size,
temporal_patch_size, in_channels, spatial_merge_size, rope_parameters axial) and text_config
(qwen2's fields; rope_parameters with mrope_section); tie_word_embeddings at the top.

Reference: huggingface/transformers src/transformers/models/qwen2_vl/modeling_qwen2_vl.py,
configuration_qwen2_vl.py.
Glossary: C channels, T temporal patch size, P patch side, Dv the tower's width.
"""
from dataclasses import replace

from scratchllm.hub.families.base import fail_config, over, require
from scratchllm.hub.families.defaults import with_defaults
from scratchllm.hub.families.dense import QWEN2
from scratchllm.hub.families.modules import ModuleFamily
from scratchllm.hub.layout import Entry
from scratchllm.specs import AttentionSpec, FFNSpec, LayerSpec, Mask, NormSpec, RopeSpec, from_flat
from scratchllm.specs.unflat import flat_view
from scratchllm.specs.vision import MergerSpec
from scratchllm.specs.vision_lm import Qwen2VLConfig
from scratchllm.vision.qwen2_vl import Qwen2VL

_GELU = {"quick_gelu": "quick", "gelu": "none", "gelu_pytorch_tanh": "tanh"}
_ACT = {v: k for k, v in _GELU.items()}


def _tower_layer(vc):
    """The LayerSpec of every tower block of a vision_config."""
    act = vc.get("hidden_act", "quick_gelu")
    if act not in _GELU:
        fail_config(f"qwen2_vl: vision_config hidden_act = {act!r} is not implemented (only "
                    f"{sorted(_GELU)})")
    rope = dict(vc.get("rope_parameters") or {"rope_type": "axial"})
    if rope.get("rope_type", "axial") != "axial":
        fail_config(f"qwen2_vl: vision_config rope_type {rope['rope_type']!r} is not "
                    f"implemented (only 'axial')")
    D, H = vc["embed_dim"], vc["num_heads"]
    if D % H or (D // H) % 4:
        fail_config(f"qwen2_vl: vision_config embed_dim {D} / num_heads {H} must be a head "
                    f"dim that is a multiple of 4 (the axial RoPE's h and w quarters)")
    q = D // H // 4
    attn = AttentionSpec(H, H, qkv_bias=True, o_bias=True, mask=Mask(causal=False),
                         rope=RopeSpec(float(rope.get("rope_theta", 10000.0)),
                                       mrope_section=(q, q), axial=True))
    return LayerSpec(attn, FFNSpec("gelu_mlp", int(D * vc.get("mlp_ratio", 4)),
                                   gelu_approx=_GELU[act]), NormSpec("layernorm", 1e-6))


def _rope(tc):
    """(text_config with rope_parameters of the default type, mrope_section): transformers 5's
    rope_parameters or transformers 4's rope_scaling {"type": "mrope", "mrope_section"}."""
    params = dict(tc.get("rope_parameters") or tc.get("rope_scaling") or {})
    section = tuple(params.pop("mrope_section", (16, 24, 24)))
    kind = params.pop("rope_type", params.pop("type", "default"))
    theta = params.pop("rope_theta", tc.get("rope_theta", 1000000.0))
    if kind not in ("default", "mrope") or params:
        fail_config(f"qwen2_vl: text_config rope {kind!r} {params or ''} with mrope_section is "
                    f"not implemented (only the default frequencies)")
    plain = {k: v for k, v in tc.items() if k not in ("rope_scaling", "rope_theta")}
    return dict(plain, rope_parameters={"rope_type": "default", "rope_theta": theta}), section


def _text(hf, tc):
    """The ModelConfig of a text_config: qwen2's, every layer's RoPE with mrope_section."""
    tc, section = _rope(tc)
    flat = QWEN2.from_hf({**{k: v for k, v in tc.items() if k != "model_type"},
                          "tie_word_embeddings": hf.get("tie_word_embeddings",
                                                        tc.get("tie_word_embeddings", False))})
    text = from_flat(**dict(flat, name="qwen2_vl_text"))
    Dh = text.layers[0].mixer.dh(text.d_model)
    if sum(section) != Dh // 2:
        fail_config(f"qwen2_vl: text_config mrope_section {list(section)} must sum to head "
                    f"dim / 2 = {Dh // 2}")
    layers = tuple(replace(s, mixer=replace(s.mixer, rope=replace(
        s.mixer.rope, mrope_section=section))) for s in text.layers)
    return replace(text, layers=layers)


def _plain(text):
    """The flat view of the LM without its M-RoPE sections (which the flat names cannot say:
    the qwen2 family reads the rest)."""
    return flat_view(replace(text, layers=tuple(replace(s, mixer=replace(s.mixer, rope=replace(
        s.mixer.rope, mrope_section=None))) for s in text.layers)))


def _from_hf(hf):
    require(hf, ("vision_config",), "qwen2_vl")
    vc, tc = with_defaults("qwen2_vl_vision", hf["vision_config"]), hf.get("text_config")
    if tc is None:  # transformers 4's layout: the LM's fields at the top
        tc = {k: v for k, v in hf.items() if k not in ("vision_config", "model_type")}
    tc = with_defaults("qwen2_vl_text", tc)
    text = _text(hf, tc)
    if vc.get("hidden_size", text.d_model) != text.d_model:
        fail_config(f"qwen2_vl: vision_config hidden_size {vc['hidden_size']} (the merger's "
                    f"output) must be text_config hidden_size {text.d_model}")
    layer = _tower_layer(vc)
    return Qwen2VLConfig(
        name="qwen2_vl", d_vision=vc["embed_dim"], layers=(layer,) * vc["depth"],
        patch_size=vc.get("patch_size", 14), temporal_patch_size=vc.get("temporal_patch_size", 2),
        n_channels=vc.get("in_channels", vc.get("in_chans", 3)),
        merger=MergerSpec(merge_size=vc.get("spatial_merge_size", 2)), text=text,
        image_token_id=hf.get("image_token_id", 151655))


def _to_hf(cfg, dtype_name, base=None):
    hf = over(base)
    base = base or {}
    layer = cfg.layers[0]
    a = layer.mixer
    vc = over(base.get("vision_config"))
    vc.update(model_type="qwen2_vl_vision", depth=len(cfg.layers), embed_dim=cfg.d_vision,
              hidden_size=cfg.text.d_model, num_heads=a.n_heads,
              mlp_ratio=layer.ffn.d_ff / cfg.d_vision, hidden_act=_ACT[layer.ffn.gelu_approx],
              patch_size=cfg.patch_size, temporal_patch_size=cfg.temporal_patch_size,
              in_channels=cfg.n_channels, spatial_merge_size=cfg.merger.merge_size,
              rope_parameters={"rope_type": "axial", "rope_theta": a.rope.base})
    if vc["mlp_ratio"] == int(vc["mlp_ratio"]):
        vc["mlp_ratio"] = int(vc["mlp_ratio"])
    f = _plain(cfg.text)
    tc = QWEN2.to_hf(f, dtype_name, over(base.get("text_config"), ("rope_parameters",)))
    for key in ("architectures", "dtype", "rope_theta", "rope_scaling"):
        tc.pop(key, None)
    tc.update(model_type="qwen2_vl_text", rope_parameters={
        "rope_type": "default", "rope_theta": f.rope_base,
        "mrope_section": list(cfg.text.layers[0].mixer.rope.mrope_section)})
    hf.update(architectures=[QWEN2_VL.architecture], model_type="qwen2_vl", vision_config=vc,
              text_config=tc, image_token_id=cfg.image_token_id,
              tie_word_embeddings=cfg.text.tie_embeddings, dtype=dtype_name)
    return hf


def _check(cfg):
    QWEN2.check(replace(_plain(cfg.text), name="qwen2"))
    first = cfg.layers[0]
    if any(s != first for s in cfg.layers) or first.norm != NormSpec("layernorm", 1e-6) \
            or first.placement != "pre" or first.ffn.kind != "gelu_mlp":
        raise ValueError("save_pretrained: a qwen2_vl tower has equal pre-norm blocks with "
                         "LayerNorm(eps 1e-6) and a GELU MLP")


_BLOCK = {"norm1.g": "norm1.weight", "norm1.b": "norm1.bias", "norm2.g": "norm2.weight",
          "norm2.b": "norm2.bias", "mixer.wo": "attn.proj.weight", "mixer.bo": "attn.proj.bias",
          "ffn.W1": "mlp.fc1.weight", "ffn.b1": "mlp.fc1.bias", "ffn.W2": "mlp.fc2.weight",
          "ffn.b2": "mlp.fc2.bias"}
_MERGER = {"g": "ln_q.weight", "b": "ln_q.bias", "W1": "mlp.0.weight", "b1": "mlp.0.bias",
           "W2": "mlp.2.weight", "b2": "mlp.2.bias"}


def _names(model, cfg):
    P, T = cfg.patch_size, cfg.temporal_patch_size
    out = [Entry("visual.patch_embed.proj.weight", ("tower.patch.W",), True,
                 reshape=(cfg.d_vision, cfg.n_channels, T, P, P))]
    for i in range(len(cfg.layers)):
        lib, hf = f"tower.layers.{i}.", f"visual.blocks.{i}."
        out.append(Entry(hf + "attn.qkv.weight", tuple(lib + f"mixer.w{n}" for n in "qkv"), True))
        out.append(Entry(hf + "attn.qkv.bias", tuple(lib + f"mixer.b{n}" for n in "qkv"), False))
        out += [Entry(hf + name, (lib + mine,), name.endswith("weight") and "norm" not in name)
                for mine, name in _BLOCK.items()]
    out += [Entry("visual.merger." + name, ("tower.merger." + mine,), mine[0] == "W")
            for mine, name in _MERGER.items()]
    text = QWEN2.names(model.lm, _plain(cfg.text))
    return out + [e._replace(lib=tuple("lm." + n for n in e.lib)) for e in text]


QWEN2_VL = ModuleFamily("qwen2_vl", "Qwen2VLForConditionalGeneration", _from_hf, _to_hf,
                        claims=lambda cfg: isinstance(cfg, Qwen2VLConfig), check=_check,
                        build=Qwen2VL, names=_names)
