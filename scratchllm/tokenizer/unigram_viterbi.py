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
from .unigram_lattice import _BASE, _text, frozen, lattice_edges

_SPACE, _DUMMY = 0x20, ord(SPACE)


class DoubleArray:
    """The double array of a PieceTrie: cmap (max code point + 1,) code of each character,
    base, check, value (slots,) int32."""

    def __init__(self, trie):
        used = trie.keys >= 0
        keys, child = trie.keys[used], trie.child[used].astype(np.int64)   # the trie's edges
        parent, char = keys // _BASE, keys % _BASE
        alphabet = np.unique(char)                                          # (A,)
        self.cmap = np.zeros(int(alphabet.max(initial=0)) + 1, np.int32)
        self.cmap[alphabet] = np.arange(1, len(alphabet) + 1, dtype=np.int32)
        order = np.lexsort((char, parent))                        # by parent, then character
        n = len(trie.node_piece)
        first = np.searchsorted(parent[order], np.arange(n + 1))  # node u's children: order[
        codes, kids = self.cmap[char[order]], child[order]          # first[u]:first[u+1]]
        size = 2 * len(keys) + 2 * len(alphabet) + 2
        while True:
            base, check = np.zeros(size, np.int32), np.full(size, -1, np.int32)
            slot = np.zeros(n, np.int64)                                    # node -> slot
            end = _place(first, codes, kids, len(alphabet), base, check,
                         np.arange(size + 1, dtype=np.int64), slot)
            if end >= 0:
                break
            size *= 2
        self.base, self.check = base[:end], check[:end]
        self.value = np.full(end, -1, np.int32)
        self.value[slot] = trie.node_piece[:n]                  # unused nodes: slot 0, id -1

    def node_scores(self, scores):
        """(slots,) float64 score of the piece ending at each slot (-inf: none)."""
        return np.where(self.value >= 0, np.asarray(scores, np.float64)[self.value], -np.inf)


@nb.njit(cache=True)
def _place(first, codes, kids, n_codes, base, check, nxt, slot):  # pragma: no cover
    """Place nodes 0, 1, ... (a child's id is above its parent's, so every node's slot is
    known before its children are placed): base = the first b >= 1 whose slots b + code are
    all free, tried at the free slots only (nxt[v] = v while v is free, else a later slot to
    look at: a union-find over the taken slots, its paths halved as they are walked). Fills
    base, check, slot; returns the number of slots used, or -1 if `check` is too short."""
    check[0], nxt[0] = 0, 1                       # slot 0 is the root's
    end = 1
    for u in range(len(first) - 1):
        a, b = first[u], first[u + 1]
        if a == b:
            continue
        v = 1 + codes[a]
        while True:
            while nxt[v] != v:                    # the first free slot >= v
                nxt[v] = nxt[nxt[v]]
                v = nxt[v]
            start = v - codes[a]
            if start + n_codes + 1 >= len(check):
                return -1
            fits = True
            for e in range(a + 1, b):
                if check[start + codes[e]] != -1:
                    fits = False
                    break
            if fits:
                break
            v += 1
        base[slot[u]] = start
        end = max(end, start + n_codes + 1)       # every lookup base + code stays inside
        for e in range(a, b):
            w = start + codes[e]
            check[w], slot[kids[e]], nxt[w] = slot[u], w, w + 1
    return end


@nb.njit(cache=True)
def _viterbi(x, bounds, cmap, base, check, value, node_score, f32, unk_id, unk_score):
    """See the module docstring (node_score: DoubleArray.node_scores). Returns the pieces'
    (starts, ends, ids) in text order and counts per text."""
    n_texts = len(bounds) - 1
    longest = 0
    for t in range(n_texts):
        longest = max(longest, bounds[t + 1] - bounds[t])
    best = np.empty(longest + 1, np.float64)                 # best path score up to j
    from_ = np.empty(longest + 1, np.int64)                  # its last piece's start
    piece = np.empty(longest + 1, np.int64)                  # and id
    code = np.empty(longest + 1, np.int32)                   # the text's characters' codes
    starts, ends, ids = (np.empty(len(x), np.int32), np.empty(len(x), np.int32),
                         np.empty(len(x), np.int32))   # int32: half the pages to touch
    counts = np.zeros(n_texts, np.int64)
    out = 0
    for t in range(n_texts):
        s0, n = bounds[t], bounds[t + 1] - bounds[t]
        for j in range(n):
            c = x[s0 + j]
            code[j] = cmap[c] if c < len(cmap) else 0
        code[n] = 0                                           # the walk stops at the end
        best[0] = 0.0
        for j in range(1, n + 1):
            best[j] = -np.inf
        for i in range(n):
            here, u, one = best[i], 0, False
            for j in range(i, n):
                if code[j] == 0:                  # (the trie ends the walk at the longest piece)
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
    return _viterbi(frozen(x), np.ascontiguousarray(bounds, np.int64), da.cmap,
                    da.base, da.check, da.value, da.node_scores(scores),
                    scores.dtype == np.float32, int(unk_id), float(scores.dtype.type(unk_score)))


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
    return _spaces(frozen(x), np.ascontiguousarray(bounds, np.int64),
                   bool(collapse), mode)
