"""Unigram encoding's fast path: a double-array trie, the Viterbi kernel that walks it, and
SentencePiece's whitespace rules on code points; each beside its readable twin.

Double array (Aoe 1989, "An efficient digital search algorithm by using a double-array
structure"; the layout of SentencePiece's darts-clone trie): the trie's nodes are slots of two
flat arrays, and the child of slot u by character c is

    v = base[u] + code(c)    if check[v] == u    (else: no child)

where code() numbers the characters that occur in pieces 1..A (0: in no piece). One walk from
position i of a text visits x[i:i+1], x[i:i+2], ... while they are prefixes of pieces; slot v
holds the id of the piece that ends there (value[v], -1: none). The double array is built
from PieceTrie's hash table (every trie edge u -c-> v is one of its keys), parents before
children, each base the first that puts all of a node's children in free slots.

Viterbi, fused with the walk (no edge list): positions i in increasing order relax every edge
i -> j as it is found,  best[j] = max(best[j], best[i] + s(x[i:j])), replacing only on a
strictly better score; edges from one start come in increasing j and the unknown edge
(i -> i+1 when no one-character piece covers x[i]) last: the order of unigram_lattice's edge
list, so ties resolve the same way (the smaller start wins). Scores are float64; with f32 every
path sum is rounded to float32 after each addition (SentencePiece's arithmetic: a float64 sum
of two float32 rounded to float32 is the float32 sum, as float64 has more than 2 x 24 + 2
bits).

Whitespace (normalizer.py's steps 2-4 on code points): runs of " " collapsed and the ends
stripped (remove_extra_whitespaces), a dummy "▁" before a non-empty text that does not start
with " ", every " " -> "▁".

Glossary: A alphabet size; slot = node of the double array; n characters of one text; x code
points; bounds (T+1,) text t is x[bounds[t]:bounds[t+1]].
"""
import numba as nb
import numpy as np

from .charsmap import SPACE
from .unigram_lattice import _BASE, _text, lattice_edges

_SPACE, _DUMMY = 0x20, ord(SPACE)


class DoubleArray:
    """The double array of a PieceTrie: cmap (max code point + 1,) code of each character,
    base, check, value (slots,); max_len the longest piece."""

    def __init__(self, trie):
        used = trie.keys >= 0
        keys, child = trie.keys[used], trie.child[used].astype(np.int64)   # the trie's edges
        parent, char = keys // _BASE, keys % _BASE
        alphabet = np.unique(char)                                          # (A,)
        self.cmap = np.zeros(int(alphabet.max(initial=0)) + 1, np.int32)
        self.cmap[alphabet] = np.arange(1, len(alphabet) + 1, dtype=np.int32)
        order = np.lexsort((char, parent))                        # by parent, then character
        n_nodes = len(trie.node_piece)
        first = np.searchsorted(parent[order], np.arange(n_nodes + 1))  # children of node u:
        self.base, self.check, self.value = _build(                     # order[first[u]:..]
            first, self.cmap[char[order]], child[order], trie.node_piece, len(alphabet))
        self.max_len = trie.max_len


@nb.njit(cache=True)
def _free(nxt, i):  # pragma: no cover (compiled)
    """The first free slot >= i: nxt[v] = v while v is free, else a later slot to look at
    (a union-find over the taken slots, paths halved as they are walked)."""
    while nxt[i] != i:
        nxt[i] = nxt[nxt[i]]
        i = nxt[i]
    return i


@nb.njit(cache=True)
def _grow(a, fill):  # pragma: no cover (compiled)
    out = np.full(2 * len(a), fill, np.int64)
    out[:len(a)] = a
    return out


