"""The record of a Hugging Face family whose model is a Module of its own class, built from a
config of its own (a Vision Transformer from a VisionConfig), not the decoder LM from a
ModelConfig's flat view: the same questions as base.py's Family, asked of that config.

Loading (pretrained.py): from_hf(config.json) -> cfg, build(cfg) -> model, names(model, cfg)
-> the tensors read. Saving: the record the model's cfg names (cfg.name, a loaded
checkpoint's model_type) or the one whose shape claims it (registry.module_family_for).
"""
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class ModuleFamily:
    """One Hugging Face model_type built as a Module of its own.

    model_type     config.json's model_type; a loaded model's cfg.name keeps it
    architecture   config.json's architectures entry (the transformers class)
    from_hf(hf)    config.json dict -> the model's config (a spec, e.g. VisionConfig);
                   ValueError (base.fail_config) naming a field the library does not implement
    to_hf(cfg, dtype_name, base)  the config -> config.json dict, written over `base` (the
                   loaded config.json or None: the fields the library does not use survive)
    claims(cfg)    whether a config (of any class) not named after a family has this shape
    check(cfg)     ValueError (base.refuse) naming what the family cannot express
    build(cfg, rng, dtype)  the Module (its Params drawn from rng, or left for the loader)
    names(model, cfg)  [layout.Entry]: every HF tensor and the library arrays it is made of
    old_prefix     a prefix that older checkpoints put before every tensor name, dropped on
                   loading ("vision_model.": SigLIP vision towers saved by transformers 4)
    renames        ((old, new), ...): parts of the names older checkpoints write, replaced on
                   loading (a vision-language model's tower saved by transformers 4 under
                   vision_tower.vision_model.)
    unused         prefixes of tensors a checkpoint may carry that the model does not read
                   (T5's per-stack copies of the shared embedding): read past
    tied_head      (head tensor, embedding tensor) of a model whose config ties them: a
                   checkpoint holding the head with other values than the embedding loads
                   untied (cfg.tie_embeddings False), as transformers 5 does; () for none
    """
    model_type: str
    architecture: str
    from_hf: Callable
    to_hf: Callable
    claims: Callable
    check: Callable
    build: Callable
    names: Callable
    old_prefix: str = ""
    renames: tuple = ()
    unused: tuple = ()
    tied_head: tuple = ()
