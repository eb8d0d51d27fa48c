"""Models composed from the component packages: the configuration (config: ModelConfig and its
presets, from scratchllm.specs), which Module a spec becomes (mixers, ffn), the one residual
Block (block), the decoder LM (model), the encoder models built from the same Block (encoder:
a masked LM and an encoder-decoder), the encoder-decoder LM of a Seq2SeqConfig (seq2seq:
T5, Switch), padded batches for the decoder LM (padding), a tiny embedding model trained for
retrieval (retrieval), and sampling through the per-layer decoding states."""
from .block import Block
from .config import ModelConfig, preset
from .encoder import EncoderDecoder, MaskedLM, encoder_layer, masked_lm_config, mlm_corrupt
from .model import LM, loss_pair
from .padding import generates_padded, pad_rows, padded_positions, prefill_padded
from .sampling import (encode_prompt, generate, generate_batch_ids, generate_ids,
                       generate_seq2seq_ids, heal, sample_next, stream_text)
from .seq2seq import Seq2SeqLM, Seq2SeqState

__all__ = ["Block", "EncoderDecoder", "LM", "MaskedLM", "ModelConfig", "encode_prompt",
           "encoder_layer", "generate", "generate_batch_ids", "generate_ids",
           "generate_seq2seq_ids", "generates_padded", "heal", "loss_pair", "masked_lm_config",
           "mlm_corrupt", "pad_rows", "padded_positions", "prefill_padded", "preset",
           "sample_next", "Seq2SeqLM", "Seq2SeqState", "stream_text"]
