"""The Unigram language-model tokenizer (Kudo 2018, arXiv 1804.10959), SentencePiece's default.

A piece vocabulary with log-probabilities log p(v) (the "scores"). A text x is first normalised
SentencePiece's way (normalizer.py: optional NFKC; runs of spaces collapsed and stripped; a
dummy "▁" prefix; every space -> "▁"), then every segmentation s = (s_1..s_K) of it into
pieces has

    log P(s) = sum_k log p(s_k)

and the lattice of x holds one edge (i -> j, piece x[i:j]) per vocabulary piece in x:
    Viterbi:   best[j] = max_{edges i->j} best[i] + log p(x[i:j]);  s* = argmax_s log P(s)
    n-best:    the n best partial paths kept per position (exact on a DAG)
    sampling:  s ~ P(s)^alpha / Z_alpha: forward filtering a[j] = logsumexp_i a[i] + alpha
               log p(x[i:j]), then backward sampling: the edge into j is drawn with
               probability exp(a[i] + alpha log p - a[j])   (subword regularisation, Kudo 2018)
    log_likelihood(x) = log sum_s P(s) = a[len x] at alpha = 1   (nats)
A position that no piece covers gets the unknown piece (score = min score - 10, as
SentencePiece's and HF tokenizers' kUnkPenalty) or, with byte fallback, one <0xNN> piece per
UTF-8 byte. Ties go to the edge with the smaller start (both references scan starts in order
and replace only on a strictly better score).

Glossary: piece = vocabulary string; score = log p(piece); lattice edge = (start, end, id).
"""
import contextlib
import gc

import numpy as np
import regex

from .charsmap import SPACE
from .normalizer import Normalizer
from .pretokenize import special_regex, split_special
from .specials import check_disallowed, special_plan
from .spm_decode import sentencepiece_decode
from .unigram_lattice import PieceTrie, _text, code_points, lattice_edges
from .unigram_viterbi import viterbi, whitespace

UNK_PENALTY = 10.0
_BEFORE_SPACE = regex.compile(f"(?={SPACE})")


