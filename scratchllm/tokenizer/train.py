"""Byte-level BPE training (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with
Subword Units"; byte-level as in GPT-2, Radford et al. 2019).

Start from the 256 single bytes. Repeat until the vocabulary is full: count every adjacent pair
(a, b) inside every pre-token, weighted by how often the pre-token occurs; merge the most
frequent pair into a new token a+b. Ties go to the lexicographically greatest (a, b) of bytes.
Ids: 0-255 the bytes, then one id per merge in merge order, then the special tokens.

Fast trainer (`train_bpe`): pre-tokenize once into {pre-token: count} (chunks in parallel
worker processes), keep `count[(a, b)]` and `where[(a, b)]` = the pre-tokens containing it.
A merge rewrites only those pre-tokens and adjusts the counts of the pairs next to each merge
site. The best pair comes from a heap with lazy invalidation: old pairs' counts only ever
fall, so an entry whose count is stale is re-pushed with its current count when popped.
That loop runs in Numba (fast_train.py). Naive twin (`train_bpe_ref`): recount every pair of
every pre-token after every merge, in plain Python on tuples of bytes.

Glossary: word = a unique pre-token; f = its count in the corpus; new = the merged token.
"""
import os
import warnings
from collections import Counter
from functools import partial
from multiprocessing import Pool

import numpy as np
from tqdm import tqdm

from . import fast
from .fast_train import merge_loop_numba
from .pretokenize import (PATTERNS, bounded_map, clean_surrogates, compile_pattern,
                          covering_pretokens, iter_chunks, read_blocks, several, special_regex,
                          split_special)


def check_train_args(fn, vocab_size, special_tokens):
    """Validate vocab_size and special tokens; returns the special tokens as a tuple. A
    single string is refused (iterating it would make each character a special token)."""
    if isinstance(special_tokens, (str, bytes)):
        raise TypeError(f"{fn}: special_tokens must be a list of strings, got the "
                        f"{type(special_tokens).__name__} {special_tokens!r} (write "
                        f"[{special_tokens!r}] for one special token)")
    specials = tuple(special_tokens)
    if any(not isinstance(t, str) or not t for t in specials) or len(set(specials)) < len(specials):
        raise ValueError(f"{fn}: special_tokens must be distinct non-empty strings, got {specials}")
    if not isinstance(vocab_size, int) or vocab_size < 256 + len(specials):
        raise ValueError(f"{fn}: vocab_size must be an integer >= 256 + {len(specials)} special "
                         f"tokens = {256 + len(specials)}, got {vocab_size!r}")
    return specials


def _pieces(input):
    """A path -> its text in blocks; any other iterable of str -> itself (concatenated)."""
    if isinstance(input, (str, os.PathLike)):
        return read_blocks(input)
    return iter(input)


def _pieces_outside_specials(text, special_tokens):
    """The text pieces between special tokens (which are never counted)."""
    return [p for is_special, p in split_special(clean_surrogates(text),
                                                 special_regex(special_tokens))
            if not is_special]


def count_chunk(text, special_tokens, pattern):
    """{pre-token bytes: count} of one chunk (special tokens removed, never counted)."""
    pieces = _pieces_outside_specials(text, special_tokens)
    if PATTERNS.get(pattern, pattern) != PATTERNS["gpt2"]:
        return _count_regex(pieces, pattern)
    blobs = [p.encode("utf-8") for p in pieces]
    data = b"".join(blobs)
    seg_ends = np.cumsum([len(b) for b in blobs], dtype=np.int64)  # (K,)
    ends = fast.scan_gpt2(np.frombuffer(data, dtype=np.uint8), fast.char_classes(),
                          seg_ends)                                          # (T,)
    us, ue, uc = fast.unique_pretokens(np.frombuffer(data, dtype=np.uint8), ends)  # 3x (U,)
    return dict(zip(map(data.__getitem__, map(slice, us.tolist(), ue.tolist())), uc.tolist()))


def count_chunk_ref(text, special_tokens, pattern):
    """The `regex` twin of count_chunk (the same signature and result): {pre-token bytes:
    count} of one chunk, special tokens removed."""
    return _count_regex(_pieces_outside_specials(text, special_tokens), pattern)


def _count_regex(pieces, pattern):
    """{pre-token bytes: count} of the given text pieces, pre-tokenized by `regex`."""
    pat = compile_pattern(pattern)
    counts = Counter()
    for piece in pieces:
        counts.update(covering_pretokens(pat, piece, "train_bpe"))
    out = Counter()
    for tok, c in counts.items():
        out[tok.encode("utf-8")] += c
    return out


def count_pretokens(input, special_tokens=(), pattern="gpt2", workers=None):
    """{pre-token bytes: count} of a path or iterable of str, chunks spread over `workers`."""
    compile_pattern(pattern)
    workers = os.cpu_count() if workers is None else workers
    chunks = iter_chunks(_pieces(input), special_tokens, pattern)
    job = partial(count_chunk, special_tokens=tuple(special_tokens), pattern=pattern)
    total = Counter()
    chunks, many = several(chunks)
    if workers <= 1 or not many:
        for part in map(job, chunks):
            total.update(part)
        return total
    fast.char_classes()                      # build the table once, before the fork,
    job("a 1.")                              # and compile the kernels once, not per worker
    with Pool(workers) as pool:
        for part in bounded_map(pool, job, chunks, 2 * workers):
            total.update(part)
    return total


