"""Numba kernels: GPT-2's pre-token scan, pre-token counting, BPE encoding (any scanner).

The `regex` module runs GPT-2's pattern at ~5 MB/s; tiktoken (Rust) encodes at ~17 MB/s. These
kernels do the same work on UTF-8 bytes, exactly:

- `char_classes()`: one class per code point (0 other, 1 \\p{L}, 2 \\p{N}, 3 \\s), computed by
  the `regex` module itself, so the scanner agrees with the regex on every character;
- `scan_gpt2`: the pattern `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|
  \\s+(?!\\S)|\\s+` as a hand-written scanner (alternatives tried in the regex's order);
  its twin is `regex.findall` (tests/tokenizer/test_tokenizer.py checks they agree);
- `unique_pretokens`: unique pre-tokens and their counts (open-addressing hash of the bytes);
- `encode_pieces`: scan (GPT-2's scanner here, cl100k/o200k/Llama-3's in fast_scan.py) + BPE
  of every pre-token (fast_bpe.py), with a cache per distinct pre-token (hash of its bytes ->
  its ids) that the Tokenizer keeps across calls (`new_cache`).
Numba's on-disk cache checks only the file a kernel is defined in, so this module drops its
cache when fast_scan.py or fast_bpe.py is newer (nbcache.drop_stale).

Glossary: data = UTF-8 bytes (uint8); seg_ends = end offset of each piece between special
tokens; ends = end offset of each pre-token; (a, b) -> (rank, new id) = the merge table.
"""
import numpy as np
import numba as nb

from scratchllm.core.compiling import inner_kernel

from . import nbcache
from .fast_bpe import LONG, _bpe, _bpe_long
from .fast_scan import GPT2, decode_utf8, property_table, scan
from .kernel_checks import check_ends, check_tables, check_text

nbcache.drop_stale(__file__, "fast_bpe.py", "fast_scan.py")

OTHER, LETTER, NUMBER, WHITESPACE = 0, 1, 2, 3
_CLASSES = None


