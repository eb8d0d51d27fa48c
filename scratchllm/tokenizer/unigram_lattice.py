"""Numba kernels over Unigram lattices, each beside its readable Python twin (`_ref`).

A vocabulary of pieces is held as a trie (`PieceTrie`): node 0 is the root; the child of node u
by code point c is found in an open-addressing hash table keyed by u * 0x110000 + c; node_piece
[u] is the id of the piece that ends at u (-1: none). Walking the trie from position i of a
text x gives every lattice edge i -> j (x[i:j] a piece) in increasing j, and stops as soon as
x[i:j] is no prefix of any piece. An edge whose piece has log p = -inf is absent.

    expected_counts  forward a[j] = logsumexp_{i->j} a[i] + s, backward b[i] = logsumexp_{i->j}
                     s + b[j]; expected count of the edge's piece += f exp(a[i] + s + b[j] -
                     a[n]); log-likelihood += f a[n]   (the E-step, over every word)
    viterbi_counts   count of each piece in the Viterbi segmentations of the words
    prune_losses     SentencePiece's pruning loss of each piece (unigram_train.py)

Words are given as one int32 array of code points (pool), offsets off (W+1,) and counts freq
(W,); the word w is pool[off[w]:off[w+1]].
Encoding's Viterbi walks a double array instead (unigram_viterbi.py).
Glossary: s = score = log p(piece); f = count of a word; V = number of piece ids.
"""
import math

import numba as nb
import numpy as np

_MULT = np.uint64(0x9E3779B97F4A7C15)
_BASE = 0x110000


def code_points(text):
    """int32 (len(text),) code points of a str (read-only: see frozen)."""
    return np.frombuffer(text.encode("utf-32-le"), dtype="<i4")


def frozen(a, dtype=np.int32):
    """A read-only C-contiguous `dtype` view of a (a copy only to change dtype or layout).
    Numba compiles one specialisation per array type, and read-only vs writable is part of
    it: every kernel taking code points gets them through here, so each compiles once."""
    a = np.ascontiguousarray(a, dtype)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


class PieceTrie:
    """The trie of the pieces pool[off[k]:off[k+1]] with ids ids[k] (ids < n_ids)."""

    def __init__(self, pool, off, ids, n_ids):
        pool, off = frozen(pool), np.ascontiguousarray(off, np.int64)
        self.pool, self.off, self.ids = pool, off, np.ascontiguousarray(ids, np.int64)
        self.n_ids, self.max_len = int(n_ids), int(np.diff(off).max(initial=1))
        slots = 1 << max(4, int(4 * len(off)).bit_length())    # doubled while over half full
        while True:
            self.keys = np.full(slots, -1, np.int64)
            self.child = np.zeros(slots, np.int32)
            self.node_piece = np.full(len(pool) + 1, -1, np.int64)
            if _fill(pool, off, self.ids, self.keys, self.child, self.node_piece):
                break
            slots *= 2
        self._index = None

    @classmethod
    def from_strings(cls, pieces, ids, n_ids):
        lens = np.fromiter((len(p) for p in pieces), np.int64, len(pieces))
        return cls(code_points("".join(pieces)), np.concatenate([[0], np.cumsum(lens)]), ids,
                   n_ids)

    def piece(self, k):
        """The string of the k-th piece (not id: position in the constructor's arrays)."""
        return self.pool[self.off[k]:self.off[k + 1]].tobytes().decode("utf-32-le")

    @property
    def index(self):
        """{piece string: id}, the readable twins' vocabulary."""
        if self._index is None:
            self._index = {self.piece(k): int(i) for k, i in enumerate(self.ids)}
        return self._index


@nb.njit(cache=True, inline="always")
def _slot(key, mask):
    return np.int64((np.uint64(key) * _MULT) >> np.uint64(24)) & mask


@nb.njit(cache=True)
def _fill(pool, off, ids, keys, child, node_piece):
    mask, nodes = len(keys) - 1, 1
    for k in range(len(off) - 1):
        u = 0
        for t in range(off[k], off[k + 1]):
            key = u * _BASE + pool[t]
            h = _slot(key, mask)
            while keys[h] != -1 and keys[h] != key:
                h = (h + 1) & mask
            if keys[h] == -1:
                if 2 * nodes > len(keys):
                    return False
                keys[h], child[h] = key, nodes
                nodes += 1
            u = child[h]
        node_piece[u] = ids[k]
    return True


@nb.njit(cache=True, inline="always")
def _child(keys, child, u, c):
    key, mask = u * _BASE + c, len(keys) - 1
    h = _slot(key, mask)
    while keys[h] != -1:
        if keys[h] == key:
            return child[h]
        h = (h + 1) & mask
    return -1


@nb.njit(cache=True)
def _edges(x, s, n, keys, child, node_piece, max_len, logp, es, ee, ep):
    """Edges of the lattice of x[s:s+n] into es/ee/ep (start, end, id), by start then end.
    A position without a one-character piece gets an edge of id -1. Returns their number."""
    m = 0
    for i in range(n):
        u, one = 0, False
        for j in range(i, min(n, i + max_len)):
            u = _child(keys, child, u, x[s + j])
            if u < 0:
                break
            k = node_piece[u]
            if k >= 0 and logp[k] > -np.inf:
                es[m], ee[m], ep[m] = i, j + 1, k
                m += 1
                one = one or j == i
        if not one:
            es[m], ee[m], ep[m] = i, i + 1, -1
            m += 1
    return m


@nb.njit(cache=True, inline="always")
def _logadd(a, b):
    if a < b:
        a, b = b, a
    if b == -np.inf:
        return a
    return a + math.log1p(math.exp(b - a))


def lattice_edges(x, index, max_len, scores, unk_id, unk_score):
    """edges[i] = [(j, id, score)] of the str x: every piece x[i:j] in `index` whose score is
    finite, then an unk_id edge i -> i+1 if no piece covers x[i]."""
    edges = [[] for _ in range(len(x))]
    for i in range(len(x)):
        for j in range(i + 1, min(len(x), i + max_len) + 1):
            k = index.get(x[i:j])
            if k is not None and scores[k] > -np.inf:
                edges[i].append((j, k, scores[k]))
        if not any(j == i + 1 for j, _, _ in edges[i]):
            edges[i].append((i + 1, unk_id, unk_score))
    return edges


def _text(x):
    return np.asarray(x, "<i4").tobytes().decode("utf-32-le")
