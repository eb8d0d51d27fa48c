"""Numba merge loop of the fast BPE trainer (train.py `merge_loop` calls it).

State, for W unique pre-tokens ("words") and the pairs (a, b) of token ids inside them:
- sym: every word's token ids, word w at sym[start[w] : start[w] + length[w]] (shrinks in place);
- count[key(a, b)] = sum over words of freq[w] * occurrences of (a, b) in w;
- postings: pair -> linked list of words that contained it when it appeared (stale entries are
  harmless: a word whose copy no longer holds (a, b) is rewritten unchanged);
- heap of (count, a, b), best = largest count, ties -> greatest (bytes(a), bytes(b)).
  Lazy invalidation: counts of existing pairs only fall (a merge only creates pairs containing
  the new token), so a popped entry whose count is stale is re-pushed with its current count.
Merging (a, b) -> new in a word: at each site, with `prev` the token before it in the rewritten
word and `next` the one after, (prev, a) becomes (prev, new) and (b, next) becomes (new, next);
nothing else in the word changes. Twin: train.py `train_bpe_ref` (full recount per merge).

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
    stops early when the corpus runs out of pairs. sym and length are rewritten in place.
    The words are checked first (kernel_checks.check_words): the kernel trusts them."""
    check_words("merge_loop_numba", sym, start, length, freq, n_merges)
    return _merge_loop(sym, start, length, freq, int(n_merges))


@nb.njit(cache=True)
def _merge_loop(sym, start, length, freq, n_merges):
    """The kernel of merge_loop_numba (inputs checked there)."""
    count = Dict.empty(key_type=types.int64, value_type=types.int64)
    head = Dict.empty(key_type=types.int64, value_type=types.int64)
    pw = np.empty(sym.shape[0] + 16, dtype=np.int64)      # (P,) posting -> word
    pn = np.empty(sym.shape[0] + 16, dtype=np.int64)      # (P,) posting -> next posting
    n_post = 0
    for w in range(start.shape[0]):
        for j in range(start[w], start[w] + length[w] - 1):
            k = _key(sym[j], sym[j + 1])
            count[k] = count.get(k, 0) + freq[w]
            pw[n_post], pn[n_post] = w, head.get(k, -1)
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
    seen = np.full(start.shape[0], -1, dtype=np.int64)    # (W,) step a word was rewritten at
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
        touched, pw, pn, n_post = _merge_words(sym, start, length, freq, count, head, pw, pn,
                                               n_post, seen, step, a, b, new)
        count.pop(_key(a, b))
        head.pop(_key(a, b))
        for k in np.unique(touched):
            if count[k] > 0:
                heap, n_heap = _push(heap, n_heap, count[k], k >> 32, k & 0xFFFFFFFF,
                                     pool, off, size)


@nb.njit(cache=True)
def _add(count, head, pw, pn, n_post, touched, nt, k, f, w):
    """count[k] += f, word w posted under pair k, k recorded as touched."""
    count[k] = count.get(k, 0) + f
    if n_post == pw.shape[0]:
        pw, pn = _grow(pw, 2 * n_post), _grow(pn, 2 * n_post)
    pw[n_post], pn[n_post] = w, head.get(k, -1)
    head[k] = n_post
    if nt == touched.shape[0]:
        touched = _grow(touched, 2 * nt)
    touched[nt] = k
    return pw, pn, n_post + 1, touched, nt + 1


@nb.njit(cache=True)
def _merge_words(sym, start, length, freq, count, head, pw, pn, n_post, seen, step, a, b, new):
    """Rewrite (a, b) -> new in every word posted under (a, b); returns the touched pair keys
    (pairs with `new`) and the postings."""
    touched = np.empty(16, dtype=np.int64)                # (K,) grows
    nt = 0
    node = head[_key(a, b)]
    while node >= 0:
        w = pw[node]
        node = pn[node]
        if seen[w] == step:
            continue
        seen[w] = step
        s, f = start[w], freq[w]
        end = s + length[w]
        o, j = s, s
        while j < end:
            if j + 1 < end and sym[j] == a and sym[j + 1] == b:
                if o > s:                                 # (prev, a) -> (prev, new)
                    count[_key(sym[o - 1], a)] -= f
                    pw, pn, n_post, touched, nt = _add(count, head, pw, pn, n_post, touched,
                                                       nt, _key(sym[o - 1], new), f, w)
                if j + 2 < end:                           # (b, next) -> (new, next)
                    count[_key(b, sym[j + 2])] -= f
                    pw, pn, n_post, touched, nt = _add(count, head, pw, pn, n_post, touched,
                                                       nt, _key(new, sym[j + 2]), f, w)
                sym[o] = new
                j += 2
            else:
                sym[o] = sym[j]
                j += 1
            o += 1
        length[w] = o - s
    return touched[:nt], pw, pn, n_post
