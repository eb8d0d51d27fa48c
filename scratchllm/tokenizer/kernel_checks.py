"""Checks of what the tokenizer's Numba kernels index (fast.py, fast_train.py), run by their
Python wrappers before a kernel starts: the kernels trust their inputs in the hot loops, so a
bad offset, invalid UTF-8 or a foreign table would read out of bounds (a segfault or garbage)
instead of raising. Every check is O(1) or one vectorised pass over the input.

Glossary: data = UTF-8 bytes (uint8); offsets = end offsets into data; sym = token ids of
every word, word w at sym[start[w] : start[w] + length[w]].
"""
import codecs

import numpy as np


def _is_array(a, dtype, ndim=1):
    return isinstance(a, np.ndarray) and a.dtype == dtype and a.ndim == ndim


def check_ends(fn, data, ends, name="ends"):
    """data uint8 (N,); `ends` int64 (K,) non-decreasing offsets in [0, N]."""
    if not _is_array(data, np.uint8):
        raise TypeError(f"{fn}: data must be a 1-d uint8 array of UTF-8 bytes, got "
                        f"{getattr(data, 'dtype', type(data).__name__)} "
                        f"{getattr(data, 'shape', '')}")
    if not _is_array(ends, np.int64):
        raise TypeError(f"{fn}: {name} must be a 1-d int64 array, got "
                        f"{getattr(ends, 'dtype', type(ends).__name__)}")
    n = data.shape[0]
    if ends.size and (ends[0] < 0 or ends[-1] > n or np.any(np.diff(ends) < 0)):
        raise ValueError(f"{fn}: {name} must be non-decreasing offsets in [0, {n}], got values "
                         f"in [{ends.min()}, {ends.max()}]")


def check_text(fn, data, cls, offsets, name):
    """What the scanning kernels index, checked before they run: `data` uint8 (N,) valid UTF-8
    (a truncated or invalid sequence would decode past the end, or to a code point beyond
    `cls`), `cls` the (0x110000,) class table (uint8 or uint16), `offsets` int64 (K,) non-decreasing in
    [0, N], each at a character boundary."""
    check_ends(fn, data, offsets, name)
    try:
        codecs.utf_8_decode(memoryview(np.ascontiguousarray(data)), "strict", True)
    except UnicodeDecodeError as e:
        raise ValueError(f"{fn}: data is not valid UTF-8 ({e.reason} at byte {e.start})") from None
    if not (isinstance(cls, np.ndarray) and cls.dtype in (np.uint8, np.uint16)
            and cls.shape == (0x110000,)):
        raise TypeError(f"{fn}: cls must be char_classes() or fast_scan.char_flags(), a "
                        f"(0x110000,) uint8/uint16 table, got {getattr(cls, 'dtype', type(cls))} "
                        f"{np.shape(cls)}")
    inner = offsets[offsets < data.shape[0]]  # (K',)
    if np.any(data[inner] & 0xC0 == 0x80):
        raise ValueError(f"{fn}: {name} splits a UTF-8 character (an offset points at a "
                         f"continuation byte)")


def check_tables(fn, seg_ends, seg_special, byte_ids, table, cache):
    """The BPE tables encode_pieces indexes: seg_special int64 like seg_ends with ids < 2^31,
    byte_ids (256,) ids, the merge_table (three int64 arrays of one power-of-two size) and a
    new_cache() (its structure and fill counters; its entries are written by the kernel)."""
    ids_ok = (isinstance(seg_special, np.ndarray) and seg_special.dtype == np.int64
              and seg_special.shape == seg_ends.shape
              and not (seg_special.size and seg_special.max() >= 1 << 31))
    if not ids_ok:
        raise ValueError(f"{fn}: seg_special must be int64 of seg_ends' shape {seg_ends.shape} "
                         f"with ids < 2^31")
    if np.shape(byte_ids) != (256,) or not np.issubdtype(np.asarray(byte_ids).dtype, np.integer):
        raise ValueError(f"{fn}: byte_ids must be 256 integer ids, got shape {np.shape(byte_ids)}")
    size = table[0].shape[0] if isinstance(table[0], np.ndarray) else 0
    if size < 1 or size & (size - 1) or any(
            not isinstance(t, np.ndarray) or t.dtype != np.int64 or t.shape != (size,)
            for t in table):
        raise ValueError(f"{fn}: keys, ranks, news must be merge_table()'s three int64 arrays "
                         f"of one power-of-two size")
    shapes = [getattr(c, "shape", None) for c in cache] if isinstance(cache, tuple) else []
    ok = len(shapes) == 7 and all(isinstance(c, np.ndarray) and c.ndim == 1 for c in cache)
    if ok:
        slots, (kb,), (ib,), meta = shapes[0][0], shapes[4], shapes[5], cache[6]
        ok = (slots >= 1 and not slots & (slots - 1) and all(sh == (slots,) for sh in shapes[1:4])
              and cache[4].dtype == np.uint8 and meta.shape == (3,)
              and all(c.dtype == np.int64 for i, c in enumerate(cache) if i != 4)
              and 0 <= meta[0] <= slots // 2 and 0 <= meta[1] <= kb and 0 <= meta[2] <= ib)
    if not ok:
        raise ValueError(f"{fn}: cache must come from new_cache()")


def check_words(fn, sym, start, length, freq, n_merges):
    """The merge loop's words: sym int64 (N,) byte ids in [0, 256); start, length, freq int64
    (W,) with every word inside sym, in order, not overlapping, and freq >= 0; n_merges an int
    in [0, 2^31 - 256)."""
    for name, a in (("sym", sym), ("start", start), ("length", length), ("freq", freq)):
        if not _is_array(a, np.int64):
            raise TypeError(f"{fn}: {name} must be a 1-d int64 array, got "
                            f"{getattr(a, 'dtype', type(a).__name__)}")
    if not start.shape == length.shape == freq.shape:
        raise ValueError(f"{fn}: start, length, freq must have one entry per word, got shapes "
                         f"{start.shape}, {length.shape}, {freq.shape}")
    if sym.size and (sym.min() < 0 or sym.max() > 255):
        raise ValueError(f"{fn}: sym must hold byte ids in [0, 256), got values in "
                         f"[{sym.min()}, {sym.max()}]")
    if start.size and (start.min() < 0 or length.min() < 0 or freq.min() < 0
                       or (start + length).max() > sym.shape[0]):
        raise ValueError(f"{fn}: every word must lie inside sym (start >= 0, length >= 0, "
                         f"start + length <= {sym.shape[0]}) with freq >= 0")
    if start.size > 1 and np.any(start[1:] < start[:-1] + length[:-1]):
        raise ValueError(f"{fn}: the words must follow each other in sym without overlapping "
                         f"(start[w + 1] >= start[w] + length[w])")
    if isinstance(n_merges, bool) or not isinstance(n_merges, (int, np.integer)) \
            or not 0 <= n_merges < (1 << 31) - 256:
        raise ValueError(f"{fn}: n_merges must be an integer in [0, 2^31 - 256), got "
                         f"{n_merges!r}")
