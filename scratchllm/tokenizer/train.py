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
Naive twin (`train_bpe_ref`): recount every pair of every pre-token after every merge.

Glossary: word = a unique pre-token as a list of token ids; f = its count in the corpus;
new = the id of the merged token; key(t) = a tuple ordering tokens in *reverse* byte order,
so the min-heap of (-count, key(a), key(b)) pops the max count, then the greatest (a, b).
"""
import heapq
import os
import warnings
from collections import Counter, defaultdict
from functools import partial
from multiprocessing import Pool

import numpy as np
from tqdm import tqdm

from . import fast
from .pretokenize import (PATTERNS, clean_surrogates, compile_pattern, iter_chunks,
                          read_blocks, special_regex, split_special)


def check_train_args(fn, vocab_size, special_tokens):
    """Validate vocab_size and special tokens; returns the special tokens as a tuple."""
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


def count_chunk(text, special_tokens, pattern):
    """{pre-token bytes: count} of one chunk (special tokens removed, never counted)."""
    pieces = [p for is_special, p in split_special(clean_surrogates(text),
                                                   special_regex(special_tokens))
              if not is_special]
    if PATTERNS.get(pattern, pattern) != PATTERNS["gpt2"]:
        return count_chunk_ref(pieces, pattern)
    blobs = [p.encode("utf-8") for p in pieces]
    data = b"".join(blobs)
    seg_ends = np.cumsum([len(b) for b in blobs], dtype=np.int64)  # (K,)
    ends = fast.scan_gpt2(np.frombuffer(data, dtype=np.uint8), fast.char_classes(),
                          seg_ends)                                          # (T,)
    us, ue, uc = fast.count_pretokens(np.frombuffer(data, dtype=np.uint8), ends)
    return dict(zip(map(data.__getitem__, map(slice, us.tolist(), ue.tolist())), uc.tolist()))


def count_chunk_ref(pieces, pattern):
    """The `regex` twin of count_chunk: {pre-token bytes: count} of the given text pieces."""
    pat = compile_pattern(pattern)
    counts = Counter()
    for piece in pieces:
        counts.update(pat.findall(piece))
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
    if workers <= 1:
        for part in map(job, chunks):
            total.update(part)
        return total
    fast.char_classes()                      # build the table once, before the fork
    with Pool(workers) as pool:
        for part in pool.imap_unordered(job, chunks):
            total.update(part)
    return total


def _rev_key(token):
    """Tuple whose ascending order is the descending byte order of `token` (prefix = greater)."""
    return tuple(255 - b for b in token) + (256,)


def merge_loop(counts, n_merges, progress=False):
    """The incremental merge loop on {pre-token bytes: count}; returns the merges."""
    words = [list(w) for w in counts]
    freqs = list(counts.values())
    count, where = defaultdict(int), defaultdict(set)
    for i, (w, f) in enumerate(zip(words, freqs)):
        for pair in zip(w, w[1:]):
            count[pair] += f
            where[pair].add(i)
    tokens = [bytes([b]) for b in range(256)]
    keys = [_rev_key(t) for t in tokens]
    heap = [(-c, keys[a], keys[b], a, b) for (a, b), c in count.items()]
    heapq.heapify(heap)
    merges = []
    for _ in tqdm(range(n_merges), disable=not progress, desc="merges", unit="merge"):
        while heap:
            negc, _, _, a, b = heapq.heappop(heap)
            now = count.get((a, b), 0)
            if now == -negc:
                break
            if now > 0:
                heapq.heappush(heap, (-now, keys[a], keys[b], a, b))
        else:
            break
        new = len(tokens)
        tokens.append(tokens[a] + tokens[b])
        keys.append(_rev_key(tokens[new]))
        merges.append((tokens[a], tokens[b]))
        touched = _apply_merge(words, freqs, count, where, a, b, new)
        for pair in touched:
            if count[pair] > 0:
                heapq.heappush(heap, (-count[pair], keys[pair[0]], keys[pair[1]]) + pair)
    return merges


def _apply_merge(words, freqs, count, where, a, b, new):
    """Merge (a, b) -> new in every word containing it; returns the new pairs (with `new`)."""
    touched = set()
    for i in where.pop((a, b)):
        w, f = words[i], freqs[i]
        out, j, n = [], 0, len(w)
        while j < n:
            if j + 1 < n and w[j] == a and w[j + 1] == b:
                if out:                              # (prev, a) -> (prev, new)
                    count[(out[-1], a)] -= f
                    count[(out[-1], new)] += f
                    where[(out[-1], new)].add(i)
                    touched.add((out[-1], new))
                if j + 2 < n:                        # (b, next) -> (new, next)
                    count[(b, w[j + 2])] -= f
                    count[(new, w[j + 2])] += f
                    where[(new, w[j + 2])].add(i)
                    touched.add((new, w[j + 2]))
                out.append(new)
                j += 2
            else:
                out.append(w[j])
                j += 1
        words[i] = out
    del count[(a, b)]
    return touched


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


def train_bpe_ref(input, vocab_size, special_tokens=(), pattern="gpt2"):
    """Naive twin of train_bpe: `regex` pre-tokenizer, full pair recount after every merge."""
    specials = check_train_args("train_bpe_ref", vocab_size, special_tokens)
    text = "".join(_pieces(input))
    pieces = [p for s, p in split_special(clean_surrogates(text), special_regex(specials))
              if not s]
    counts = count_chunk_ref(pieces, pattern)
    if not counts:
        raise ValueError("train_bpe_ref: the corpus is empty (no text outside special tokens)")
    words = {tuple(bytes([x]) for x in w): c for w, c in counts.items()}
    merges = []
    for _ in range(vocab_size - 256 - len(specials)):
        pairs = Counter()
        for w, c in words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += c
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        words = {_merge_word(w, best): c for w, c in words.items()}
    return _finish("train_bpe_ref", counts, vocab_size, specials, merges)


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
