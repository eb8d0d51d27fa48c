"""Numba merge loop of the fast BPE trainer (train.py `merge_loop` calls it).

State, for W unique pre-tokens ("words") and the pairs (a, b) of token ids inside them:
- sym: every word's token ids, word w at sym[start[w] : start[w] + length[w]], linked as a list
  per word (nxt, prv): a merge at a site rewrites its left position and unlinks its right one;
- the pair table: an open-addressing hash table (plain arrays, linear probing on
  fast_bpe._slot) key(a, b) -> count, posting-list head, stamp. count = sum over words of
  freq[w] * occurrences of (a, b) in w; a merged pair keeps its slot with count 0;
- postings: pair -> linked list of the positions where it appeared (stale entries are
  harmless: a position that no longer starts (a, b) is skipped), so a merge costs O(its sites)
  however long the word (a word of m bytes is not rescanned, O(m), at every merge);
- heap of (count, a, b), best = largest count, ties -> greatest (bytes(a), bytes(b)).
  Lazy invalidation: counts of existing pairs only fall (a merge only creates pairs containing
  the new token), so a popped entry whose count is stale is re-pushed with its current count.
Merging (a, b) -> new: at each site, left to right in each word, with `prev` the token before
it in the rewritten word and `next` the one after, (prev, a) becomes (prev, new) and (b, next)
becomes (new, next); nothing else in the word changes. Twin: train.py `train_bpe_ref` (full
recount per merge).
The kernel uses arrays only (no typed Dict, no generator), every state a 2-D int64 array
(rows named below) rather than a tuple of arrays, and one specialisation of each helper (no
literal-int arguments): on a fresh install its compile is on the first run's path, ~3.9 CPU s
where the tuple-of-arrays version took ~6.5 and the Dict version ~18. The helpers are inner
kernels (core.compiling.inner_kernel: no CPython wrapper each, ~1 CPU s of it), NumPy
functions are called with one argument form (np.empty's dtype positional: the keyword form
compiles np.empty again) and min/max are conditionals (each a kernel of its own).

Glossary: key(a, b) = a << 32 | b; pool/span = the bytes of every token (span: offset and
size in pool), for tie-breaks; S = slots of the pair table (a power of two, at most half full).
"""
import numba as nb
import numpy as np

from scratchllm.core.compiling import inner_kernel

from . import nbcache
from .fast_bpe import _slot
from .kernel_checks import check_words

nbcache.drop_stale(__file__, "fast_bpe.py")   # the pair table hashes with fast_bpe's _slot

KEY, COUNT, HEAD, STAMP = 0, 1, 2, 3   # the pair table's rows
POS, NEXT = 0, 1                       # the postings' rows
WORD, NXT, PRV = 0, 1, 2               # the links' rows


@nb.njit(cache=True, inline="always")
def _key(a, b):
    return (np.int64(a) << 32) | np.int64(b)


@inner_kernel
def _better(heap, i, j, pool, span):
    """Heap entry i outranks entry j: larger count, then greater (bytes(a), bytes(b)) (bytes
    compared as strings: a proper prefix is smaller)."""
    if heap[0, i] != heap[0, j]:
        return heap[0, i] > heap[0, j]
    for row in range(1, 3):
        x, y = heap[row, i], heap[row, j]
        m = span[1, x] if span[1, x] < span[1, y] else span[1, y]  # not min(): a kernel
        for k in range(m):
            p, q = pool[0, span[0, x] + k], pool[0, span[0, y] + k]
            if p != q:
                return p > q
        if span[1, x] != span[1, y]:
            return span[1, x] > span[1, y]
    return False