def merge_loop(counts, n_merges, progress=False):
    """The incremental merge loop (fast_train.py) on {pre-token bytes: count} -> merges."""
    words = list(counts)
    sym = np.frombuffer(b"".join(words), dtype=np.uint8).astype(np.int64)     # (N,)
    length = np.array([len(w) for w in words], dtype=np.int64)                # (W,)
    start = np.cumsum(length) - length                                        # (W,)
    freq = np.array(list(counts.values()), dtype=np.int64)                    # (W,)
    tokens = [bytes([b]) for b in range(256)]
    merges = []
    for a, b in tqdm(merge_loop_numba(sym, start, length, freq, n_merges), total=n_merges,
                     disable=not progress, desc="merges", unit="merge"):
        merges.append((tokens[a], tokens[b]))
        tokens.append(tokens[a] + tokens[b])
    return merges


def assemble_vocab(merges, special_tokens):
    """{id: bytes}: 0-255 the bytes, then the merged tokens, then the special tokens."""
    vocab = {b: bytes([b]) for b in range(256)}
    for a, b in merges:
        vocab[len(vocab)] = a + b
    for tok in special_tokens:
        vocab[len(vocab)] = tok.encode("utf-8")
    return vocab


def _finish(fn, counts, vocab_size, specials, merges):
    if len(merges) < vocab_size - 256 - len(specials):
        warnings.warn(f"{fn}: the corpus has only {len(merges)} possible merges; the vocab "
                      f"has {256 + len(merges) + len(specials)} < {vocab_size} entries")
    return assemble_vocab(merges, specials), merges


def train_bpe(input, vocab_size, special_tokens=(), pattern="gpt2", workers=None,
              progress=False):
    """Train byte-level BPE on a path (str/PathLike) or an iterable of str (concatenated).

    Returns (vocab {id: bytes}, merges [(bytes, bytes)]); len(vocab) == vocab_size unless the
    corpus runs out of pairs (then a warning). Special tokens split the text and are never
    counted; `workers` processes pre-tokenize (None: all cores, 1: in this process).
    """
    specials = check_train_args("train_bpe", vocab_size, special_tokens)
    counts = count_pretokens(input, specials, pattern, workers)
    if not counts:
        raise ValueError("train_bpe: the corpus is empty (no text outside special tokens)")
    merges = merge_loop(counts, vocab_size - 256 - len(specials), progress)
    return _finish("train_bpe", counts, vocab_size, specials, merges)


def train_bpe_ref(input, vocab_size, special_tokens=(), pattern="gpt2", workers=None,
                  progress=False):
    """Naive twin of train_bpe (same signature and result): `regex` pre-tokenizer in this
    process, full pair recount after every merge; `progress` shows a bar over the merges.
    The reference never forks: workers other than None or 1 is an error, not ignored."""
    if workers not in (None, 1):
        raise ValueError(f"train_bpe_ref: counts in one process; workers must be None or 1, "
                         f"got {workers!r} (train_bpe uses workers)")
    specials = check_train_args("train_bpe_ref", vocab_size, special_tokens)
    counts = count_chunk_ref("".join(_pieces(input)), specials, pattern)
    if not counts:
        raise ValueError("train_bpe_ref: the corpus is empty (no text outside special tokens)")
    words = {tuple(bytes([x]) for x in w): c for w, c in counts.items()}
    merges = []
    for _ in tqdm(range(vocab_size - 256 - len(specials)), disable=not progress, unit="merge",
                  desc="train_bpe_ref"):
        best, words = merge_step(words)
        if best is None:
            break
        merges.append(best)
    return _finish("train_bpe_ref", counts, vocab_size, specials, merges)


def merge_step(words):
    """One naive BPE merge: recount every adjacent pair, merge the most frequent everywhere.

    Inputs:  words {tuple of bytes tokens: count}.
    Returns: (best pair, new words), ties to the greatest (a, b); (None, words) if no pair.
    >>> merge_step({(b"a", b"b", b"a", b"b"): 2, (b"b", b"a"): 3})
    ((b'b', b'a'), {(b'a', b'ba', b'b'): 2, (b'ba',): 3})
    """
    pairs = Counter()
    for w, c in words.items():
        for pair in zip(w, w[1:]):
            pairs[pair] += c
    if not pairs:
        return None, words
    best = max(pairs, key=lambda p: (pairs[p], p))
    return best, {_merge_word(w, best): c for w, c in words.items()}


def _merge_word(w, pair):
    out, j = [], 0
    while j < len(w):
        if j + 1 < len(w) and (w[j], w[j + 1]) == pair:
            out.append(w[j] + w[j + 1])
            j += 2
        else:
            out.append(w[j])
            j += 1
    return tuple(out)