@nb.njit(cache=True)
def _build(first, codes, kids, node_piece, n_codes):  # pragma: no cover (compiled)
    """Place nodes 0, 1, ... (a child's id is above its parent's, so every node's slot is
    known before its children are placed): base = the first b >= 1 whose slots b + code are
    all free, tried at the free slots only. Returns base, check, value over the slots."""
    n = len(node_piece)
    size = 2 * n + n_codes + 2
    base, check = np.zeros(size, np.int64), np.full(size, -1, np.int64)
    nxt = np.arange(size + 1, dtype=np.int64)     # the free slots (nxt[size]: past the end)
    slot = np.zeros(n, np.int64)                  # node -> slot (the root is slot 0)
    check[0], nxt[0] = 0, 1                       # slot 0 is the root's
    for u in range(n):
        a, b = first[u], first[u + 1]
        if a == b:
            continue
        v = _free(nxt, 1 + codes[a])              # the first child's slot: a free one
        while True:
            start = v - codes[a]
            while start + n_codes + 1 >= len(check):              # room for any code
                base, check = _grow(base, 0), _grow(check, -1)
                grown = np.arange(len(check) + 1, dtype=np.int64)
                grown[:len(nxt) - 1] = nxt[:len(nxt) - 1]
                nxt = grown
            fits = True
            for e in range(a + 1, b):
                if check[start + codes[e]] != -1:
                    fits = False
                    break
            if fits:
                break
            v = _free(nxt, v + 1)
        base[slot[u]] = start
        for e in range(a, b):
            w = start + codes[e]
            check[w], slot[kids[e]], nxt[w] = slot[u], w, w + 1
    end = np.max(base) + n_codes + 1              # every lookup base + code stays inside
    value = np.full(end, -1, np.int32)
    for u in range(n):
        value[slot[u]] = node_piece[u]
    return base[:end].astype(np.int32), check[:end].astype(np.int32), value


@nb.njit(cache=True)
def _viterbi(x, bounds, arrays, max_len, scores, f32, unk):  # pragma: no cover (compiled)
    """arrays = (cmap, base, check, value); unk = (unk_id, unk_score). See the module
    docstring; returns the pieces' (starts, ends, ids) in text order and counts per text."""
    cmap, base, check, value = arrays
    unk_id, unk_score = unk
    n_texts = len(bounds) - 1
    longest = 0
    for t in range(n_texts):
        longest = max(longest, bounds[t + 1] - bounds[t])
    best = np.empty(longest + 1, np.float64)                 # best path score up to j
    from_ = np.empty(longest + 1, np.int64)                  # its last piece's start
    piece = np.empty(longest + 1, np.int64)                  # and id
    code = np.empty(longest + 1, np.int32)                   # the text's characters' codes
    node_score = np.full(len(value), -np.inf)                # score of the piece at a slot
    for v in range(len(value)):
        if value[v] >= 0:
            node_score[v] = scores[value[v]]
    starts, ends, ids = (np.empty(len(x), np.int64), np.empty(len(x), np.int64),
                         np.empty(len(x), np.int64))
    counts = np.zeros(n_texts, np.int64)
    out = 0
    for t in range(n_texts):
        s0, n = bounds[t], bounds[t + 1] - bounds[t]
        for j in range(n):
            c = x[s0 + j]
            code[j] = cmap[c] if c < len(cmap) else 0
        code[n] = 0                                           # the walk stops at the end
        best[0] = 0.0
        best[1:n + 1] = -np.inf
        for i in range(n):
            here, u, one = best[i], 0, False
            for j in range(i, i + max_len):
                if code[j] == 0:
                    break
                v = base[u] + code[j]
                if check[v] != u:
                    break
                u = v
                if node_score[v] > -np.inf:
                    s = here + node_score[v]
                    if f32:
                        s = np.float64(np.float32(s))
                    if s > best[j + 1]:
                        best[j + 1], from_[j + 1], piece[j + 1] = s, i, value[v]
                    one = one or j == i
            if not one:
                s = here + unk_score
                if f32:
                    s = np.float64(np.float32(s))
                if s > best[i + 1]:
                    best[i + 1], from_[i + 1], piece[i + 1] = s, i, unk_id
        m, j = 0, n
        while j > 0:
            m, j = m + 1, from_[j]
        counts[t], j = m, n
        for k in range(out + m - 1, out - 1, -1):
            starts[k], ends[k], ids[k] = from_[j], j, piece[j]
            j = from_[j]
        out += m
    return starts[:out], ends[:out], ids[:out], counts


