"""The byte-level BPE tokenizer: encode/decode text with a trained (or GPT-2's) vocabulary.

Encoding one pre-token: start from its bytes' ids; repeatedly merge the adjacent pair (a, b)
with the lowest merge rank (the order the trainer learned them) into the id of a+b, until no
adjacent pair has a rank. `_bpe` keeps one rank per adjacent pair and recomputes only the two
neighbours of a merge; `_bpe_ref` (its twin) rescans every pair after every merge. For the
built-in patterns (gpt2, cl100k, o200k, llama3) the whole pipeline (scan + BPE + per-pre-token
cache) runs in Numba kernels (fast.py, fast_bpe.py, fast_scan.py); custom patterns use `regex`
and a dict cache per pre-token string.

Glossary: rank = index of a merge in `merges`; specials = {special token string: id}.
"""
import os
from collections.abc import Hashable
from multiprocessing import Pool

import numpy as np

from . import fast, fast_bpe, fast_scan, gpt2
from .pretokenize import (bounded_map, clean_surrogates, compile_pattern,
                          covering_pretokens, iter_chunks, pattern_string, read_blocks, several,
                          special_regex, split_special)
from .specials import check_disallowed, checked_chunks, special_plan

EOT = "<|endoftext|>"            # GPT-2's end-of-text special token
TOKENIZER_FILE = "tokenizer.bpe"  # the file name `save` writes inside a directory
_CACHE_MAX = 1 << 17       # entries of the Python per-pre-token cache before it is cleared
_WORKER = None             # the Tokenizer of an encode_file worker process


