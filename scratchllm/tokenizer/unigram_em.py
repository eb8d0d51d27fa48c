"""The Unigram trainer's kernels (unigram_train.py), each a Numba kernel beside its readable
Python twin (`_ref`); tests/tokenizer/test_unigram_kernels.py checks that they agree.

    expected_counts  the E-step: c_v = sum_w f_w sum_{edges i->j of v} exp(a[i] + s_v + b[j]
                     - a[n]) and L = sum_w f_w a[n] (a, b: forward, backward log weights)
    viterbi_counts   F_v = sum_w f_w (times v occurs in the Viterbi segmentation of w)
    prune_losses     per piece v: -inf = remove (F_v = 0, or the best segmentation of v's own
                     string splits it), +inf = keep (no other segmentation of v's string), else
                     SentencePiece's loss F_v (log p(v) - sum_{u in alt(v)} log p'(u)), with
                     alt(v) the best segmentation of v's string without v, p(v) = F_v / sum F,
                     p'(u) = (F_u + F_v) / (sum F + F_v (|alt(v)| - 1)) (F_v moved to alt(v)).
    count_substrings the seed counts (unigram_train.py rule 2), memory bounded by `cap`
Words: pool (int32 code points), off (W+1,), freq (W,) as in unigram_lattice.py; the pieces are
the trie's, ids 0..V-1, log-probabilities logp (V,) (-inf: absent).
"""
import math
from collections import Counter

import numba as nb
import numpy as np

from scratchllm.core.blas import run_tasks

from . import nbcache
from .unigram_lattice import _edges, _logadd, _text, frozen, lattice_edges

nbcache.drop_stale(__file__, "unigram_lattice.py")   # these kernels call unigram_lattice's

SPACE_CP = 0x2581
_FNV = np.uint64(0x100000001B3)


def _on_threads(kernel, *args):
    """kernel(*args, c, n) for c = 0..n-1, n = Numba's thread count, on the process's task
    threads (core/blas.run_tasks; the kernels release the GIL; chunk c takes words c, c + n,
    ...). Threads over one serial kernel, not prange: parallel=True compiled each kernel's
    loop a second time as a gufunc, 2-3 CPU s per kernel cold."""
    n = nb.get_num_threads()
    run_tasks(lambda c: kernel(*args, c, n), n, n)


def _word_refs(pool, off):
    return [_text(pool[off[w]:off[w + 1]]) for w in range(len(off) - 1)]


@nb.njit(cache=True)
def _longest(off):
    """The most code points of a word (a loop: np.max over off[1:] - off[:-1] compiled an
    array expression and NumPy's max for each kernel)."""
    most = 0
    for w in range(len(off) - 1):
        most = max(most, off[w + 1] - off[w])
    return most


# ---- E-step ----------------------------------------------------------------------------------
def expected_counts(pool, off, freq, trie, logp):
    """(c (V,), L): expected piece counts and corpus log-likelihood (nats)."""
    n = nb.get_num_threads()
    counts, ll = np.zeros((n, len(logp))), np.zeros(n)         # (chunks, V), (chunks,)
    _on_threads(_expected_counts, frozen(pool), off, freq, trie.keys, trie.child,
                trie.node_piece, trie.max_len, logp, counts, ll)
    return counts.sum(0), float(ll.sum())


@nb.njit(cache=True, nogil=True)
def _expected_counts(pool, off, freq, keys, child, node_piece, max_len, logp, counts, ll, c,
                     n_chunks):
    """Chunk c of expected_counts: its words' counts into counts[c], log-lik into ll[c]."""
    longest = _longest(off)
    es = np.empty(longest * (max_len + 1), np.int64)
    ee, ep = np.empty_like(es), np.empty_like(es)
    a, b = np.empty(longest + 1), np.empty(longest + 1)       # forward, backward log weights
    for w in range(c, len(freq), n_chunks):
        n = off[w + 1] - off[w]
        m = _edges(pool, off[w], n, keys, child, node_piece, max_len, logp, es, ee, ep)
        a[:n + 1], b[:n + 1] = -np.inf, -np.inf
        a[0], b[n] = 0.0, 0.0
        for e in range(m):
            if ep[e] >= 0:
                a[ee[e]] = _logadd(a[ee[e]], a[es[e]] + logp[ep[e]])
        if a[n] == -np.inf:
            ll[c] = -np.inf
            continue
        for e in range(m - 1, -1, -1):
            if ep[e] >= 0:
                b[es[e]] = _logadd(b[es[e]], logp[ep[e]] + b[ee[e]])
        ll[c] += freq[w] * a[n]
        for e in range(m):
            if ep[e] >= 0:
                counts[c, ep[e]] += freq[w] * math.exp(a[es[e]] + logp[ep[e]] + b[ee[e]] - a[n])


