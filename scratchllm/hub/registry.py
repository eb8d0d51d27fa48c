"""The registry of Hugging Face families: every model_type the hub reads and writes, one record
each (families/base.py's Family: its config.json mapping both ways, its tensor names, its
architecture and its checks), and the two ways a record is chosen:

    family_named(model_type)  loading: the record of config.json's model_type
    family_for(f)             saving: the record a config saves as, checked

The chosen record is passed along to what needs it (pretrained.py). The hub builds and
reads model configs only here: config_from_flat(flat) builds one from the flat names a
family's from_hf gives; flat_of(cfg) is the flat view every family reads (f.n_heads, ...).

A family whose model is a Module of its own class (families/modules.py's ModuleFamily: the
vision families) is chosen for saving by module_family_for(cfg) instead.

Adding a family is adding its record to a module of families/ and to FAMILIES below.
"""
from scratchllm.hub.families.base import fail_config
from scratchllm.hub.families.dense import GEMMA3, LLAMA, MISTRAL, QWEN2, QWEN3
from scratchllm.hub.families.deepseek_v32 import DEEPSEEK_V32
from scratchllm.hub.families.dense2 import GEMMA2, OLMO2
from scratchllm.hub.families.encoders import BERT
from scratchllm.hub.families.gpt2 import GPT2
from scratchllm.hub.families.gpt_oss import GPT_OSS
from scratchllm.hub.families.llama4 import LLAMA4_TEXT
from scratchllm.hub.families.llava import LLAVA
from scratchllm.hub.families.modules import ModuleFamily
from scratchllm.hub.families.moe import DEEPSEEK_V3, MIXTRAL
from scratchllm.hub.families.moe2 import DEEPSEEK_V2, QWEN3_MOE
from scratchllm.hub.families.gemma3 import GEMMA3_VL
from scratchllm.hub.families.qwen2_vl import QWEN2_VL
from scratchllm.hub.families.qwen3_next import QWEN3_NEXT
from scratchllm.hub.families.rwkv import RWKV
from scratchllm.hub.families.ssm import JAMBA, MAMBA
from scratchllm.hub.families.ssm2 import MAMBA2
from scratchllm.hub.families.switch import SWITCH
from scratchllm.hub.families.t5 import T5
from scratchllm.hub.families.vision import CLIP_VISION, SIGLIP_VISION, VIT
from scratchllm.specs import from_flat
from scratchllm.specs.unflat import flat_view

FAMILIES = (LLAMA, MISTRAL, QWEN2, QWEN3, GEMMA3, GPT2, GPT_OSS, MIXTRAL, DEEPSEEK_V3, MAMBA,
            JAMBA)
FAMILIES += (OLMO2, GEMMA2)  # families/dense2.py
FAMILIES += (QWEN3_MOE, DEEPSEEK_V2)  # families/moe2.py
FAMILIES += (MAMBA2,)  # families/ssm2.py
FAMILIES += (VIT, SIGLIP_VISION)  # families/vision.py
FAMILIES += (BERT,)  # families/encoders.py
FAMILIES += (CLIP_VISION, LLAVA)  # families/vision.py, families/llava.py
FAMILIES += (T5, SWITCH)  # families/t5.py, families/switch.py
FAMILIES += (LLAMA4_TEXT,)  # families/llama4.py
FAMILIES += (DEEPSEEK_V32,)  # families/deepseek_v32.py
FAMILIES += (RWKV,)  # families/rwkv.py
FAMILIES += (QWEN2_VL, GEMMA3_VL)  # families/qwen2_vl.py, families/gemma3.py
FAMILIES += (QWEN3_NEXT,)  # families/qwen3_next.py
BY_TYPE = {family.model_type: family for family in FAMILIES}


def family_named(model_type):
    """The record of a config.json's model_type; ValueError listing the supported ones."""
    if model_type not in BY_TYPE:
        fail_config(f"model_type {model_type!r} is not supported; supported: {list(BY_TYPE)}")
    return BY_TYPE[model_type]


def family_for(f):
    """The record a config (its flat view f) saves as, after its check: the family f.name
    names when it names one (a loaded checkpoint keeps its model_type as its name), else the
    family whose shape claims f (a preset's config: dense saves as llama, moe as mixtral, mla
    as deepseek_v3, hybrid as jamba). ValueError naming what the family cannot express, or
    that no family has the config's shape."""
    family = BY_TYPE.get(f.name) or next((r for r in FAMILIES if r.claims(f)), None)
    if family is None:
        raise ValueError(
            f"save_pretrained: config {f.name!r} (attention={f.attention!r}, ffn={f.ffn!r}, "
            f"layer_pattern={f.layer_pattern!r}, n_sink={f.n_sink}, norm={f.norm!r}, "
            f"block={f.block!r}) has the shape of none of the families {list(BY_TYPE)}; "
            f"name it after one (name='llama', ...) to see what that family cannot express")
    family.check(f)
    return family


def module_family_for(cfg):
    """The ModuleFamily a model config of its own class (a VisionConfig) saves as, after its
    check: the family cfg.name names, else the one whose shape claims cfg."""
    family = BY_TYPE.get(cfg.name)
    if not isinstance(family, ModuleFamily):
        family = next((r for r in FAMILIES if isinstance(r, ModuleFamily) and r.claims(cfg)),
                      None)
    if family is None:
        raise ValueError(f"save_pretrained: config {cfg.name!r} ({type(cfg).__name__}) has the "
                         f"shape of none of the families {list(BY_TYPE)}")
    family.check(cfg)
    return family


def config_from_flat(flat):
    """The model config of flat names ({"vocab_size": ..., "n_heads": ..., ...})."""
    return from_flat(**flat)


def flat_of(cfg):
    """The flat view of a model config: every flat name as an attribute (f.n_heads, f.window,
    ...), the only way the hub reads a config."""
    return flat_view(cfg)
