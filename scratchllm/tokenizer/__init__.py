"""Byte-level BPE (GPT-2 style): train_bpe / train_bpe_ref (train.py), Tokenizer (tokenizer.py),
pre-tokenization (pretokenize.py), Numba kernels (fast.py), file formats (gpt2.py), CLI (cli.py).
"""
from .tokenizer import Tokenizer
from .train import train_bpe, train_bpe_ref

__all__ = ["Tokenizer", "train_bpe", "train_bpe_ref"]