def expected_counts_ref(pool, off, freq, trie, logp):
    """Readable twin of expected_counts."""
    counts, total = np.zeros(len(logp)), 0.0
    for w, f in zip(_word_refs(pool, off), freq):
        n = len(w)
        edges = lattice_edges(w, trie.index, trie.max_len, logp, -1, -np.inf)
        a, b = np.full(n + 1, -np.inf), np.full(n + 1, -np.inf)   # (n+1,) each
        a[0], b[n] = 0.0, 0.0
        for i in range(n):
            for j, _, s in edges[i]:
                a[j] = np.logaddexp(a[j], a[i] + s)
        for i in range(n - 1, -1, -1):
            for j, _, s in edges[i]:
                b[i] = np.logaddexp(b[i], s + b[j])
        total += f * a[n]
        if a[n] == -np.inf:
            continue
        for i in range(n):
            for j, k, s in edges[i]:
                if k >= 0:
                    counts[k] += f * math.exp(a[i] + s + b[j] - a[n])
    return counts, float(total)


# ---- Viterbi counts --------------------------------------------------------------------------
def viterbi_counts(pool, off, freq, trie, logp):
    """F (V,): weighted count of each piece in the words' Viterbi segmentations."""
    counts = np.zeros((nb.get_num_threads(), len(logp)))   # (chunks, V)
    _on_threads(_viterbi_counts, frozen(pool), off, freq, trie.keys, trie.child,
                trie.node_piece, trie.max_len, logp, counts)
    return counts.sum(0)


@nb.njit(cache=True)
def _best(m, n, es, ee, ep, logp, best, back, banned):
    """best[j], back[j] (edge into j) over edges 0..m-1, without the edge 0 -> n of `banned`."""
    best[:n + 1], back[:n + 1] = -np.inf, -1
    best[0] = 0.0
    for e in range(m):
        if ep[e] < 0 or (ep[e] == banned and es[e] == 0 and ee[e] == n):
            continue
        s = best[es[e]] + logp[ep[e]]
        if s > best[ee[e]]:
            best[ee[e]], back[ee[e]] = s, e


@nb.njit(cache=True, nogil=True)
def _viterbi_counts(pool, off, freq, keys, child, node_piece, max_len, logp, counts, c,
                    n_chunks):
    """Chunk c of viterbi_counts, into counts[c]."""
    longest = _longest(off)
    es = np.empty(longest * (max_len + 1), np.int64)
    ee, ep = np.empty_like(es), np.empty_like(es)
    best, back = np.empty(longest + 1), np.empty(longest + 1, np.int64)
    for w in range(c, len(freq), n_chunks):
        n = off[w + 1] - off[w]
        m = _edges(pool, off[w], n, keys, child, node_piece, max_len, logp, es, ee, ep)
        _best(m, n, es, ee, ep, logp, best, back, np.int64(-1))   # int64: one typing of _best
        j = n if best[n] > -np.inf else 0
        while j > 0:
            counts[c, ep[back[j]]] += freq[w]
            j = es[back[j]]


