"""The gemma3 family (Gemma3ForConditionalGeneration): a SigLIP vision tower, the pooled
projector and a Gemma 3 LM, built as scratchllm/vision/gemma3.py's Gemma3VL. The text-only
Gemma 3 (gemma3_text) is families/dense.py's.

    library             transformers (gemma3)
    tower.<name>        vision_tower.<the siglip_vision_model family's name of <name>>
    proj.g (Dv,)        multi_modal_projector.mm_soft_emb_norm.weight (Gemma's w of 1 + w)
    proj.W (Dv, Dt)     multi_modal_projector.mm_input_projection_weight (not transposed)
    lm.<name>           language_model.<the gemma3_text family's name of <name>>
                        (language_model.model.embed_tokens.weight, ...; the head is tied)
config.json: vision_config (a siglip_vision_model's), text_config (a gemma3_text's),
mm_tokens_per_image, image_token_index (image_token_id), boi/eoi_token_index (kept).

Reference: huggingface/transformers src/transformers/models/gemma3/modeling_gemma3.py,
configuration_gemma3.py.
Glossary: Dv the tower's width, Dt the LM's.
"""
from scratchllm.hub.families.base import fail_config, over, require
from scratchllm.hub.families.defaults import with_defaults
from scratchllm.hub.families.dense import GEMMA3
from scratchllm.hub.families.llava import TOWER_RENAMES
from scratchllm.hub.families.modules import ModuleFamily
from scratchllm.hub.families.vision import SIGLIP_VISION
from scratchllm.hub.layout import Entry
from scratchllm.specs import from_flat
from scratchllm.specs.unflat import flat_view
from scratchllm.specs.vision_lm import Gemma3VLConfig, PoolProjectorSpec
from scratchllm.vision.gemma3 import Gemma3VL


def _from_hf(hf):
    require(hf, ("vision_config", "text_config"), "gemma3")
    vc = hf["vision_config"]
    tc = with_defaults("gemma3_text", hf["text_config"])  # transformers 4: changed fields only
    if vc.get("model_type", "siglip_vision_model") != "siglip_vision_model" or vc.get(
            "vision_use_head", False):
        fail_config(f"gemma3: vision_config must be a siglip_vision_model without its pooling "
                    f"head, got model_type {vc.get('model_type')!r}, vision_use_head "
                    f"{vc.get('vision_use_head')!r}")
    text = from_flat(**GEMMA3.from_hf({**tc, "tie_word_embeddings": tc.get(
        "tie_word_embeddings", hf.get("tie_word_embeddings", True))}))
    vision = SIGLIP_VISION.from_hf({"model_type": "siglip_vision_model", **vc})
    return Gemma3VLConfig(
        name="gemma3", vision=vision, text=text,
        projector=PoolProjectorSpec(hf.get("mm_tokens_per_image", 256),
                                    float(vc.get("layer_norm_eps", 1e-6))),
        image_token_id=hf.get("image_token_id", hf.get("image_token_index", 262144)))


def _to_hf(cfg, dtype_name, base=None):
    hf = over(base, ("image_token_id",))
    base = base or {}
    vc = SIGLIP_VISION.to_hf(cfg.vision, dtype_name, base.get("vision_config"))
    tc = GEMMA3.to_hf(flat_view(cfg.text), dtype_name, base.get("text_config"))
    for sub in (vc, tc):
        for key in ("architectures", "dtype"):
            sub.pop(key, None)
    vc["vision_use_head"] = False
    hf.update(architectures=[GEMMA3_VL.architecture], model_type="gemma3", vision_config=vc,
              text_config=tc, mm_tokens_per_image=cfg.projector.tokens_per_image,
              image_token_index=cfg.image_token_id, tie_word_embeddings=cfg.text.tie_embeddings,
              dtype=dtype_name)
    return hf


def _check(cfg):
    SIGLIP_VISION.check(cfg.vision)
    GEMMA3.check(flat_view(cfg.text))
    if cfg.projector.offset != 1.0 or cfg.projector.eps != cfg.vision.norm.eps:
        raise ValueError(f"save_pretrained: a gemma3 projector norm has gain 1 + w and the "
                         f"tower's eps {cfg.vision.norm.eps}; got offset "
                         f"{cfg.projector.offset}, eps {cfg.projector.eps}")


def _names(model, cfg):
    out = [e._replace(hf="vision_tower." + e.hf, lib=tuple("tower." + n for n in e.lib))
           for e in SIGLIP_VISION.names(model.tower, cfg.vision)]
    out += [Entry("multi_modal_projector.mm_soft_emb_norm.weight", ("proj.g",), False),
            Entry("multi_modal_projector.mm_input_projection_weight", ("proj.W",), False)]
    return out + [e._replace(hf="language_model." + e.hf, lib=tuple("lm." + n for n in e.lib))
                  for e in GEMMA3.names(model.lm, flat_view(cfg.text))]


GEMMA3_VL = ModuleFamily("gemma3", "Gemma3ForConditionalGeneration", _from_hf, _to_hf,
                         claims=lambda cfg: isinstance(cfg, Gemma3VLConfig), check=_check,
                         build=Gemma3VL, names=_names,
                         renames=TOWER_RENAMES)
