"""Numba kernels of byte-level BPE encoding: the merge table and the merge loops that fast.py's
encode_pieces runs on every pre-token.

- `merge_table`: an open-addressing hash table (a, b) -> (rank, id of a+b);
- `_bpe`: the merge loop keeps one rank per adjacent pair, merges the lowest, and recomputes
  only the two neighbouring ranks (tokenizer.py `_bpe_ref` is its Python twin);
- `_bpe_long`: a pre-token longer than LONG bytes merges through a heap instead, so one huge
  pre-token (a 50 MB line without spaces) costs O(m log m), not O(m^2); `bpe_long` runs it
  on one pre-token (the Tokenizer's non-Numba path).

Glossary: (a, b) -> (rank, new id) = the merge table (keys, ranks, news); parts = current ids
of a pre-token; prank[i] = rank of the merge (parts[i], parts[i+1]).
"""
import numba as nb
import numpy as np

from scratchllm.core.compiling import inner_kernel

_MULT = np.uint64(0x9E3779B97F4A7C15)


def merge_table(pairs, new_ids):
    """Open-addressing table (keys (S,), ranks (S,), new ids (S,)): (a, b) -> rank, a+b's id.

    `pairs` is int64 (M, 2) of token ids in merge-rank order; `new_ids` (M,) the merged ids.
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)  # (M, 2)
    new_ids = np.asarray(new_ids, dtype=np.int64).reshape(-1)  # (M,)
    if len(new_ids) != len(pairs) or (pairs.size and (pairs.min() < 0 or pairs.max() >= 1 << 31
                                                      or new_ids.min() < 0
                                                      or new_ids.max() >= 1 << 31)):
        raise ValueError(f"merge_table: need one new id per pair and ids in [0, 2^31), got "
                         f"{len(pairs)} pairs and {len(new_ids)} new ids")
    size = 1 << max(4, int(np.ceil(np.log2(2 * len(pairs) + 1))))
    keys = np.full(size, -1, dtype=np.int64)     # (S,)
    ranks = np.zeros(size, dtype=np.int64)       # (S,)
    news = np.zeros(size, dtype=np.int64)        # (S,)
    _fill_table(pairs, new_ids, keys, ranks, news)
    return keys, ranks, news


@nb.njit(cache=True)
def _fill_table(pairs, new_ids, keys, ranks, news):
    for r in range(pairs.shape[0]):
        key = (pairs[r, 0] << 32) | pairs[r, 1]
        h = _slot(key, keys.shape[0])
        while keys[h] >= 0 and keys[h] != key:
            h = (h + 1) & (keys.shape[0] - 1)
        if keys[h] < 0:
            keys[h], ranks[h], news[h] = key, r, new_ids[r]


@nb.njit(cache=True, inline="always")
def _slot(key, size):
    return np.int64((np.uint64(key) * _MULT) >> np.uint64(40)) & (size - 1)


@inner_kernel
def _lookup(a, b, keys, ranks):
    """(rank, slot) of the merge (a, b), or (-1, -1) when a, b never merge."""
    key = (a << 32) | b
    h = _slot(key, keys.shape[0])
    while keys[h] >= 0:
        if keys[h] == key:
            return ranks[h], h
        h = (h + 1) & (keys.shape[0] - 1)
    return -1, -1


@inner_kernel
def _bpe(data, s, e, byte_ids, keys, ranks, news, parts, prank, pslot, out, t):
    """Write the ids of pre-token data[s:e] to out[t:]; return the new t.

    parts = current ids; prank[i] = rank of the merge (parts[i], parts[i+1]) (-1: none).
    """
    m = e - s
    for i in range(m):
        parts[i] = byte_ids[data[s + i]]
    for i in range(m - 1):
        prank[i], pslot[i] = _lookup(parts[i], parts[i + 1], keys, ranks)
    while m > 1:
        best, r = -1, -1
        for i in range(m - 1):
            if prank[i] >= 0 and (r < 0 or prank[i] < r):
                best, r = i, prank[i]
        if best < 0:
            break
        parts[best] = news[pslot[best]]                  # merge parts[best], parts[best + 1]
        for i in range(best + 1, m - 1):
            parts[i] = parts[i + 1]
            prank[i], pslot[i] = prank[i + 1], pslot[i + 1]
        m -= 1
        if best > 0:                                    # only the two neighbours change
            prank[best - 1], pslot[best - 1] = _lookup(parts[best - 1], parts[best], keys, ranks)
        if best < m - 1:
            prank[best], pslot[best] = _lookup(parts[best], parts[best + 1], keys, ranks)
    for i in range(m):
        out[t + i] = parts[i]
    return t + m


LONG = 256  # pre-tokens of more bytes merge through a heap (_bpe_long): O(m log m), not O(m^2)


@inner_kernel
def _heap_push(heap, n, key):
    """Push int64 `key` onto the min-heap heap[:n] (grown when full); returns (heap, n + 1)."""
    if n == heap.shape[0]:
        grown = np.empty(2 * n + 16, dtype=np.int64)  # (2n+16,)
        for i in range(n):  # a loop: a slice assignment compiles NumPy's shape error
            grown[i] = heap[i]
        heap = grown
    i = n
    heap[i] = key
    while i > 0 and heap[(i - 1) >> 1] > heap[i]:
        p = (i - 1) >> 1
        heap[p], heap[i] = heap[i], heap[p]
        i = p
    return heap, n + 1


@inner_kernel
def _heap_pop(heap, n):
    """(smallest key, n - 1) of the min-heap heap[:n]."""
    top = heap[0]
    n -= 1
    heap[0] = heap[n]
    i = 0
    while True:
        left, best = 2 * i + 1, i
        if left < n and heap[left] < heap[best]:
            best = left
        if left + 1 < n and heap[left + 1] < heap[best]:
            best = left + 1
        if best == i:
            return top, n
        heap[best], heap[i] = heap[i], heap[best]
        i = best


@nb.njit(cache=True)
def _bpe_long(data, s, e, byte_ids, keys, ranks, news, out, t):
    """_bpe for a long pre-token, the same merges in the same order (lowest rank, then
    leftmost): parts in a linked list (nxt, prv; a merged-away part is -1) and a heap of
    rank << 32 | position keys; a popped key whose pair has changed is skipped. O(m log m)
    time and O(m) memory for m bytes, where _bpe's rescans are O(m^2)."""
    m = e - s
    if m == 0:
        return t
    parts = np.empty(m, dtype=np.int64)  # (m,)
    nxt = np.empty(m, dtype=np.int64)  # (m,)
    prv = np.empty(m, dtype=np.int64)  # (m,)
    heap = np.empty(m, dtype=np.int64)  # (m,) grows
    n = np.int64(0)  # not a literal: one typing of _heap_push and _heap_pop
    for i in range(m):
        parts[i], nxt[i], prv[i] = byte_ids[data[s + i]], i + 1 if i + 1 < m else -1, i - 1
    for i in range(m - 1):
        r, _ = _lookup(parts[i], parts[i + 1], keys, ranks)
        if r >= 0:
            heap, n = _heap_push(heap, n, (r << 32) | i)
    while n > 0:
        key, n = _heap_pop(heap, n)
        r, i = key >> 32, key & 0xFFFFFFFF
        j = nxt[i] if parts[i] >= 0 else -1
        if j < 0:
            continue
        now, slot = _lookup(parts[i], parts[j], keys, ranks)
        if now != r:
            continue                                     # stale: that pair has changed
        parts[i], parts[j], nxt[i] = news[slot], -1, nxt[j]
        if nxt[i] >= 0:
            prv[nxt[i]] = i
        for a in (prv[i], i):                            # the two new neighbouring pairs
            if a >= 0 and nxt[a] >= 0:
                r2, _ = _lookup(parts[a], parts[nxt[a]], keys, ranks)
                if r2 >= 0:
                    heap, n = _heap_push(heap, n, (r2 << 32) | a)
    i = 0
    while i >= 0:
        out[t] = parts[i]
        t += 1
        i = nxt[i]
    return t


def bpe_long(token, byte_ids, keys, ranks, news):
    """int64 ids of one pre-token (bytes, any length) by the heap merge (_bpe_long); the
    Tokenizer's non-Numba path uses it for pre-tokens longer than LONG bytes."""
    data = np.frombuffer(bytes(token), dtype=np.uint8)  # (m,)
    out = np.empty(max(len(data), 1), dtype=np.int32)  # (m,) int32 as encode_pieces' (ids <
    n = _bpe_long(data, 0, len(data), byte_ids, keys, ranks, news, out, 0)  # 2^31): 1 typing
    return out[:n].astype(np.int64)
