"""Byte-level BPE (GPT-2 style): train_bpe / train_bpe_ref (train.py), Tokenizer (tokenizer.py),
pre-tokenization (pretokenize.py), Numba kernels (fast.py), file formats (gpt2.py), Hugging
Face tokenizer.json (hf_json.py).
Stands on nothing else of scratchllm (its CLI is scratchllm.cli.bpe)."""
from .hf_json import from_tokenizer_json
from .tokenizer import EOT, TOKENIZER_FILE, Tokenizer
from .train import train_bpe, train_bpe_ref

__all__ = ["EOT", "TOKENIZER_FILE", "Tokenizer", "from_tokenizer_json", "train_bpe",
           "train_bpe_ref"]
