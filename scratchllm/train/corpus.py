"""Training data for the demo: the bundled corpus, a cached BPE tokenizer and token ids, the
train/validation split, random batches, and the unigram baseline the model must beat.

    baseline = -(1/|val|) sum_{t in val} log q(t),   q(v) = (count_train(v) + 1) / (|train| + V)

(the cross-entropy of the validation ids under the add-one smoothed unigram distribution of
the training ids: what a model that ignores context can reach). A model that learns context
must go well below it; the default run aims at <= 0.6 x baseline.

The token stream is the documents one after another, each ended by the separator
<|endoftext|>, so every window packs pieces of several documents. Packed training (`train
--pack-documents`, Llama 3's document masking) keeps them apart: document_ids numbers the
documents of each window (a new one starts after each separator), and the LM attends only
within a document, at positions that restart there.

Glossary: B batch, T context length, V vocabulary.
"""
import hashlib
import json
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from scratchllm.tokenizer import EOT, TOKENIZER_FILE, Tokenizer, train_bpe
from scratchllm.core.atomic import atomic_write, remove_stale_temps, write_bytes

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
DEFAULT_CORPUS = DATA_DIR / "python-docs.txt"


def prepare(text_path, vocab_size, cache_dir, clock=None):
    """Train a byte-level BPE tokenizer on `text_path` and encode it, cached in `cache_dir`
    under a key of (text hash, vocab size), so a second run skips both. clock: a
    core.compiling.PhaseClock to time the two ("BPE training", "encoding"), or None.

    Returns: (tokenizer, ids (n_tokens,) int32, cache directory of this key).
    """
    text_path = Path(text_path)
    where = _cache_of(text_path, vocab_size, cache_dir)
    ids_path = where / "ids.npy"
    if is_prepared(text_path, vocab_size, cache_dir):
        return Tokenizer.load(str(where / TOKENIZER_FILE)), np.load(ids_path), where
    if vocab_size < 257:
        raise ValueError(f"corpus.prepare: vocab_size must be >= 257 (256 bytes + {EOT}), "
                         f"got {vocab_size}")
    where.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(where)
    with _phase(clock, "BPE training"):
        vocab, merges = train_bpe(str(text_path), vocab_size, special_tokens=[EOT])
    tok = Tokenizer(vocab, merges, special_tokens=[EOT])
    atomic_write(where / TOKENIZER_FILE, lambda tmp: tok.save(str(tmp)))
    with _phase(clock, "encoding"):
        ids = tok.encode_file(str(text_path), allowed_special={EOT}).astype(np.int32)  # (N,)
    atomic_write(ids_path, lambda tmp: _save_npy(tmp, ids))
    write_bytes(where / "DONE", json.dumps({"source": str(text_path)}).encode())
    return tok, ids, where


def _cache_of(text_path, vocab_size, cache_dir):
    """The cache directory of (text hash, vocab size)."""
    if not Path(text_path).is_file():
        raise FileNotFoundError(f"corpus.prepare: data file {str(text_path)!r} does not exist")
    key = f"{hashlib.sha256(Path(text_path).read_bytes()).hexdigest()[:16]}-v{vocab_size}"
    return Path(cache_dir) / key


def is_prepared(text_path, vocab_size, cache_dir):
    """Whether prepare(text_path, vocab_size, cache_dir) would only read its cache."""
    where = _cache_of(text_path, vocab_size, cache_dir)
    return (where / "ids.npy").is_file() and (where / "DONE").is_file()


def _phase(clock, name):
    return nullcontext() if clock is None else clock.phase(name)


def _save_npy(path, array):
    with open(path, "wb") as f:  # a file object: np.save would append .npy to a name
        np.save(f, array)


def split(ids, val_fraction=0.05):
    """The last `val_fraction` of the ids is the held-out validation split."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"split: val_fraction must lie in (0, 1), got {val_fraction}")
    n_val = max(int(len(ids) * val_fraction), 2)
    return ids[:-n_val], ids[-n_val:]


def unigram_baseline(train_ids, val_ids, vocab_size):
    """Cross-entropy (nats/token) of val_ids under the add-one smoothed unigram of train_ids."""
    counts = np.bincount(train_ids, minlength=vocab_size).astype(np.float64) + 1.0  # (V,)
    logq = np.log(counts / counts.sum())  # (V,)
    return float(-logq[val_ids].mean())


def sample_batch(ids, batch_size, seq_len, rng):
    """B random windows: inputs ids[s : s+T] and next-token targets ids[s+1 : s+T+1]."""
    if len(ids) < seq_len + 2:
        raise ValueError(f"sample_batch: need more than seq_len + 1 = {seq_len + 1} tokens, "
                         f"got {len(ids)}")
    starts = rng.integers(0, len(ids) - seq_len - 1, size=batch_size)  # (B,)
    idx = starts[:, None] + np.arange(seq_len + 1)  # (B, T+1)
    window = ids[idx]  # (B, T+1)
    return window[:, :-1], window[:, 1:]


def document_ids(x, eot):
    """The document of each token of windows x (B, T) ints: 0 at each row's start, and one
    more after each separator `eot` (the separator ends its own document).

    >>> document_ids(np.array([[5, 0, 7, 7]]), 0).tolist()
    [[0, 0, 1, 1]]
    """
    if isinstance(eot, bool) or not isinstance(eot, (int, np.integer)) or eot < 0:
        raise ValueError(f"document_ids: eot must be the separator's token id (an int >= 0), "
                         f"got {eot!r}")
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"document_ids: x must be (B, T) token ids, got shape {x.shape}")
    doc = np.zeros(x.shape, dtype=np.int64)  # (B, T)
    doc[:, 1:] = np.cumsum(x[:, :-1] == eot, axis=1)  # (B, T-1): separators before t
    return doc


def eval_batches(ids, batch_size, seq_len, max_tokens):
    """Non-overlapping windows from the start of `ids`, at most `max_tokens` targets, in
    batches of B: a fixed evaluation set (the same every time it is asked for)."""
    n_win = min((len(ids) - 1) // seq_len, max(max_tokens // seq_len, 1))
    if n_win < 1:  # no window: a mean over nothing would read "loss 0.000"
        raise ValueError(f"eval_batches: the validation split has {len(ids)} tokens, fewer "
                         f"than seq_len + 1 = {seq_len + 1}; lower --seq-len or use more data")
    idx = np.arange(n_win)[:, None] * seq_len + np.arange(seq_len + 1)  # (W, T+1)
    windows = ids[idx]  # (W, T+1)
    return [(windows[i:i + batch_size, :-1], windows[i:i + batch_size, 1:])
            for i in range(0, n_win, batch_size)]
