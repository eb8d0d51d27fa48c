"""Hugging Face checkpoints as scratchllm models: one registry of families (registry.py; one
record per model_type in families/: its config.json mapping both ways, its tensor names and
checks), the tensor layouts (layout.py), and loading, saving and inspecting checkpoints
(pretrained.py).

Stands on lm and what lm stands on; train and cli may import it."""
from .families.base import Family
from .pretrained import (eos_ids, grad_dict, load_pretrained, load_tokenizer, read_hf_config,
                         save_pretrained, state_dict)
from .registry import FAMILIES, config_from_flat, family_for, family_named, flat_of

__all__ = ["FAMILIES", "Family", "config_from_flat", "eos_ids", "family_for", "family_named",
           "flat_of", "grad_dict", "load_pretrained", "load_tokenizer", "read_hf_config",
           "save_pretrained", "state_dict"]
