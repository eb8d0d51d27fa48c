"""Every family the hub reads and writes, and which module holds it: families.py, names.py
(llama, mistral, qwen2, qwen3, gpt2, gemma3_text, and gpt_oss through their extra_family)
and the MoE ones of families_moe.py, names_moe.py (mixtral, deepseek_v3). pretrained.py
asks this module.

    from_hf_config(hf)        config.json dict -> ModelConfig fields, by its model_type
    family_of(cfg)            the family a ModelConfig saves as (ValueError if none can)
    to_hf_config(cfg, ...)    ModelConfig -> config.json dict of that family
    entries(model)            [names.Entry]: every HF tensor of the model and its Params
"""
from scratchllm.hub import families, families_moe, names, names_moe

FAMILIES = families.FAMILIES + families_moe.FAMILIES


def from_hf_config(hf):
    """ModelConfig fields (a dict) of a config.json dict; ValueError naming the field for an
    unsupported model_type or option."""
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise ValueError(f"load_pretrained: config.json: model_type {family!r} is not "
                         f"supported; supported: {list(FAMILIES)}")
    module = families_moe if family in families_moe.FAMILIES else families
    return module.from_hf_config(hf)


def family_of(cfg):
    """The transformers family a ModelConfig is an instance of; ValueError for a config no
    family covers, or one whose family cannot express one of its options."""
    return (families_moe if families_moe.moe_family(cfg) else families).family_of(cfg)


def to_hf_config(cfg, dtype_name, base=None):
    """A config.json dict for a ModelConfig, over `base` (the loaded config.json)."""
    module = families_moe if families_moe.moe_family(cfg) else families
    return module.to_hf_config(cfg, dtype_name, base)


def entries(model):
    """[names.Entry] for every Param (and saved buffer) of an LM of a supported family."""
    return (names_moe if families_moe.moe_family(model.cfg) else names).entries(model)