class Tokenizer:
    """Byte-level BPE tokenizer.

    vocab: {id: bytes}; merges: [(bytes, bytes)] in rank order (a+b must be in vocab);
    special_tokens: None, an iterable of str (ids looked up in vocab by their UTF-8 bytes,
    else appended) or {str: id}; pattern: "gpt2", "cl100k", "o200k", "llama3" or a regex.
    drop_missing_bytes: a vocab may lack some of the 256 single-byte tokens, and encode drops
    those bytes from each pre-token before BPE (what HF `tokenizers` does for a BPE with no
    unk_token, e.g. SmolLM2's vocab); such a tokenizer encodes on the regex path. Otherwise
    (the default) a missing byte token is an error.
    """

    def __init__(self, vocab, merges, special_tokens=None, pattern="gpt2", *,
                 drop_missing_bytes=False):
        compile_pattern(pattern)
        self.vocab = _checked_vocab(vocab)
        self.merges = [(bytes(a), bytes(b)) for a, b in merges]
        self.pattern = pattern
        self.special_tokens = self._register_specials(special_tokens or {})
        special_ids = set(self.special_tokens.values())
        self._id_of = _bytes_to_id(self.vocab, special_ids)
        self._missing = bytes(b for b in range(256) if drop_missing_bytes
                              and bytes([b]) not in self._id_of)   # the bytes encode drops
        self._byte_ids = np.array([-1 if b in self._missing else self._need(bytes([b]), "byte")
                                   for b in range(256)])                                # (256,)
        self._pairs = np.array([(self._need(a, f"merge {r}: left"), self._need(b, f"merge {r}: "
                                 "right")) for r, (a, b) in enumerate(self.merges)],
                               dtype=np.int64).reshape(-1, 2)                           # (M, 2)
        new_ids = [self._need(a + b, f"merge {r}: merged") for r, (a, b) in enumerate(self.merges)]
        self._rank = {(int(a), int(b)): (r, n) for r, ((a, b), n)
                      in enumerate(zip(self._pairs.tolist(), new_ids))}
        self._table = fast_bpe.merge_table(self._pairs, new_ids)
        self._kind = fast_scan.KIND.get(pattern_string(pattern), -1)   # -1: regex path
        self._fast = self._kind >= 0 and not self._missing
        self._regex = compile_pattern(pattern)
        self._cache = {}
        self._fast_cache = None

    def _register_specials(self, special_tokens):
        if isinstance(special_tokens, (str, bytes)):
            raise TypeError(f"Tokenizer: special_tokens must be a list of strings or a dict "
                            f"{{str: id}}, got the {type(special_tokens).__name__} "
                            f"{special_tokens!r} (write [{special_tokens!r}] for one)")
        for tok in special_tokens:
            if not isinstance(tok, str) or not tok:
                raise ValueError(f"Tokenizer: special tokens must be non-empty strings, got "
                                 f"{tok!r} (an empty one would match between every character)")
        if isinstance(special_tokens, dict):
            for tok, i in special_tokens.items():
                if self.vocab.get(i, tok.encode("utf-8")) != tok.encode("utf-8"):
                    raise ValueError(f"Tokenizer: special token {tok!r} has id {i}, which is "
                                     f"already the token {self.vocab[i]!r}")
                self.vocab[i] = tok.encode("utf-8")
            return dict(special_tokens)
        out = {}
        for tok in special_tokens:
            raw = tok.encode("utf-8")
            found = [i for i, t in self.vocab.items() if t == raw]
            out[tok] = max(found) if found else max(self.vocab, default=-1) + 1
            self.vocab[out[tok]] = raw
        return out

    def _need(self, token, what):
        if token not in self._id_of:
            raise ValueError(f"Tokenizer: {what} token {token!r} is not in the vocab")
        return self._id_of[token]

    # ---- encoding -------------------------------------------------------------------------
    def encode(self, text, *, allowed_special=(), disallowed_special="all"):
        """list[int] ids of `text`. Special tokens follow tiktoken (specials.py): by default a
        special-token string in the text raises ValueError naming it and its position;
        allowed_special="all" (or a set) encodes those strings as their ids (the CS336
        behaviour); disallowed_special=() lets the others through as ordinary text."""
        _need_str(text, "encode")
        allowed, disallowed_re, _ = special_plan(self.special_tokens, allowed_special,
                                                 disallowed_special, "encode")
        check_disallowed(text, disallowed_re, 0, "encode")
        return self._encode_array(text, special_regex(allowed)).tolist()

    def encode_ordinary(self, text):
        """list[int] ids of `text` with special-token strings treated as plain text: never a
        special id (special ids are not in the BPE tables)."""
        _need_str(text, "encode_ordinary")
        return self._encode_array(text, None).tolist()

    def _pieces(self, text, special_re):
        """[(is_special, str)]: text with the allowed specials split out (hf_json's pipelines
        override it to normalise or prefix the ordinary pieces)."""
        return list(split_special(clean_surrogates(text), special_re))

    def _pretokens(self, piece):
        """The pre-tokens (str) of an ordinary piece on the regex path: the pattern's matches,
        which must cover the piece (covering_pretokens)."""
        return covering_pretokens(self._regex, piece)

    def _encode_array(self, text, special_re):
        pieces = self._pieces(text, special_re)
        if not self._fast:
            return np.array(self._encode_slow(pieces), dtype=np.int32)           # (T,)
        blobs = [b"" if s else p.encode("utf-8") for s, p in pieces]
        seg_ends = np.cumsum([len(b) for b in blobs], dtype=np.int64)          # (K,)
        seg_special = np.array([self.special_tokens[p] if s else -1 for s, p in pieces],
                               dtype=np.int64)                                  # (K,)
        data = np.frombuffer(b"".join(blobs), dtype=np.uint8)                   # (N,)
        if self._fast_cache is None:
            self._fast_cache = fast.new_cache()
        return fast.encode_pieces(self._kind, self._char_table(), data, (seg_ends, seg_special),
                                  self._byte_ids, self._table, self._fast_cache)

    def _char_table(self):
        """The scanner's table of code point classes (built once per process)."""
        return fast.char_classes() if self._kind == fast_scan.GPT2 else fast_scan.char_flags()

    def _encode_slow(self, pieces):
        ids = []
        for is_special, piece in pieces:
            if is_special:
                ids.append(self.special_tokens[piece])
                continue
            for pre in self._pretokens(piece):
                hit = self._cache.get(pre)
                if hit is None:
                    if len(self._cache) >= _CACHE_MAX:
                        self._cache.clear()
                    hit = self._cache[pre] = self._bpe(pre.encode("utf-8"))
                ids.extend(hit)
        return ids

    def _bpe(self, token):
        """Ids of one pre-token (bytes): lowest-rank merge first, neighbours re-ranked only."""
        token = token.translate(None, self._missing)
        if len(token) > fast_bpe.LONG:  # the heap merge: O(m log m) where this loop is O(m^2)
            return tuple(fast_bpe.bpe_long(token, self._byte_ids, *self._table).tolist())
        parts = [int(self._byte_ids[b]) for b in token]
        none = (len(self.merges), -1)
        ranks = [self._rank.get(p, none) for p in zip(parts, parts[1:])]
        while ranks:
            best = min(ranks)
            if best[1] < 0:
                break
            i = ranks.index(best)
            parts[i:i + 2] = [best[1]]
            del ranks[i]
            if i > 0:
                ranks[i - 1] = self._rank.get((parts[i - 1], parts[i]), none)
            if i < len(ranks):
                ranks[i] = self._rank.get((parts[i], parts[i + 1]), none)
        return tuple(parts)

    def _bpe_ref(self, token):
        """Naive twin of _bpe: after every merge, rescan all pairs for the lowest rank."""
        parts = [bytes([b]) for b in token.translate(None, self._missing)]
        rank = {pair: r for r, pair in enumerate(self.merges)}
        while True:
            found = [(rank[p], i) for i, p in enumerate(zip(parts, parts[1:])) if p in rank]
            if not found:
                return tuple(self._id_of[p] for p in parts)
            _, i = min(found)
            parts[i:i + 2] = [parts[i] + parts[i + 1]]

    def encode_iterable(self, iterable, chunk_chars=1 << 16, *, allowed_special=(),
                        disallowed_special="all"):
        """Yield the ids of the concatenated strings (e.g. a file's lines), lazily: the same
        ids as encode(whole text, same specials), with memory bounded by one chunk. A
        disallowed special raises when its chunk is reached (earlier ids were yielded)."""
        if isinstance(chunk_chars, bool) or not isinstance(chunk_chars, int) or chunk_chars < 1:
            raise ValueError(f"encode_iterable: chunk_chars must be an integer >= 1, got "
                             f"{chunk_chars!r}")
        allowed, disallowed_re, cut_at = special_plan(self.special_tokens, allowed_special,
                                                      disallowed_special, "encode_iterable")
        allowed_re = special_regex(allowed)
        chunks = iter_chunks(iterable, cut_at, self.pattern, chunk_chars)
        for chunk in checked_chunks(chunks, disallowed_re, "encode_iterable"):
            yield from self._encode_array(chunk, allowed_re).tolist()

    def encode_file(self, path, workers=None, *, allowed_special=(), disallowed_special="all"):
        """np.ndarray of the ids of a UTF-8 file (uint16 if every id fits, else int32),
        encoded in safe chunks by `workers` processes (None: all cores). Specials as in
        encode; a corpus whose documents end in "<|endoftext|>" needs allowed_special."""
        allowed, disallowed_re, cut_at = special_plan(self.special_tokens, allowed_special,
                                                      disallowed_special, "encode_file")
        dtype = np.uint16 if max(self.vocab) < 1 << 16 else np.int32
        workers = os.cpu_count() if workers is None else workers
        chunks = checked_chunks(iter_chunks(read_blocks(path), cut_at, self.pattern),
                                disallowed_re, "encode_file")
        chunks, many = several(chunks)
        if workers <= 1 or not many:
            allowed_re = special_regex(allowed)
            parts = [self._encode_array(c, allowed_re).astype(dtype) for c in chunks]
        else:
            if self._fast:
                self._char_table()                   # build the table once, before the fork,
                self._encode_array("a 1.", None)     # and compile the kernel once, not per worker
            with Pool(workers, initializer=_init_worker,
                      initargs=(self, dtype, allowed)) as pool:
                parts = list(bounded_map(pool, _encode_chunk, chunks, 2 * workers))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)        # (T,)

    # ---- decoding -------------------------------------------------------------------------
    def decode_bytes(self, ids):
        """The bytes of a sequence of integer ids; an unknown id raises ValueError, a float or
        bool id TypeError (1.0 and True would otherwise look up id 1)."""
        ids = ids.tolist() if isinstance(ids, np.ndarray) else ids
        bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, (int, np.integer))]
        if bad:
            raise TypeError(f"decode: ids must be integers, got {bad[0]!r} "
                            f"({type(bad[0]).__name__})")
        try:
            return b"".join([self.vocab[i] for i in ids])
        except (KeyError, TypeError):
            bad = next(i for i in ids if not isinstance(i, Hashable) or i not in self.vocab)
            raise ValueError(f"decode: id {bad!r} is not in the vocab (ids run 0.."
                             f"{max(self.vocab)})") from None

    def decode(self, ids):
        """The text of a sequence of ids; invalid UTF-8 becomes U+FFFD, as in GPT-2."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    # ---- files ----------------------------------------------------------------------------
    @classmethod
    def from_gpt2_files(cls, vocab_json, merges_txt, special_tokens=None):
        """GPT-2's vocab.json + merges.txt. special_tokens=None registers "<|endoftext|>"
        when the vocab has it."""
        table = gpt2.read_gpt2_vocab(vocab_json)
        merges = gpt2.read_gpt2_merges(merges_txt)
        if special_tokens is None:
            special_tokens = [t for t in ("<|endoftext|>",) if t in table]
        vocab = {i: gpt2.from_printable(t, f"{vocab_json} token {t!r}")
                 for t, i in table.items() if t not in special_tokens}
        specials = {t: table[t] for t in special_tokens if t in table}
        specials.update({t: max(table.values()) + 1 + k for k, t in
                         enumerate(t for t in special_tokens if t not in table)})
        made = sum(len(tok) > 1 for tok in vocab.values())  # each made by one merge
        if len(merges) < made:
            raise ValueError(f"{merges_txt}: {len(merges)} merges, but {vocab_json} has {made} "
                             f"multi-byte tokens and each is made by one merge: the merges file "
                             f"looks truncated")
        return cls(vocab, merges, specials, "gpt2")

    def save(self, path):
        """Write the documented text format of gpt2.py (round-trips exactly)."""
        special_ids = set(self.special_tokens.values())
        vocab = {i: t for i, t in self.vocab.items() if i not in special_ids}
        gpt2.write_bpe(path, vocab, self.merges, self.special_tokens, self.pattern)

    @classmethod
    def load(cls, path, allow_pattern=None):
        """Read a file written by save (or a directory holding TOKENIZER_FILE). A pattern
        other than "gpt2"/"cl100k" loads only if allow_pattern is that same string."""
        if os.path.isdir(path):
            path = os.path.join(path, TOKENIZER_FILE)
        vocab, merges, specials, pattern = gpt2.read_bpe(path, allow_pattern)
        return cls(vocab, merges, specials, pattern)

    def save_tiktoken(self, path):
        """tiktoken's .tiktoken file (base64 token, space, rank); specials are not in it."""
        special_ids = set(self.special_tokens.values())
        gpt2.write_tiktoken(path, {i: t for i, t in self.vocab.items() if i not in special_ids})


