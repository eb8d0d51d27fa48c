"""Models composed from the component packages: the configuration (config: ModelConfig and its
presets, from scratchllm.specs), which Module a spec becomes (mixers, ffn), the one residual
Block (block), the decoder LM (model), the encoder models built from the same Block (encoder:
a masked LM and an encoder-decoder), and sampling through the per-layer decoding states."""
from .block import Block
from .config import ModelConfig, preset
from .encoder import EncoderDecoder, MaskedLM, encoder_layer, masked_lm_config, mlm_corrupt
from .model import LM, loss_pair
from .sampling import generate, generate_ids, heal, sample_next, stream_text

__all__ = ["Block", "EncoderDecoder", "LM", "MaskedLM", "ModelConfig", "encoder_layer",
           "generate", "generate_ids", "heal", "loss_pair", "masked_lm_config", "mlm_corrupt",
           "preset", "sample_next", "stream_text"]
