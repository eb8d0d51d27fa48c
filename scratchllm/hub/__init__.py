"""Hugging Face checkpoints as scratchllm models: config.json families (families; Mamba and
Jamba in families_ssm, the MoE ones in families_moe), the tensor names (names, names_ssm,
names_moe) and layouts (layout), the choice between them (catalog), and loading, saving and
inspecting them (pretrained).

Stands on lm and what lm stands on; train and cli may import it."""
from .catalog import FAMILIES, family_of, from_hf_config, to_hf_config
from .pretrained import (eos_ids, grad_dict, load_pretrained, load_tokenizer, read_hf_config,
                         save_pretrained, state_dict)

__all__ = ["FAMILIES", "eos_ids", "family_of", "from_hf_config", "grad_dict", "load_pretrained",
           "load_tokenizer", "read_hf_config", "save_pretrained", "state_dict", "to_hf_config"]