def viterbi(x, bounds, trie, scores, unk_id, unk_score):
    """The best segmentation of each text x[bounds[t]:bounds[t+1]] of code points (int32):
    (starts, ends, ids) of all texts' pieces in order (starts and ends within their text) and
    counts (T,) of pieces per text. Scores (n_ids,) add up in their own dtype (float32 or
    float64); a position no piece covers is one unk_id edge of score unk_score. The trie is a
    PieceTrie; its double array is built on first use and kept on it."""
    if getattr(trie, "double_array", None) is None:
        trie.double_array = DoubleArray(trie)
    da = trie.double_array
    f32 = scores.dtype == np.float32
    return _viterbi(np.ascontiguousarray(x, np.int32), np.asarray(bounds, np.int64),
                    (da.cmap, da.base, da.check, da.value), da.max_len,
                    np.asarray(scores, np.float64), f32,
                    (np.int64(unk_id), float(scores.dtype.type(unk_score))))


def viterbi_ref(x, bounds, trie, scores, unk_id, unk_score):
    """Readable twin of viterbi: the edge lists of lattice_edges (a dict of the pieces), then
    best[j] = max over the edges into j, in the scores' own dtype."""
    path, counts = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        s, n = _text(x[a:b]), b - a
        best = np.full(n + 1, -np.inf, dtype=scores.dtype)    # (n+1,)
        back = [None] * (n + 1)
        best[0] = 0.0
        for i, out in enumerate(lattice_edges(s, trie.index, trie.max_len, scores, unk_id,
                                            scores.dtype.type(unk_score))):
            for j, k, score in out:
                if best[i] + score > best[j]:
                    best[j], back[j] = best[i] + score, (i, k)
        mine, j = [], n
        while j > 0:
            i, k = back[j]
            mine.append((i, j, k))
            j = i
        path += mine[::-1]
        counts.append(len(mine))
    starts, ends, ids = (np.array([e[c] for e in path], dtype=np.int64) for c in range(3))
    return starts, ends, ids, np.array(counts, dtype=np.int64)


# ---- whitespace ------------------------------------------------------------------------------
@nb.njit(cache=True)
def _spaces(x, bounds, collapse, prefix):  # pragma: no cover (compiled)
    """x (code points of T texts) -> (normal forms, their bounds); prefix 0 never, 1 before a
    text not starting with " ", 2 before any non-empty text (after the collapse)."""
    y = np.empty(len(x) + len(bounds), np.int32)
    out_bounds = np.zeros(len(bounds), np.int64)
    m = 0
    for t in range(len(bounds) - 1):
        a, b = bounds[t], bounds[t + 1]
        if collapse:
            while a < b and x[a] == _SPACE:
                a += 1
            while b > a and x[b - 1] == _SPACE:
                b -= 1
        if a < b and (prefix == 2 or prefix == 1 and x[a] != _SPACE):
            y[m], m = _DUMMY, m + 1
        for i in range(a, b):
            c = x[i]
            if c == _SPACE:
                if collapse and i > a and x[i - 1] == _SPACE:
                    continue
                c = _DUMMY
            y[m], m = c, m + 1
        out_bounds[t + 1] = m
    return y[:m], out_bounds


def whitespace(x, bounds, collapse, prefix):
    """normalizer.py's whitespace steps on code points, all texts in one kernel call: the twin
    of Normalizer.normalize without rules. x int32 (N,), bounds (T+1,); collapse:
    remove_extra_whitespaces; prefix: False | True | "always" (the dummy prefix rule at the
    start of a text). Returns (code points int32, bounds (T+1,))."""
    mode = 2 if prefix == "always" else int(bool(prefix))
    return _spaces(np.ascontiguousarray(x, np.int32), np.asarray(bounds, np.int64),
                   bool(collapse), mode)