def _viterbi_pieces_ref(w, index, max_len, logp, banned=None):
    """Ids of the best segmentation of the str w, without the piece w itself if banned."""
    n, best, back = len(w), [0.0] + [-math.inf] * len(w), [None] * (len(w) + 1)
    for i, out in enumerate(lattice_edges(w, index, max_len, logp, -1, -np.inf)):
        for j, k, s in out:
            if k >= 0 and not (k == banned and (i, j) == (0, n)) and best[i] + s > best[j]:
                best[j], back[j] = best[i] + s, (i, k)
    if back[n] is None:
        return None, -math.inf
    out, j = [], n
    while j > 0:
        j, k = back[j]
        out.append(k)
    return out[::-1], best[n]


def viterbi_counts_ref(pool, off, freq, trie, logp):
    """Readable twin of viterbi_counts."""
    counts = np.zeros(len(logp))
    for w, f in zip(_word_refs(pool, off), freq):
        for k in _viterbi_pieces_ref(w, trie.index, trie.max_len, logp)[0] or []:
            counts[k] += f
    return counts


# ---- pruning loss ----------------------------------------------------------------------------
def prune_losses(trie, logp, freq):
    """loss (V,) of each piece (module docstring); freq = viterbi_counts."""
    loss = np.full(len(logp), -np.inf)
    _on_threads(_prune_losses, trie.pool, trie.off, trie.ids, trie.keys, trie.child,
                trie.node_piece, trie.max_len, logp, freq, loss)
    return loss


@nb.njit(cache=True, nogil=True)
def _prune_losses(pool, off, ids, keys, child, node_piece, max_len, logp, freq, loss, c,
                  n_chunks):
    """Chunk c of prune_losses: pieces c, c + n_chunks, ... (distinct ids: each loss[v] has
    one writer)."""
    total = freq.sum()
    for k in range(c, len(ids), n_chunks):
        v, n = ids[k], off[k + 1] - off[k]
        if freq[v] == 0 or logp[v] == -np.inf:
            continue
        es = np.empty(n * (max_len + 1), np.int64)
        ee, ep = np.empty_like(es), np.empty_like(es)
        best, back = np.empty(n + 1), np.empty(n + 1, np.int64)
        m = _edges(pool, off[k], n, keys, child, node_piece, max_len, logp, es, ee, ep)
        _best(m, n, es, ee, ep, logp, best, back, v)
        if best[n] == -np.inf:
            loss[v] = np.inf
            continue
        if best[n] > logp[v]:
            continue
        n_alt, j = 0, n
        while j > 0:
            n_alt, j = n_alt + 1, es[back[j]]
        logsum_alt, lp_alt, j = math.log(total + freq[v] * (n_alt - 1)), 0.0, n
        while j > 0:
            lp_alt += math.log(freq[ep[back[j]]] + freq[v]) - logsum_alt
            j = es[back[j]]
        loss[v] = freq[v] * (math.log(freq[v]) - math.log(total) - lp_alt)


def prune_losses_ref(trie, logp, freq):
    """Readable twin of prune_losses."""
    loss, total = np.full(len(logp), -np.inf), freq.sum()
    for p, v in trie.index.items():
        if freq[v] == 0 or logp[v] == -np.inf:
            continue
        alt, score = _viterbi_pieces_ref(p, trie.index, trie.max_len, logp, banned=v)
        if alt is None:
            loss[v] = np.inf
        elif score <= logp[v]:
            logsum_alt = math.log(total + freq[v] * (len(alt) - 1))
            lp_alt = sum(math.log(freq[u] + freq[v]) - logsum_alt for u in alt)
            loss[v] = freq[v] * (math.log(freq[v]) - math.log(total) - lp_alt)
    return loss


