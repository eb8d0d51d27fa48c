"""Language models composed from the component packages: ModelConfig and its presets (config),
which Module each block gets (mixers), the decoder LM (model), and sampling through the
per-layer decoding states (sampling)."""
from .config import PRESETS, ModelConfig, preset
from .model import LM, loss_pair
from .sampling import generate, generate_ids, sample_next

__all__ = ["LM", "ModelConfig", "PRESETS", "generate", "generate_ids", "loss_pair", "preset",
           "sample_next"]
