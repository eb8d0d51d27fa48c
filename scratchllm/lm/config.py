"""The LM's configuration: ModelConfig (a trunk plus one LayerSpec per layer) and the named
presets live in scratchllm.specs, plain Python that teach/ reads too; they are importable from
here as `scratchllm.lm.ModelConfig` and `scratchllm.lm.preset(name, **flat_overrides)`."""
from scratchllm.specs import ModelConfig, preset

__all__ = ["ModelConfig", "preset"]