# ---- seed substrings -------------------------------------------------------------------------
def count_substrings(pool, off, freq, max_len, cap):
    """(starts, lens, counts) of the substrings of 2..max_len code points of the words (no
    SPACE after their first character), counted with the words' freq, in words' order; each
    substring is represented by its first occurrence pool[start:start+len]. Whenever more
    than `cap` distinct substrings are held, those whose count is <= the lower median count
    are dropped (a dropped substring seen again starts afresh). Sorted by (start, len).

    The kernel counts until the cap is passed and returns; the halving runs here in NumPy
    (its kernel _reinsert compiles only when a corpus reaches the cap), then the count goes
    on from where it stopped."""
    pool, off, freq = frozen(pool), np.ascontiguousarray(off, np.int64), np.asarray(freq, float)
    slots = 1 << int(2 * cap + 2).bit_length()
    table = (np.zeros(slots, np.uint64), np.zeros(slots, np.int64),      # hash (0 = empty),
             np.zeros(slots, np.int8), np.zeros(slots))                   # start, len, count
    state = np.array([0, 0, 0, 0], np.int64)                  # word, start, end, held
    while True:
        _count_substrings(pool, off, freq, max_len, cap, table, state)
        if state[0] == len(freq):
            break
        live = np.flatnonzero(table[0])                          # (held,) in slot order
        median = np.sort(table[3][live])[(len(live) - 1) // 2]
        kept = [a[live[table[3][live] > median]] for a in table]
        for a in table:
            a[:] = 0
        _reinsert(table, pool, *kept)
        state[3] = len(kept[0])
    live = np.flatnonzero(table[0])
    starts, lens, counts = table[1][live], table[2][live].astype(np.int64), table[3][live]
    order = np.lexsort((lens, starts))
    return starts[order], lens[order], counts[order]


@nb.njit(cache=True)
def _insert(table, pool, h, s, n, f):
    """Add f to the count of the substring pool[s:s+n] (hash h) or insert it: returns 1 if
    it was new."""
    hashes, reps, lens, counts = table
    mask = len(hashes) - 1
    t = np.int64(h >> np.uint64(20)) & mask
    while hashes[t] != 0:
        if hashes[t] == h and lens[t] == n:
            same = True
            for q in range(n):
                if pool[reps[t] + q] != pool[s + q]:
                    same = False
                    break
            if same:
                table[3][t] += f
                return 0
        t = (t + 1) & mask
    hashes[t], reps[t], lens[t], counts[t] = h, s, n, f
    return 1


@nb.njit(cache=True)
def _count_substrings(pool, off, freq, max_len, cap, table, state):
    """Count from state = (word w, start i, end j, held): the substrings pool[i:j'] with j' >
    j come next (j = 0: all of them). Stops at the end (state[0] = W) or when more than cap
    are held (state: where to go on)."""
    w, i, skip, held = state[0], state[1], state[2], state[3]
    while w < len(freq):
        i = max(i, off[w])
        while i < off[w + 1]:
            h = np.uint64(0xCBF29CE484222325)
            for j in range(i, min(off[w + 1], i + max_len)):
                if j > i and pool[j] == SPACE_CP:
                    break
                h = (h ^ np.uint64(pool[j])) * _FNV
                if j > i and j >= skip:
                    held += _insert(table, pool, h | np.uint64(1), i, j + 1 - i, freq[w])
                    if held > cap:
                        state[0], state[1], state[2], state[3] = w, i, j + 1, held
                        return
            i, skip = i + 1, 0
        w += 1
    state[0], state[3] = w, held


@nb.njit(cache=True)
def _reinsert(table, pool, hashes, reps, lens, counts):
    for t in range(len(hashes)):
        _insert(table, pool, hashes[t], reps[t], np.int64(lens[t]), counts[t])


def count_substrings_ref(pool, off, freq, max_len, cap):
    """Readable twin of count_substrings."""
    counts, first = Counter(), {}
    for w in range(len(freq)):
        text, base = _text(pool[off[w]:off[w + 1]]), off[w]
        for i in range(len(text)):
            for j in range(i + 2, min(len(text), i + max_len) + 1):
                if text[j - 1] == "\u2581":
                    break
                sub = text[i:j]
                if sub not in counts:
                    first[sub] = base + i
                counts[sub] += freq[w]
                if len(counts) > cap:
                    median = sorted(counts.values())[(len(counts) - 1) // 2]
                    counts = Counter({s: c for s, c in counts.items() if c > median})
                    first = {s: first[s] for s in counts}
    keys = sorted(counts, key=lambda s: (first[s], len(s)))
    return (np.array([first[s] for s in keys], np.int64), np.array([len(s) for s in keys],
                                                                    np.int64),
            np.array([counts[s] for s in keys], np.float64))