@contextlib.contextmanager
def _no_gc():
    """Pause Python's cyclic garbage collector (it would scan the heap every 700 new lists)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _bounds(texts):
    """(T+1,) offsets of the texts in their concatenation."""
    lens = np.fromiter(map(len, texts), np.int64, len(texts))  # (T,)
    return np.concatenate([[0], np.cumsum(lens)])  # (T+1,)


class Unigram:
    """pieces: [(piece, score)] in id order; unk_id: id of the unknown piece; special_tokens:
    {str: id} of control/user-defined pieces matched before segmentation (when allowed);
    normalizer: the Normalizer of the text (normalizer.py: dummy prefix, NFKC or SentencePiece's
    precompiled rules, whitespace clean-up);
    byte_fallback: unknown characters become <0xNN> pieces (they must be in the vocab);
    unused: ids that segmentation never produces (SentencePiece's unused pieces);
    fuse_unk: a run of unknown characters is one unknown id (HF tokenizers' Unigram does);
    score_dtype: the float type path scores add up in: SentencePiece adds float32 (its order
    of rounding can break an exact tie), HF tokenizers float64."""

    sentencepiece_kinds = None   # {id: "control" | "unknown" | "byte"}: decode as SentencePiece
    split_pieces = False         # segment each ▁-word alone (HF's Metaspace split=true)

    def __init__(self, pieces, unk_id=0, special_tokens=None, *, normalizer=Normalizer(),
                 byte_fallback=False, unused=(), fuse_unk=False, score_dtype="float64"):
        self.pieces = [(str(p), float(s)) for p, s in pieces]
        if not 0 <= unk_id < len(self.pieces):
            raise ValueError(f"Unigram: unk_id {unk_id} is not an id of the {len(self.pieces)} "
                             f"pieces")
        if not isinstance(normalizer, Normalizer):
            raise TypeError(f"Unigram: normalizer must be a Normalizer, got {normalizer!r}")
        self.unk_id, self.special_tokens = unk_id, dict(special_tokens or {})
        self.normalizer, self.byte_fallback = normalizer, byte_fallback
        self.fuse_unk, self._dtype = fuse_unk, np.dtype(score_dtype)
        self._score = np.array([s for _, s in self.pieces], dtype=self._dtype)   # (V,)
        special_ids = set(self.special_tokens.values()) | {unk_id} | set(unused)
        self._bytes = {}
        self._index = {}
        for i, (p, s) in enumerate(self.pieces):
            if len(p) == 6 and p.startswith("<0x") and p.endswith(">") and byte_fallback:
                self._bytes[int(p[3:5], 16)] = i
            elif i not in special_ids and p:
                self._index.setdefault(p, i)
        if byte_fallback and len(self._bytes) != 256:
            raise ValueError(f"Unigram: byte_fallback needs the 256 pieces <0x00>..<0xFF>, "
                             f"found {len(self._bytes)}")
        self._byte_ids = set(self._bytes.values())
        self._max_len = max(map(len, self._index), default=1)
        scores = [s for p, s in self.pieces if p in self._index]
        self.unk_score = self._dtype.type(min(scores, default=0.0) - UNK_PENALTY)
        self._trie = None

    # ---- normalisation and the lattice ----------------------------------------------------
    def normalize(self, text, at_start=True):
        """SentencePiece's normal form of `text` (spaces shown as ▁): the normalizer's."""
        return self.normalizer.normalize(text, at_start)

    def _edges(self, x):
        """edges[i] = [(j, id, score)] for every piece x[i:j] (unknown: id unk_id)."""
        return lattice_edges(x, self._index, self._max_len, self._score, self.unk_id,
                           self.unk_score)

    def _segment_ids(self, x):
        """Ids of the best (Viterbi) segmentation of the normalised text x."""
        return self._split_ids([x])[0]

    def _split_ids(self, xs):
        """_batch_ids, each text first cut before every ▁ when split_pieces (HF's Metaspace
        with split: one lattice per word, so float sums, and their ties, are the word's)."""
        if not self.split_pieces:
            return self._batch_ids(xs)
        parts = [[p for p in _BEFORE_SPACE.split(x) if p] for x in xs]
        flat = self._batch_ids([p for ps in parts for p in ps])
        out, k = [], 0
        for ps in parts:
            out.append([i for ids in flat[k:k + len(ps)] for i in ids])
            k += len(ps)
        return out

    def segment_ids(self, xs):
        """[Viterbi ids of x for x in xs]: texts already normalised (no normaliser run; what
        a tokenizer.json pipeline's pre-tokens need)."""
        return self._batch_ids(list(xs))

    def _batch_ids(self, xs):
        """Viterbi ids of each normalised text (all texts in one kernel call)."""
        return self._kernel_ids(code_points("".join(xs)), _bounds(xs))

    def _kernel_ids(self, x, bounds):
        """Viterbi ids of the texts x[bounds[t]:bounds[t+1]] (code points, normalised): the
        kernel unigram_viterbi.viterbi, then unknown pieces resolved by _ids."""
        if self._trie is None:
            self._trie = PieceTrie.from_strings(list(self._index), list(self._index.values()),
                                                len(self.pieces))
        starts, ends, ids, counts = viterbi(x, bounds, self._trie, self._score, self.unk_id,
                                            self.unk_score)
        ends_at = np.cumsum(counts).tolist()
        flat = ids.tolist()
        with _no_gc():                 # one list per text: no cycles for the collector to find
            out = [flat[a:b] for a, b in zip([0] + ends_at[:-1], ends_at)]
        for k in set(np.searchsorted(ends_at, np.flatnonzero(ids == self.unk_id), "right")):
            a, b = ends_at[k] - counts[k], ends_at[k]
            text = _text(x[bounds[k]:bounds[k + 1]])
            out[k] = self._ids(text, zip(starts[a:b].tolist(), ends[a:b].tolist(), out[k]))
        return out

    def _forward(self, edges, n, alpha):
        a = np.full(n + 1, -np.inf)                          # (n+1,) log forward weights
        a[0] = 0.0
        for i in range(n):
            for j, _, s in edges[i]:
                a[j] = np.logaddexp(a[j], a[i] + alpha * s)
        return a

    # ---- encoding -------------------------------------------------------------------------
    def _ids(self, x, path):
        out = []
        for i, j, k in path:
            if k == self.unk_id and self.byte_fallback:
                out += [self._bytes[b] for b in x[i:j].encode("utf-8")]
            elif not (k == self.unk_id and self.fuse_unk and out and out[-1] == k):
                out.append(k)
        return out

    def _pieces_of(self, text, allowed):
        """(is_special, normalised piece) parts of text; specials in `allowed` split out."""
        parts = list(split_special(text, special_regex(allowed)))  # (k = 0: at the start)
        return [(s, p if s else self.normalize(p, at_start=k == 0)) for k, (s, p) in
                enumerate(parts)]

    def encode(self, text, *, allowed_special=(), disallowed_special="all"):
        """Viterbi ids; special tokens as in Tokenizer.encode (specials.py)."""
        allowed, disallowed_re, _ = special_plan(self.special_tokens, allowed_special,
                                                 disallowed_special, "Unigram.encode")
        check_disallowed(text, disallowed_re, 0, "Unigram.encode")
        out = []
        for is_special, x in self._pieces_of(text, allowed):
            out += [self.special_tokens[x]] if is_special else self._segment_ids(x)
        return out

    def encode_ordinary(self, text):
        """Viterbi ids of text, special-token strings being ordinary text."""
        x = self.normalize(text)
        return self._segment_ids(x)

    def encode_ordinary_batch(self, texts):
        """[encode_ordinary(t) for t in texts]. Without normalisation rules (no NFKC, no
        charsmap) and without split_pieces, the whitespace steps and the segmentation are two
        kernel calls over all texts (unigram_viterbi.whitespace, viterbi)."""
        texts, norm = list(texts), self.normalizer
        if self.split_pieces or norm.nfkc or norm.charsmap is not None:
            return self._split_ids([self.normalize(t) for t in texts])
        x, bounds = whitespace(code_points("".join(texts)), _bounds(texts),
                               norm.remove_extra_whitespaces, norm.add_dummy_prefix)
        return self._kernel_ids(x, bounds)

    def nbest(self, text, n):
        """The n most likely segmentations of text (ordinary): [(ids, log P)], best first."""
        x = self.normalize(text)
        edges = self._edges(x)
        tops = [[] for _ in range(len(x) + 1)]             # per end: [(score, path)] top n
        tops[0] = [(0.0, ())]
        for i in range(len(x)):
            for j, k, s in edges[i]:
                tops[j] = sorted(tops[j] + [(t + s, p + ((i, j, k),)) for t, p in tops[i]],
                                 key=lambda e: -e[0])[:n]
        return [(self._ids(x, p), float(t)) for t, p in tops[len(x)]]

    def sample(self, text, alpha, rng):
        """Ids of one segmentation drawn with probability P(s)^alpha / Z (ordinary text)."""
        x = self.normalize(text)
        edges = self._edges(x)
        a = self._forward(edges, len(x), alpha)
        into = [[] for _ in range(len(x) + 1)]
        for i in range(len(x)):
            for j, k, s in edges[i]:
                into[j].append((i, k, a[i] + alpha * s))
        path, j = [], len(x)
        while j > 0:
            w = np.array([e[2] for e in into[j]])                  # (E,) log weights
            p = np.exp(w - a[j])                                   # (E,)
            i, k, _ = into[j][int(rng.choice(len(p), p=p / p.sum()))]
            path.append((i, j, k))
            j = i
        return self._ids(x, path[::-1])

    def log_likelihood(self, text):
        """log P(text) = log sum over its segmentations of P(s), in nats (ordinary text)."""
        x = self.normalize(text)
        return float(self._forward(self._edges(x), len(x), 1.0)[len(x)])

    # ---- decoding -------------------------------------------------------------------------
    def decode(self, ids):
        """Text of ids. A model read from a SentencePiece .model (sentencepiece_kinds set)
        decodes as SentencePiece does (spm_decode.py: the unknown piece as " ⁇ ", control
        pieces invisible); otherwise pieces are joined, <0xNN> runs decoded as UTF-8, ▁ ->
        space, and the dummy prefix removed."""
        for i in ids:
            if not isinstance(i, (int, np.integer)) or not 0 <= i < len(self.pieces):
                raise ValueError(f"Unigram.decode: id {i!r} is not in the vocab (ids run "
                                 f"0..{len(self.pieces) - 1})")
        if self.sentencepiece_kinds is not None:
            return sentencepiece_decode(self.pieces, ids, kinds=self.sentencepiece_kinds,
                                        normalizer=self.normalizer)
        out, run = [], bytearray()
        for i in ids:
            piece = self.pieces[i][0]
            if i in self._byte_ids:
                run.append(int(piece[3:5], 16))
                continue
            out.append(run.decode("utf-8", "replace") + piece)
            run = bytearray()
        text = ("".join(out) + run.decode("utf-8", "replace")).replace(SPACE, " ")
        return self.normalizer.strip_prefix(text)
