"""Numba merge loop of the fast BPE trainer (train.py `merge_loop` calls it).

State, for W unique pre-tokens ("words") and the pairs (a, b) of token ids inside them:
- sym: every word's token ids, word w at sym[start[w] : start[w] + length[w]], linked as a list
  per word (nxt, prv): a merge at a site rewrites its left position and unlinks its right one;
- count[key(a, b)] = sum over words of freq[w] * occurrences of (a, b) in w;
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

Glossary: key(a, b) = a << 32 | b; pool/off/size = the bytes of every token, for tie-breaks.
"""
import numba as nb
import numpy as np
from numba import types
from numba.typed import Dict

from .kernel_checks import check_words


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
    out = np.empty(max(n, 16), dtype=arr.dtype)  # (n,)
    out[:arr.shape[0]] = arr
    return out


def merge_loop_numba(sym, start, length, freq, n_merges):
    """Generator of the merged pairs (a, b) of ids, in order (new ids are 256, 257, ...); it
    stops early when the corpus runs out of pairs. sym is rewritten in place (a merged-away
    position holds -1). The words are checked first (kernel_checks.check_words): the kernel
    trusts them."""
    check_words("merge_loop_numba", sym, start, length, freq, n_merges)
    return _merge_loop(sym, start, length, freq, int(n_merges))


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
def _merge_loop(sym, start, length, freq, n_merges):
    """The kernel of merge_loop_numba (inputs checked there)."""
    count = Dict.empty(key_type=types.int64, value_type=types.int64)
    head = Dict.empty(key_type=types.int64, value_type=types.int64)
    links = _links(start, length, sym.shape[0])           # 3x (N,): word, next, previous
    pp = np.empty(sym.shape[0] + 16, dtype=np.int64)      # (P,) posting -> position
    pn = np.empty(sym.shape[0] + 16, dtype=np.int64)      # (P,) posting -> next posting
    n_post = 0
    for w in range(start.shape[0]):
        for j in range(start[w], start[w] + length[w] - 1):
            k = _key(sym[j], sym[j + 1])
            count[k] = count.get(k, 0) + freq[w]
            pp[n_post], pn[n_post] = j, head.get(k, -1)
            head[k] = n_post
            n_post += 1
    n_tok = 256 + n_merges
    off = np.zeros(n_tok, dtype=np.int64)                 # (V,) token bytes in pool
    size = np.ones(n_tok, dtype=np.int64)                 # (V,)
    pool = np.empty(4096, dtype=np.int64)                 # (Z,) grows
    for t in range(256):
        off[t], pool[t] = t, t
    pool_n = 256
    heap = (np.empty(16, np.int64), np.empty(16, np.int64), np.empty(16, np.int64))  # 3x (H,)
    n_heap = 0
    for k, c in count.items():
        heap, n_heap = _push(heap, n_heap, c, k >> 32, k & 0xFFFFFFFF, pool, off, size)
    for step in range(n_merges):
        a, b, found = 0, 0, False
        while n_heap > 0 and not found:
            c, a, b = _pop(heap[0], heap[1], heap[2], n_heap, pool, off, size)
            n_heap -= 1
            now = count.get(_key(a, b), 0)
            found = now == c
            if not found and now > 0:
                heap, n_heap = _push(heap, n_heap, now, a, b, pool, off, size)
        if not found:
            return
        new = 256 + step
        yield a, b
        if pool_n + size[a] + size[b] > pool.shape[0]:
            pool = _grow(pool, 2 * (pool_n + size[a] + size[b]))
        pool[pool_n:pool_n + size[a]] = pool[off[a]:off[a] + size[a]]
        pool[pool_n + size[a]:pool_n + size[a] + size[b]] = pool[off[b]:off[b] + size[b]]
        off[new], size[new] = pool_n, size[a] + size[b]
        pool_n += size[new]
        touched, pp, pn, n_post = _merge_sites(sym, links, freq, count, head, pp, pn, n_post,
                                               a, b, new)
        count.pop(_key(a, b))
        head.pop(_key(a, b))
        for k in np.unique(touched):
            if count[k] > 0:
                heap, n_heap = _push(heap, n_heap, count[k], k >> 32, k & 0xFFFFFFFF,
                                     pool, off, size)


@nb.njit(cache=True)
def _add(count, head, pp, pn, n_post, touched, nt, k, f, j):
    """count[k] += f, position j posted under pair k, k recorded as touched."""
    count[k] = count.get(k, 0) + f
    if n_post == pp.shape[0]:
        pp, pn = _grow(pp, 2 * n_post), _grow(pn, 2 * n_post)
    pp[n_post], pn[n_post] = j, head.get(k, -1)
    head[k] = n_post
    if nt == touched.shape[0]:
        touched = _grow(touched, 2 * nt)
    touched[nt] = k
    return pp, pn, n_post + 1, touched, nt + 1


@nb.njit(cache=True)
def _sites(head, pp, pn, k):
    """The positions posted under pair k, in position order (so each word's sites are merged
    left to right, as a scan would); some are stale or repeated."""
    out = np.empty(16, dtype=np.int64)                    # (S,) grows
    n, node = 0, head[k]
    while node >= 0:
        if n == out.shape[0]:
            out = _grow(out, 2 * n)
        out[n], n, node = pp[node], n + 1, pn[node]
    return np.sort(out[:n])


@nb.njit(cache=True)
def _merge_sites(sym, links, freq, count, head, pp, pn, n_post, a, b, new):
    """Rewrite (a, b) -> new at each live site: the work is per site, not per word (a word
    of m bytes costs O(sites), not O(m), per merge). Returns the touched pair keys (pairs
    with `new`) and the postings."""
    wof, nxt, prv = links
    touched = np.empty(16, dtype=np.int64)                # (K,) grows
    nt = 0
    for p in _sites(head, pp, pn, _key(a, b)):
        q = nxt[p]
        if sym[p] != a or q < 0 or sym[q] != b:           # stale, or merged at this step
            continue
        f, o, r = freq[wof[p]], prv[p], nxt[q]
        if o >= 0:                                        # (prev, a) -> (prev, new)
            count[_key(sym[o], a)] -= f
            pp, pn, n_post, touched, nt = _add(count, head, pp, pn, n_post, touched, nt,
                                               _key(sym[o], new), f, o)
        if r >= 0:                                        # (b, next) -> (new, next)
            count[_key(b, sym[r])] -= f
            pp, pn, n_post, touched, nt = _add(count, head, pp, pn, n_post, touched, nt,
                                               _key(new, sym[r]), f, p)
            prv[r] = p
        sym[p], sym[q], nxt[p] = new, -1, r               # q leaves the word
    return touched[:nt], pp, pn, n_post