def char_classes():
    """uint8 (0x110000,) class of every code point, as the `regex` module sees it."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = property_table([(LETTER, r"\p{L}+"), (NUMBER, r"\p{N}+"),
                                   (WHITESPACE, r"\s+")], np.uint8)
    return _CLASSES


@inner_kernel
def _run(data, cls, i, n, k):
    """Offset after the run of characters of class k starting at byte offset i."""
    while i < n:
        c, j = decode_utf8(data, i)
        if cls[c] != k:
            return i
        i = j
    return n


@inner_kernel
def _next_pretoken(data, cls, i, n):
    """End offset of the GPT-2 pre-token starting at i (the segment ends at n)."""
    c, j = decode_utf8(data, i)
    if c == 39 and j < n:                                    # 's 't 're 've 'm 'll 'd
        d = data[j]
        if d == 115 or d == 116 or d == 109 or d == 100:
            return j + 1
        if j + 1 < n:
            e = data[j + 1]
            if (d == 114 and e == 101) or (d == 118 and e == 101) or (d == 108 and e == 108):
                return j + 2
    k = cls[c]
    if c == 32 and j < n:                                    # ' ?' before L, N or other
        c2, _ = decode_utf8(data, j)
        k2 = cls[c2]
        if k2 != WHITESPACE:
            return _run(data, cls, j, n, k2)
    if k != WHITESPACE:                                      # \p{L}+ | \p{N}+ | other+
        return _run(data, cls, i, n, k)
    last, p = i, j                                           # \s+(?!\S) | \s+
    while p < n:
        c2, q = decode_utf8(data, p)
        if cls[c2] != WHITESPACE:
            break
        last, p = p, q
    if p == n or last == i:
        return p
    return last


def scan_gpt2(data, cls, seg_ends):
    """int64 (T,) end offsets of all pre-tokens; each segment is scanned as its own string.

    data: uint8 (N,) valid UTF-8; cls: char_classes(); seg_ends: int64 (K,) non-decreasing
    offsets in [0, N] at character boundaries (checked: the kernel trusts them)."""
    check_text("scan_gpt2", data, cls, seg_ends, "seg_ends")
    return _scan_gpt2(data, cls, seg_ends)


@nb.njit(cache=True)
def _scan_gpt2(data, cls, seg_ends):
    """The kernel of scan_gpt2 (inputs checked there)."""
    ends = np.empty(data.shape[0], dtype=np.int64)  # (N,) upper bound: one per byte
    t, i = np.int64(0), np.int64(0)  # int64 from the start: one typing of the callee
    for n in seg_ends:
        while i < n:
            i = _next_pretoken(data, cls, i, n)
            ends[t] = i
            t += 1
    return ends[:t]


@nb.njit(cache=True, inline="always")
def _hash_bytes(data, s, e):
    """FNV-1a of data[s:e]. Inlined (as _same): called as a kernel once per pre-token, the
    encoder ran at 0.6x the MB/s."""
    h = np.uint64(1469598103934665603)                      # FNV-1a, 64 bit
    for i in range(s, e):
        h = (h ^ np.uint64(data[i])) * np.uint64(1099511628211)
    return h


@nb.njit(cache=True, inline="always")
def _same(data, s1, e1, s2, e2):
    if e1 - s1 != e2 - s2:
        return False
    for i in range(e1 - s1):
        if data[s1 + i] != data[s2 + i]:
            return False
    return True


def unique_pretokens(data, ends):
    """Unique pre-tokens: (starts (U,), ends (U,), counts (U,)) in first-seen order.
    data: uint8 (N,); ends: int64 (T,) non-decreasing end offsets in [0, N] (scan_gpt2's)."""
    check_ends("unique_pretokens", data, ends)
    return _unique_pretokens(data, ends)


@nb.njit(cache=True)
def _unique_pretokens(data, ends):
    """The kernel of unique_pretokens (inputs checked there)."""
    size = 16
    while size < 2 * ends.shape[0] + 1:            # a power of two, at most half full
        size *= 2
    slot_of = np.empty(size, dtype=np.int64)       # (S,) table slot -> unique index
    for h in range(size):                          # (loops: np.full / np.zeros compile
        slot_of[h] = -1                            # their own kernels, ~0.4 CPU s cold)
    us = np.empty(ends.shape[0], dtype=np.int64)   # (T,) starts of unique pre-tokens
    ue = np.empty(ends.shape[0], dtype=np.int64)   # (T,)
    uc = np.empty(ends.shape[0], dtype=np.int64)   # (T,) counts, set when a slot is taken
    u, s = 0, 0
    for e in ends:
        h = _hash_bytes(data, s, e) & np.uint64(size - 1)
        while True:
            k = slot_of[h]
            if k < 0:
                slot_of[h] = u
                us[u], ue[u], uc[u] = s, e, 1
                u += 1
                break
            if _same(data, us[k], ue[k], s, e):
                uc[k] += 1
                break
            h = (h + np.uint64(1)) & np.uint64(size - 1)
        s = e
    return us[:u], ue[:u], uc[:u]


def new_cache(slots=1 << 18, key_bytes=1 << 21, ids=1 << 19):
    """Empty per-pre-token cache (lives in the Tokenizer, kept across calls): slot -> key
    offset/length in the key pool, ids offset/length in the ids pool; meta = (entries, key
    bytes used, ids used). It fills up to half its slots or a full pool, then stops growing."""
    return (np.full(slots, -1, dtype=np.int64), np.zeros(slots, dtype=np.int64),   # (S,) (S,)
            np.zeros(slots, dtype=np.int64), np.zeros(slots, dtype=np.int64),      # (S,) (S,)
            np.zeros(key_bytes, dtype=np.uint8), np.zeros(ids, dtype=np.int64),    # (K,) (I,)
            np.zeros(3, dtype=np.int64))                                           # (3,)


@inner_kernel
def _cache_find(cache, data, s, e):
    """The slot of pre-token data[s:e]: where it is cached, or the empty slot it would take."""
    key_off, key_len, kpool = cache[0], cache[1], cache[4]
    mask = np.uint64(key_off.shape[0] - 1)
    h = _hash_bytes(data, s, e) & mask
    while key_off[h] >= 0:
        if key_len[h] == e - s:
            o = key_off[h]
            same = True
            for j in range(e - s):
                if kpool[o + j] != data[s + j]:
                    same = False
                    break
            if same:
                return h
        h = (h + np.uint64(1)) & mask
    return h


@inner_kernel
def _cache_put(cache, h, data, s, e, out, t, t2):
    """Store pre-token data[s:e] -> ids out[t:t2] in empty slot h, if there is room."""
    key_off, key_len, ids_off, ids_len, kpool, ipool, meta = cache
    if 2 * (meta[0] + 1) > key_off.shape[0] or meta[1] + e - s > kpool.shape[0] \
            or meta[2] + t2 - t > ipool.shape[0]:
        return
    key_off[h], key_len[h], ids_off[h], ids_len[h] = meta[1], e - s, meta[2], t2 - t
    for j in range(e - s):  # loops: a slice assignment compiles NumPy's shape error (~3 s)
        kpool[meta[1] + j] = data[s + j]
    for j in range(t2 - t):
        ipool[meta[2] + j] = out[t + j]
    meta[0] += 1
    meta[1] += e - s
    meta[2] += t2 - t


def encode_pieces(kind, cls, data, segments, byte_ids, table, cache, max_cached=64):
    """int32 (T,) ids of segments = (seg_ends, seg_special): seg_special[k] >= 0 is a special
    token's id (empty segment), else the text data[prev_end:seg_ends[k]] is scanned (scanner
    `kind` of fast_scan.KIND, cls its table: char_classes() for GPT2, fast_scan.char_flags()
    else) and BPE-encoded with byte_ids and the merge table (keys, ranks, news).
    Pre-tokens of 2 to max_cached bytes go through `cache` (new_cache), kept across calls.
    Checks what the kernel indexes (check_text, check_tables) before it runs."""
    seg_ends, seg_special = segments
    keys, ranks, news = table
    check_text("encode_pieces", data, cls, seg_ends, "seg_ends")
    check_tables("encode_pieces", seg_ends, seg_special, byte_ids, (keys, ranks, news), cache)
    if kind == GPT2:
        ends = _scan_gpt2(data, cls, seg_ends)  # (P,) the kernel counting already compiled
    else:
        ends = scan(kind, data, cls, seg_ends)  # (P,)
    ids, long = _encode_pieces(data, ends, seg_ends, seg_special, byte_ids, keys, ranks, news,
                               cache, int(max_cached))
    return _with_long(ids, long, data, byte_ids, table) if len(long) else ids


def _with_long(ids, long, data, byte_ids, table):
    """ids with the ids of each long pre-token data[s:e] (rows (t, s, e) of `long`) inserted at
    ids[t]: their heap merge (_bpe_long) runs here, so the kernel is compiled only for a text
    that has one (a third of the encoder's compile time otherwise)."""
    parts, prev = [], 0
    for t, s, e in long.tolist():
        out = np.empty(e - s, dtype=np.int32)                  # (m,)
        parts += [ids[prev:t], out[:_bpe_long(data, s, e, byte_ids, *table, out, 0)]]
        prev = t
    return np.concatenate(parts + [ids[prev:]])


@nb.njit(cache=True)
def _encode_pieces(data, ends, seg_ends, seg_special, byte_ids, keys, ranks, news, cache,
                   max_cached):
    """The kernel of encode_pieces (inputs checked there), on the pre-tokens' end offsets
    `ends` (P,) that the scanner found: (ids, long), the ids of every pre-token of at most
    LONG bytes, and rows (t, s, e) of the longer ones data[s:e], whose ids go at ids[t]
    (_with_long). The scanners run before it, in kernels of their own: an encoder with the
    scanners inside compiled all three (GPT-2's, cl100k's, o200k's) for a runtime kind, ~10
    CPU s cold, where this one compiles the BPE and its cache alone."""
    n = data.shape[0]
    out = np.empty(n + seg_ends.shape[0], dtype=np.int32)   # (N + K,) at most one id per byte
    parts = np.empty(64, dtype=np.int64)                    # (L,) work arrays of _bpe, grown
    prank = np.empty(64, dtype=np.int64)                    # (L,) to the longest pre-token
    pslot = np.empty(64, dtype=np.int64)                    # (L,)
    long = np.empty((n // (LONG + 1) + 1, 3), dtype=np.int64)  # (L, 3) rows (t, s, e)
    ids_off, ids_len, ipool = cache[2], cache[3], cache[5]
    t, i, p, n_long = np.int64(0), np.int64(0), np.int64(0), 0  # not literals: one typing
    for k in range(seg_ends.shape[0]):
        if seg_special[k] >= 0:
            out[t] = seg_special[k]
            t += 1
            continue
        stop = seg_ends[k]
        while i < stop:
            e = ends[p]
            p += 1
            if LONG >= e - i > parts.shape[0]:                  # long ones: _with_long
                parts = np.empty(2 * (e - i), dtype=np.int64)  # (L,)
                prank = np.empty(2 * (e - i), dtype=np.int64)  # (L,)
                pslot = np.empty(2 * (e - i), dtype=np.int64)  # (L,)
            if e - i == 1:
                out[t] = byte_ids[data[i]]
                t += 1
            elif e - i > LONG:
                long[n_long, 0], long[n_long, 1], long[n_long, 2] = t, i, e
                n_long += 1
            elif e - i > max_cached:
                t = _bpe(data, i, e, byte_ids, keys, ranks, news, parts, prank, pslot, out, t)
            else:
                h = _cache_find(cache, data, i, e)
                if cache[0][h] >= 0:
                    for j in range(ids_len[h]):
                        out[t + j] = ipool[ids_off[h] + j]
                    t += ids_len[h]
                else:
                    t2 = _bpe(data, i, e, byte_ids, keys, ranks, news, parts, prank, pslot, out, t)
                    _cache_put(cache, h, data, i, e, out, t, t2)
                    t = t2
            i = e
    return out[:t], long[:n_long]
