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
The kernel uses arrays only (no typed Dict, no generator): on a fresh install it compiles in
a few seconds where the Dict version took ~9 CPU s, and that compile is on the first run's path.

Glossary: key(a, b) = a << 32 | b; pool/off/size = the bytes of every token, for tie-breaks;
S = slots of the pair table (a power of two, at most half full).
"""
import numba as nb
import numpy as np
from . import nbcache
from .fast_bpe import _slot
from .kernel_checks import check_words

nbcache.drop_stale(__file__, "fast_bpe.py")   # the pair table hashes with fast_bpe's _slot


@nb.njit(cache=True, inline="always")
def _key(a, b):
    return (np.int64(a) << 32) | np.int64(b)


@nb.njit(cache=True)
def _cmp_tokens(pool, off, size, x, y):
    """-1, 0, 1 as bytes(x) <, ==, > bytes(y) (a proper prefix is smaller)."""
    n = min(size[x], size[y])
    for i in range(n):
        p, q = pool[off[x] + i], pool[off[y] + i]
        if p != q:
            return 1 if p > q else -1
    return 0 if size[x] == size[y] else (1 if size[x] > size[y] else -1)


@nb.njit(cache=True)
def _better(hc, ha, hb, i, j, pool, off, size):
    """Heap entry i outranks entry j: larger count, then greater (bytes(a), bytes(b))."""
    if hc[i] != hc[j]:
        return hc[i] > hc[j]
    c = _cmp_tokens(pool, off, size, ha[i], ha[j])
    if c == 0:
        c = _cmp_tokens(pool, off, size, hb[i], hb[j])
    return c > 0


@nb.njit(cache=True)
def _swap(hc, ha, hb, i, j):
    hc[i], hc[j] = hc[j], hc[i]
    ha[i], ha[j] = ha[j], ha[i]
    hb[i], hb[j] = hb[j], hb[i]


@nb.njit(cache=True)
def _push(heap, n, c, a, b, pool, off, size):
    """Push (c, a, b) onto the heap (hc, ha, hb) holding n entries; returns (heap, n + 1)."""
    hc, ha, hb = heap
    if n == hc.shape[0]:
        hc, ha, hb = _grow(hc, 2 * n), _grow(ha, 2 * n), _grow(hb, 2 * n)
    hc[n], ha[n], hb[n] = c, a, b
    i = n
    while i > 0 and _better(hc, ha, hb, i, (i - 1) // 2, pool, off, size):
        _swap(hc, ha, hb, i, (i - 1) // 2)
        i = (i - 1) // 2
    return (hc, ha, hb), n + 1


@nb.njit(cache=True)
def _pop(hc, ha, hb, n, pool, off, size):
    """Remove the best entry (returned as c, a, b); the heap then holds n - 1 entries."""
    c, a, b = hc[0], ha[0], hb[0]
    n -= 1
    _swap(hc, ha, hb, 0, n)
    i = 0
    while True:
        best, l, r = i, 2 * i + 1, 2 * i + 2
        if l < n and _better(hc, ha, hb, l, best, pool, off, size):
            best = l
        if r < n and _better(hc, ha, hb, r, best, pool, off, size):
            best = r
        if best == i:
            return c, a, b
        _swap(hc, ha, hb, i, best)
        i = best


@nb.njit(cache=True)
def _grow(arr, n):
    """arr copied into a new array of max(n, 16) entries. (Loops, not slice assignments: a
    slice assignment compiles NumPy's shape-mismatch error message, ~4 CPU s cold.)"""
    out = np.empty(max(n, 16), dtype=arr.dtype)  # (n,)
    for i in range(arr.shape[0]):
        out[i] = arr[i]
    return out


@nb.njit(cache=True)
def _sort(a):
    """a (n,) sorted in place, ascending (heapsort: np.sort compiles a quicksort, ~2 CPU s)."""
    n = a.shape[0]
    for i in range(n // 2 - 1, -1, -1):
        _sift(a, i, n)
    for end in range(n - 1, 0, -1):
        a[0], a[end] = a[end], a[0]
        _sift(a, 0, end)
    return a


@nb.njit(cache=True)
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


@nb.njit(cache=True)
def _links(start, length, n):
    """Each position's word, and the next and previous live position in that word (-1 past
    its ends): (N,) each. A merge unlinks the right half of each site."""
    wof, nxt, prv = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    for w in range(start.shape[0]):
        s, e = start[w], start[w] + length[w]
        for j in range(s, e):
            wof[j], nxt[j], prv[j] = w, j + 1 if j + 1 < e else -1, j - 1 if j > s else -1
    return wof, nxt, prv


@nb.njit(cache=True)
def _find(tkey, k):
    """The slot of key k in the pair table, or the empty slot (key -1) where it would go."""
    h = _slot(k, tkey.shape[0])
    while tkey[h] >= 0 and tkey[h] != k:
        h = (h + 1) & (tkey.shape[0] - 1)
    return h


@nb.njit(cache=True)
def _table(size):
    """An empty pair table of `size` slots (a power of two): key (-1: empty), count, posting
    head (-1: none), stamp (the last merge that pushed the pair)."""
    return (np.full(size, -1, np.int64), np.zeros(size, np.int64), np.full(size, -1, np.int64),
            np.full(size, -1, np.int64))                 # 4x (S,)


@nb.njit(cache=True)
def _rehash(tab, size):
    """The live pairs (count > 0) of `tab` in a fresh table of `size` slots; (table, used)."""
    tkey, tcount, thead, tstamp = tab
    new = _table(size)
    used = np.int64(0)
    for h in range(tkey.shape[0]):
        if tkey[h] >= 0 and tcount[h] > 0:
            g = _find(new[0], tkey[h])
            new[0][g], new[1][g], new[2][g], new[3][g] = tkey[h], tcount[h], thead[h], tstamp[h]
            used += 1
    return new, used


@nb.njit(cache=True)
def _merge_loop(sym, start, length, freq, n_merges):
    """The kernel of merge_loop_numba (inputs checked there): (M, 2) merged pairs (a, b)."""
    tab = _table(1 << 17)                                 # 4x (S,) pair table
    used = np.int64(0)
    links = _links(start, length, sym.shape[0])           # 3x (N,): word, next, previous
    pp = np.empty(sym.shape[0] + 16, dtype=np.int64)      # (P,) posting -> position
    pn = np.empty(sym.shape[0] + 16, dtype=np.int64)      # (P,) posting -> next posting
    n_post = np.int64(0)
    for w in range(start.shape[0]):
        for j in range(start[w], start[w] + length[w] - 1):
            h = _find(tab[0], _key(sym[j], sym[j + 1]))   # at most 2^16 byte pairs: no growth
            if tab[0][h] < 0:
                tab[0][h] = _key(sym[j], sym[j + 1])
                used += 1
            tab[1][h] += freq[w]
            pp[n_post], pn[n_post] = j, tab[2][h]
            tab[2][h] = n_post
            n_post += 1
    n_tok = 256 + n_merges
    off = np.zeros(n_tok, dtype=np.int64)                 # (V,) token bytes in pool
    size = np.ones(n_tok, dtype=np.int64)                 # (V,)
    pool = np.empty(4096, dtype=np.int64)                 # (Z,) grows
    for t in range(256):
        off[t], pool[t] = t, t
    pool_n = np.int64(256)
    heap = (np.empty(16, np.int64), np.empty(16, np.int64), np.empty(16, np.int64))  # 3x (H,)
    n_heap = np.int64(0)
    for h in range(tab[0].shape[0]):
        if tab[1][h] > 0:
            heap, n_heap = _push(heap, n_heap, tab[1][h], tab[0][h] >> 32,
                                 tab[0][h] & 0xFFFFFFFF, pool, off, size)
    merged = np.empty((n_merges, 2), dtype=np.int64)      # (M, 2)
    for step in range(n_merges):
        a, b, found = np.int64(0), np.int64(0), False
        while n_heap > 0 and not found:
            c, a, b = _pop(heap[0], heap[1], heap[2], n_heap, pool, off, size)
            n_heap -= 1
            now = tab[1][_find(tab[0], _key(a, b))]
            found = now == c
            if not found and now > 0:
                heap, n_heap = _push(heap, n_heap, now, a, b, pool, off, size)
        if not found:
            return merged[:step]
        new = 256 + step
        merged[step, 0], merged[step, 1] = a, b
        if pool_n + size[a] + size[b] > pool.shape[0]:
            pool = _grow(pool, 2 * (pool_n + size[a] + size[b]))
        for i in range(size[a]):
            pool[pool_n + i] = pool[off[a] + i]
        for i in range(size[b]):
            pool[pool_n + size[a] + i] = pool[off[b] + i]
        off[new], size[new] = pool_n, size[a] + size[b]
        pool_n += size[new]
        sites = _sites(tab, pp, pn, _key(a, b))
        if 2 * (used + 2 * sites.shape[0]) > tab[0].shape[0]:  # room for every new pair
            tab, used = _rehash(tab, 2 * tab[0].shape[0])
            while 2 * (used + 2 * sites.shape[0]) > tab[0].shape[0]:
                tab, used = _rehash(tab, 2 * tab[0].shape[0])
        touched, pp, pn, n_post, used = _merge_sites(sym, links, freq, tab, used, pp, pn,
                                                     n_post, sites, (a, b, new))
        h = _find(tab[0], _key(a, b))
        tab[1][h], tab[2][h] = 0, -1                      # (a, b) is gone
        for k in touched:
            h = _find(tab[0], k)
            if tab[1][h] > 0 and tab[3][h] != step:       # each touched pair pushed once
                tab[3][h] = step
                heap, n_heap = _push(heap, n_heap, tab[1][h], k >> 32, k & 0xFFFFFFFF,
                                     pool, off, size)
    return merged


@nb.njit(cache=True)
def _add(tab, used, pp, pn, n_post, k, f, j):
    """count[k] += f (a new key takes an empty slot: the caller made room), position j posted
    under pair k. Returns (pp, pn, n_post + 1, used)."""
    h = _find(tab[0], k)
    if tab[0][h] < 0:
        tab[0][h] = k
        used += 1
    tab[1][h] += f
    if n_post == pp.shape[0]:
        pp, pn = _grow(pp, 2 * n_post), _grow(pn, 2 * n_post)
    pp[n_post], pn[n_post] = j, tab[2][h]
    tab[2][h] = n_post
    return pp, pn, n_post + 1, used


@nb.njit(cache=True)
def _sites(tab, pp, pn, k):
    """The positions posted under pair k, in position order (so each word's sites are merged
    left to right, as a scan would); some are stale or repeated."""
    out = np.empty(16, dtype=np.int64)                    # (S,) grows
    n, node = 0, tab[2][_find(tab[0], k)]
    while node >= 0:
        if n == out.shape[0]:
            out = _grow(out, 2 * n)
        out[n], n, node = pp[node], n + 1, pn[node]
    return _sort(out[:n])


@nb.njit(cache=True)
def _merge_sites(sym, links, freq, tab, used, pp, pn, n_post, sites, merge):
    """Rewrite (a, b) -> new (merge) at each live site: the work is per site, not per word (a
    word of m bytes costs O(sites), not O(m), per merge). Returns the touched pair keys (pairs
    with `new`), the postings and the table's used slots."""
    a, b, new = merge
    wof, nxt, prv = links
    touched = np.empty(2 * sites.shape[0] + 1, dtype=np.int64)  # (K,)
    nt = np.int64(0)
    for p in sites:
        q = nxt[p]
        if sym[p] != a or q < 0 or sym[q] != b:           # stale, or merged at this step
            continue
        f, o, r = freq[wof[p]], prv[p], nxt[q]
        if o >= 0:                                        # (prev, a) -> (prev, new)
            tab[1][_find(tab[0], _key(sym[o], a))] -= f
            touched[nt], nt = _key(sym[o], new), nt + 1
            pp, pn, n_post, used = _add(tab, used, pp, pn, n_post, touched[nt - 1], f, o)
        if r >= 0:                                        # (b, next) -> (new, next)
            tab[1][_find(tab[0], _key(b, sym[r]))] -= f
            touched[nt], nt = _key(new, sym[r]), nt + 1
            pp, pn, n_post, used = _add(tab, used, pp, pn, n_post, touched[nt - 1], f, p)
            prv[r] = p
        sym[p], sym[q], nxt[p] = new, -1, r               # q leaves the word
    return touched[:nt], pp, pn, n_post, used
