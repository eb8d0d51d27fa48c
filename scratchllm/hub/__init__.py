"""Hugging Face checkpoints as scratchllm models: config.json families (families; Mamba and
Jamba in families_ssm), the tensor names (names, names_ssm) and layouts (layout), and
loading, saving and inspecting them (pretrained).

Stands on lm and what lm stands on; train and cli may import it."""
from .families import FAMILIES, family_of, from_hf_config, to_hf_config
from .pretrained import (grad_dict, load_pretrained, load_tokenizer, read_hf_config,
                         save_pretrained, state_dict)

__all__ = ["FAMILIES", "family_of", "from_hf_config", "grad_dict", "load_pretrained",
           "load_tokenizer", "read_hf_config", "save_pretrained", "state_dict", "to_hf_config"]