def _checked_vocab(vocab):
    """{id: bytes} with every id an integer in [0, 2^31) and every token bytes."""
    out = dict(vocab)
    for i, tok in out.items():
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < 2 ** 31:
            raise ValueError(f"Tokenizer: vocab ids must be integers in [0, 2^31), got {i!r}")
        if not isinstance(tok, bytes):
            raise TypeError(f"Tokenizer: vocab token {i} must be bytes, got "
                            f"{type(tok).__name__}")
    return out


def _bytes_to_id(vocab, special_ids):
    """{bytes: id} of the ordinary tokens; two ids with the same bytes are an error (which
    one would encode produce?)."""
    id_of = {}
    for i, tok in sorted(vocab.items()):
        if i in special_ids:
            continue
        if tok in id_of:
            raise ValueError(f"Tokenizer: ids {id_of[tok]} and {i} both hold the bytes {tok!r}; "
                             f"a vocab maps each token to one id")
        id_of[tok] = i
    return id_of


def _need_str(text, where):
    if not isinstance(text, str):
        raise TypeError(f"{where}: text must be str, got {type(text).__name__}")


def _init_worker(tokenizer, dtype, allowed):
    global _WORKER
    _WORKER = (tokenizer, dtype, special_regex(allowed))


def _encode_chunk(text):
    tokenizer, dtype, allowed_re = _WORKER
    return tokenizer._encode_array(text, allowed_re).astype(dtype)
