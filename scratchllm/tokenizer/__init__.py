"""Tokenizers. Byte-level BPE (GPT-2 style): train_bpe / train_bpe_ref (train.py), Tokenizer
(tokenizer.py), pre-tokenization (pretokenize.py), Numba kernels (fast.py, fast_scan.py), file
formats (gpt2.py), special-token safety (specials.py). The Unigram language model
(SentencePiece): Unigram (unigram.py), train_unigram (unigram_train.py), tokenizer.json and
.model files (unigram_files.py). Stands on nothing else of scratchllm (its CLI is
scratchllm.cli.bpe)."""
from .tokenizer import EOT, TOKENIZER_FILE, Tokenizer
from .train import train_bpe, train_bpe_ref
from .unigram import Unigram
from .unigram_files import load_sentencepiece, load_unigram_json, save_unigram_json
from .unigram_train import train_unigram

__all__ = ["EOT", "TOKENIZER_FILE", "Tokenizer", "Unigram", "load_sentencepiece",
           "load_unigram_json", "save_unigram_json", "train_bpe", "train_bpe_ref",
           "train_unigram"]
