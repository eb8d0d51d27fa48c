"""Tokenizers. Byte-level BPE (GPT-2 style): train_bpe / train_bpe_ref (train.py), Tokenizer
(tokenizer.py), pre-tokenization (pretokenize.py), Numba kernels (fast.py, fast_bpe.py,
fast_scan.py; nbcache.py keeps their on-disk cache fresh), file formats (gpt2.py), Hugging
Face tokenizer.json (hf_json.py: fast forms; hf_pipeline.py with hf_normalizers.py,
hf_pretokenizers.py, hf_models.py, hf_decoders.py: every other), special-token safety
(specials.py), chat templates with jinja2 (chat.py). The
Unigram language model (SentencePiece): Unigram (unigram.py), its Normalizer (normalizer.py),
train_unigram and its TrainerSpec (unigram_train.py), their Numba kernels (unigram_lattice.py,
unigram_em.py; encoding's double-array trie and Viterbi: unigram_viterbi.py), tokenizer.json and .model files (unigram_files.py). SentencePiece BPE with byte
fallback, the Llama-2 form (spm_bpe.py), trained as sentencepiece trains it (spm_bpe_train.py). Of the rest of scratchllm it uses core's atomic
writer only (its CLI is scratchllm.cli.bpe)."""
from .chat import chat_template_of, encode_chat, render_chat
from .healing import heal_table, token_bytes
from .hf_json import from_tokenizer_json, tokenizer_from_spec
from .hf_pipeline import HFPipeline
from .tokenizer import EOT, TOKENIZER_FILE, Tokenizer
from .train import train_bpe, train_bpe_ref
from .spm_bpe import SentencePieceBPE
from .spm_bpe_train import train_sentencepiece_bpe
from .normalizer import Normalizer
from .unigram import Unigram
from .unigram_files import load_bpe_json, load_sentencepiece, load_unigram_json, save_unigram_json
from .unigram_train import TrainerSpec, train_unigram

__all__ = ["EOT", "HFPipeline", "Normalizer", "SentencePieceBPE", "TOKENIZER_FILE", "Tokenizer",
           "TrainerSpec", "Unigram", "chat_template_of", "encode_chat", "from_tokenizer_json",
           "load_bpe_json", "load_sentencepiece", "load_unigram_json", "render_chat",
           "save_unigram_json", "heal_table", "token_bytes", "tokenizer_from_spec", "train_bpe", "train_bpe_ref",
           "train_sentencepiece_bpe", "train_unigram"]
