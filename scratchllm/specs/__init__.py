"""Frozen specs that describe a model, from the config through the Modules into the pairs.
Plain Python (the standard library only), so teach/ sizes the very objects lm/ builds."""
from scratchllm.specs.attention import (AttentionSpec, Mask, RelativeBiasSpec, RopeSpec,
                                        ScoresSpec, TemperatureSpec)
from scratchllm.specs.ffn import ExpertsSpec, FFNSpec, MoESpec, RouterSpec
from scratchllm.specs.flat import FLAT_NAMES, LAYER_KINDS, from_flat
from scratchllm.specs.mixers import (GatedDeltaNetSpec, Mamba2Spec, MambaSpec, RecurrentSpec,
                                     RWKVSpec)
from scratchllm.specs.mla import IndexerSpec, MLASpec, NSASpec
from scratchllm.specs.model import HeadSpec, LayerSpec, ModelConfig, MTPSpec, NormSpec
from scratchllm.specs.presets import PRESETS, preset
from scratchllm.specs.serialize import from_dict, to_dict

__all__ = ["AttentionSpec", "IndexerSpec", "TemperatureSpec", "Mask", "MLASpec", "NSASpec",
           "RelativeBiasSpec", "RopeSpec", "ScoresSpec", "ExpertsSpec",
           "FFNSpec", "MoESpec", "RouterSpec", "FLAT_NAMES", "LAYER_KINDS", "from_flat",
           "GatedDeltaNetSpec", "Mamba2Spec", "MambaSpec", "RecurrentSpec", "RWKVSpec", "HeadSpec", "LayerSpec",
           "ModelConfig", "MTPSpec", "NormSpec", "PRESETS", "preset", "from_dict", "to_dict"]