@inner_kernel
def _push(heap, n, c, a, b, pool, span):
    """Push (c, a, b) onto the heap (3, H) holding n entries; returns the heap (grown when
    full)."""
    if n == heap.shape[1]:
        heap = _grow(heap, 2 * n)
    heap[0, n], heap[1, n], heap[2, n] = c, a, b
    i = n
    while i > 0 and _better(heap, i, (i - 1) // 2, pool, span):
        for r in range(3):
            heap[r, i], heap[r, (i - 1) // 2] = heap[r, (i - 1) // 2], heap[r, i]
        i = (i - 1) // 2
    return heap


@inner_kernel
def _pop(heap, n, pool, span):
    """Move the best of the n entries to column n - 1, the rest stay a heap of n - 1."""
    n -= 1
    for r in range(3):
        heap[r, 0], heap[r, n] = heap[r, n], heap[r, 0]
    i = np.int64(0)  # not a literal 0: _better would compile a second time for it
    while True:
        best, l, r = i, 2 * i + 1, 2 * i + 2
        if l < n and _better(heap, l, best, pool, span):
            best = l
        if r < n and _better(heap, r, best, pool, span):
            best = r
        if best == i:
            return
        for k in range(3):
            heap[k, i], heap[k, best] = heap[k, best], heap[k, i]
        i = best


@inner_kernel
def _grow(arr, n):
    """arr (R, C) copied into a new array of max(n, 16) columns. (Loops, not slice
    assignments: a slice assignment compiles NumPy's shape-mismatch error message, ~4 CPU s
    cold. Rows in the inner loop: row by row, LLVM vectorised the copy into ~1,100 lines of IR
    that every caller optimises again; it runs a few times per training.)"""
    out = np.empty((arr.shape[0], n if n > 16 else np.int64(16)), np.int64)  # (R, n) no max()
    for i in range(arr.shape[1]):
        for r in range(arr.shape[0]):
            out[r, i] = arr[r, i]
    return out


@inner_kernel
def _sift(a, i, n):
    """Move a[i] down the max-heap a[:n] to its place."""
    while True:
        big, l, r = i, 2 * i + 1, 2 * i + 2
        if l < n and a[l] > a[big]:
            big = l
        if r < n and a[r] > a[big]:
            big = r
        if big == i:
            return
        a[i], a[big] = a[big], a[i]
        i = big


def merge_loop_numba(sym, start, length, freq, n_merges):
    """Iterator of the merged pairs (a, b) of ids, in order (new ids are 256, 257, ...); it
    stops early when the corpus runs out of pairs. sym is rewritten in place (a merged-away
    position holds -1). The words are checked first (kernel_checks.check_words): the kernel
    trusts them. The kernel runs every merge before the first is yielded."""
    check_words("merge_loop_numba", sym, start, length, freq, n_merges)
    merged = _merge_loop(sym, start, length, freq, int(n_merges))  # (M, 2)
    return map(tuple, merged.tolist())


@inner_kernel
def _links(start, length, n):
    """(3, N): each position's word, and the next and previous live position in that word (-1
    past its ends). A merge unlinks the right half of each site."""
    links = np.empty((3, n), np.int64)
    for w in range(start.shape[0]):
        s, e = start[w], start[w] + length[w]
        for j in range(s, e):
            links[WORD, j], links[NXT, j] = w, j + 1 if j + 1 < e else -1
            links[PRV, j] = j - 1 if j > s else -1
    return links


@inner_kernel
def _find(tab, k):
    """The slot of key k in the pair table, or the empty slot (key -1) where it would go."""
    h = _slot(k, tab.shape[1])
    while tab[KEY, h] >= 0 and tab[KEY, h] != k:
        h = (h + 1) & (tab.shape[1] - 1)
    return h


@inner_kernel
def _rehash(tab, size):
    """An empty pair table (4, size) (size a power of two): key (-1: empty), count, posting
    head (-1: none), stamp (the last merge that pushed the pair), holding the live pairs
    (count > 0) of `tab`; returns (table, used slots)."""
    new = np.empty((4, size), np.int64)
    for h in range(size):
        new[KEY, h], new[COUNT, h], new[HEAD, h], new[STAMP, h] = -1, 0, -1, -1
    used = np.int64(0)
    for h in range(tab.shape[1]):
        if tab[KEY, h] >= 0 and tab[COUNT, h] > 0:
            g = _find(new, tab[KEY, h])
            for r in range(4):
                new[r, g] = tab[r, h]
            used += 1
    return new, used


@nb.njit(cache=True)
def _merge_loop(sym, start, length, freq, n_merges):
    """The kernel of merge_loop_numba (inputs checked there): (M, 2) merged pairs (a, b)."""
    tab, used = _rehash(np.empty((4, 0), np.int64), np.int64(1 << 17))  # (4, S) pairs
    links = _links(start, length, sym.shape[0])           # (3, N): word, next, previous
    # (2, P) postings: position, next posting. The words' pairs post at most N, and each
    # merge site at most two more while removing a position (at most N sites): P <= 3N.
    posts = np.empty((2, 3 * sym.shape[0] + 16), np.int64)
    n_post = np.int64(0)
    for w in range(start.shape[0]):
        for j in range(start[w], start[w] + length[w] - 1):
            used, n_post = _add(tab, used, posts, n_post, _key(sym[j], sym[j + 1]), freq[w], j)
    n_tok = 256 + n_merges
    span = np.empty((2, n_tok), np.int64)                 # (2, V) token: offset, size in pool
    pool = np.empty((1, 4096), np.int64)                  # (1, Z) token bytes; grows
    for t in range(256):
        span[0, t], span[1, t], pool[0, t] = t, 1, t
    pool_n = np.int64(256)
    heap = np.empty((3, 16), np.int64)                    # (3, H) count, a, b; grows
    n_heap = np.int64(0)
    for h in range(tab.shape[1]):
        if tab[COUNT, h] > 0:
            heap = _push(heap, n_heap, tab[COUNT, h], tab[KEY, h] >> 32,
                         tab[KEY, h] & 0xFFFFFFFF, pool, span)
            n_heap += 1
    merged = np.empty((n_merges, 2), np.int64)            # (M, 2)
    for step in range(n_merges):
        a, b, found = np.int64(0), np.int64(0), False
        while n_heap > 0 and not found:
            _pop(heap, n_heap, pool, span)
            n_heap -= 1
            c, a, b = heap[0, n_heap], heap[1, n_heap], heap[2, n_heap]
            now = tab[COUNT, _find(tab, _key(a, b))]
            found = now == c
            if not found and now > 0:
                heap = _push(heap, n_heap, now, a, b, pool, span)
                n_heap += 1
        if not found:
            return merged[:step]
        new = 256 + step
        merged[step, 0], merged[step, 1] = a, b
        grown = pool_n + span[1, a] + span[1, b]
        if grown > pool.shape[1]:
            pool = _grow(pool, 2 * grown)
        # the bytes of a, then of b, in one loop (two loops: LLVM vectorised each of them)
        for i in range(span[1, a] + span[1, b]):
            pool[0, pool_n + i] = pool[0, span[0, a] + i if i < span[1, a] else
                                       span[0, b] + i - span[1, a]]
        span[0, new], span[1, new] = pool_n, span[1, a] + span[1, b]
        pool_n = grown
        sites = _sites(tab, posts, _key(a, b))
        while 2 * (used + 2 * sites.shape[0]) > tab.shape[1]:  # room for every new pair
            tab, used = _rehash(tab, 2 * tab.shape[1])
        touched, n_post, used = _merge_sites(sym, links, freq, tab, used, posts, n_post,
                                             sites, (a, b, new))
        h = _find(tab, _key(a, b))
        tab[COUNT, h], tab[HEAD, h] = 0, -1               # (a, b) is gone
        for k in touched:
            h = _find(tab, k)
            if tab[COUNT, h] > 0 and tab[STAMP, h] != step:  # each touched pair pushed once
                tab[STAMP, h] = step
                heap = _push(heap, n_heap, tab[COUNT, h], k >> 32, k & 0xFFFFFFFF, pool, span)
                n_heap += 1
    return merged


@inner_kernel
def _add(tab, used, posts, n_post, k, f, j):
    """count[k] += f (a new key takes an empty slot: the caller made room), position j posted
    under pair k. Returns (used, n_post + 1)."""
    h = _find(tab, k)
    if tab[KEY, h] < 0:
        tab[KEY, h] = k
        used += 1
    tab[COUNT, h] += f
    posts[POS, n_post], posts[NEXT, n_post] = j, tab[HEAD, h]
    tab[HEAD, h] = n_post
    return used, n_post + 1


@inner_kernel
def _sites(tab, posts, k):
    """The positions posted under pair k, in position order (so each word's sites are merged
    left to right, as a scan would); some are stale or repeated. The heapsort is written here,
    not as a kernel of its own: every kernel is optimised and emitted by LLVM once alone and
    again in each caller (~0.2 CPU s cold for a separate _sort)."""
    head, n = tab[HEAD, _find(tab, k)], 0
    node = head
    while node >= 0:
        n, node = n + 1, posts[NEXT, node]
    out = np.empty(n, np.int64)                           # (n,)
    node = head
    for i in range(n):
        out[i], node = posts[POS, node], posts[NEXT, node]
    for i in range(n // 2 - 1, -1, -1):                   # heapsort (np.sort compiles a
        _sift(out, i, n)                                  # quicksort, ~2 CPU s)
    for end in range(n - 1, 0, -1):
        out[0], out[end] = out[end], out[0]
        _sift(out, np.int64(0), end)  # not a literal 0: a second typing of _sift
    return out


@inner_kernel
def _merge_sites(sym, links, freq, tab, used, posts, n_post, sites, merge):
    """Rewrite (a, b) -> new (merge) at each live site: the work is per site, not per word (a
    word of m bytes costs O(sites), not O(m), per merge). Returns the touched pair keys (pairs
    with `new`), the postings' count and the table's used slots."""
    a, b, new = merge
    touched = np.empty(2 * sites.shape[0] + 1, np.int64)  # (K,)
    nt = np.int64(0)
    for p in sites:
        q = links[NXT, p]
        if sym[p] != a or q < 0 or sym[q] != b:           # stale, or merged at this step
            continue
        f, o, r = freq[links[WORD, p]], links[PRV, p], links[NXT, q]
        if o >= 0:                                        # (prev, a) -> (prev, new)
            tab[COUNT, _find(tab, _key(sym[o], a))] -= f
            touched[nt], nt = _key(sym[o], new), nt + 1
            used, n_post = _add(tab, used, posts, n_post, touched[nt - 1], f, o)
        if r >= 0:                                        # (b, next) -> (new, next)
            tab[COUNT, _find(tab, _key(b, sym[r]))] -= f
            touched[nt], nt = _key(new, sym[r]), nt + 1
            used, n_post = _add(tab, used, posts, n_post, touched[nt - 1], f, p)
            links[PRV, r] = p
        sym[p], sym[q], links[NXT, p] = new, -1, r        # q leaves the word
    return touched[:nt], n_post, used
