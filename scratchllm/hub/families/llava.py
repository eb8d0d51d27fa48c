"""The llava family (LlavaForConditionalGeneration): a vision tower, a two-layer GELU projector
and a decoder LM, each read by its own family's record (config.json's vision_config and
text_config), built as scratchllm/vision/llava.py's Llava.

    library             transformers (llava)
    tower.<name>        vision_tower.<the tower family's name of <name>>
    proj1.W, proj1.b    multi_modal_projector.linear_1.weight (T), .bias
    proj2.W, proj2.b    multi_modal_projector.linear_2.weight (T), .bias
    lm.<name>           language_model.<the text family's name of <name>>
                        (language_model.model.embed_tokens.weight, language_model.lm_head...)
Vision towers: siglip_vision_model and clip_vision_model (LLaVA-1.5's, with
vision_feature_select_strategy "default" dropping its [CLS]). Text: llama, mistral, qwen2,
qwen3.

Reference: huggingface/transformers src/transformers/models/llava/modeling_llava.py.
"""
from scratchllm.hub.families.base import fail_config, over, require
from scratchllm.hub.families.defaults import with_defaults
from scratchllm.hub.families.dense import LLAMA, MISTRAL, QWEN2, QWEN3
from scratchllm.hub.families.modules import ModuleFamily
from scratchllm.hub.families.vision import CLIP_VISION, SIGLIP_VISION
from scratchllm.hub.layout import Entry
from scratchllm.specs import from_flat
from scratchllm.specs.unflat import flat_view
from scratchllm.specs.vision_lm import LlavaConfig
from scratchllm.vision.llava import Llava

TEXT = {f.model_type: f for f in (LLAMA, MISTRAL, QWEN2, QWEN3)}
TOWERS = {f.model_type: f for f in (CLIP_VISION, SIGLIP_VISION)}
TOWER_RENAMES = (("vision_tower.vision_model.", "vision_tower."),)  # transformers 4's names
_ACT = {"gelu": "none", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}


def _text_family(model_type):
    if model_type not in TEXT:
        fail_config(f"llava: text_config model_type {model_type!r} is not implemented (only "
                    f"{sorted(TEXT)})")
    return TEXT[model_type]


def _from_hf(hf):
    require(hf, ("vision_config", "text_config"), "llava")
    vc = {"model_type": "clip_vision_model", **hf["vision_config"]}  # LlavaConfig's default
    tc = {"model_type": "llama", **hf["text_config"]}
    tc = with_defaults(tc["model_type"], tc)  # transformers 4 wrote the changed fields only
    if vc.get("model_type") not in TOWERS:
        fail_config(f"llava: vision_config model_type {vc.get('model_type')!r} is not "
                    f"implemented (only {sorted(TOWERS)})")
    layer = hf.get("vision_feature_layer", -2)
    if not isinstance(layer, int):
        fail_config(f"llava: vision_feature_layer = {layer!r} (several layers) is not "
                    f"implemented (only one int)")
    act = hf.get("projector_hidden_act", "gelu")
    if act not in _ACT:
        fail_config(f"llava: projector_hidden_act = {act!r} is not implemented (only "
                    f"{sorted(_ACT)})")
    text = from_flat(**_text_family(tc["model_type"]).from_hf(tc))
    image_token = hf.get("image_token_id", hf.get("image_token_index", 32000))
    return LlavaConfig(name="llava", vision=TOWERS[vc["model_type"]].from_hf(vc), text=text,
                       feature_layer=layer,
                       select=hf.get("vision_feature_select_strategy", "default"),
                       projector_bias=bool(hf.get("multimodal_projector_bias", True)),
                       gelu_approx=_ACT[act], image_token_id=image_token)


def _tower(cfg):
    """The family of a LlavaConfig's vision tower: its name's, else by its shape."""
    return TOWERS.get(cfg.vision.name) or (CLIP_VISION if cfg.vision.norm_cls
                                           else SIGLIP_VISION)


def _sub_config(hf, drop=("architectures", "dtype")):
    return {k: v for k, v in hf.items() if k not in drop}


def _to_hf(cfg, dtype_name, base=None):
    hf = over(base, ("image_token_id",))
    base = base or {}
    text = TEXT[cfg.text.name] if cfg.text.name in TEXT else LLAMA
    hf.update(
        architectures=[LLAVA.architecture], model_type=LLAVA.model_type,
        vision_config=_sub_config(_tower(cfg).to_hf(cfg.vision, dtype_name,
                                                    base.get("vision_config"))),
        text_config=_sub_config(text.to_hf(flat_view(cfg.text), dtype_name,
                                           base.get("text_config"))),
        image_token_index=cfg.image_token_id, vision_feature_layer=cfg.feature_layer,
        vision_feature_select_strategy=cfg.select,
        projector_hidden_act="gelu" if cfg.gelu_approx == "none" else "gelu_pytorch_tanh",
        multimodal_projector_bias=cfg.projector_bias, dtype=dtype_name)
    return hf


def _check(cfg):
    _tower(cfg).check(cfg.vision)
    f = flat_view(cfg.text)
    (TEXT[f.name] if f.name in TEXT else LLAMA).check(f)


def _names(model, cfg):
    out = [e._replace(hf="vision_tower." + e.hf, lib=tuple("tower." + n for n in e.lib))
           for e in _tower(cfg).names(model.tower, cfg.vision)]
    proj = {"proj1.W": "linear_1.weight", "proj1.b": "linear_1.bias",
            "proj2.W": "linear_2.weight", "proj2.b": "linear_2.bias"}
    params = dict(model.named_parameters())
    out += [Entry("multi_modal_projector." + hf, (lib,), lib.endswith(".W"))
            for lib, hf in proj.items() if lib in params]
    f = flat_view(cfg.text)
    text = TEXT[f.name] if f.name in TEXT else LLAMA
    out += [e._replace(hf="language_model." + e.hf, lib=tuple("lm." + n for n in e.lib))
            for e in text.names(model.lm, f)]
    return out


LLAVA = ModuleFamily("llava", "LlavaForConditionalGeneration", _from_hf, _to_hf,
                     claims=lambda cfg: isinstance(cfg, LlavaConfig), check=_check,
                     build=Llava, names=_names,
                     renames=TOWER_RENAMES)
