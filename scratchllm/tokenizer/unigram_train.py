"""Training a Unigram tokenizer by EM and pruning (Kudo 2018, arXiv 1804.10959; SentencePiece's
google/sentencepiece src/unigram_model_trainer.cc is the reference implementation, and its
defaults are the defaults here; max_len, seed_cap, seed_size, em_iters and shrink are
TrainerSpec fields).

1. Words: each line is normalised (a Normalizer, normalizer.py) and cut before every "▁";
   distinct words w are counted (f_w), most frequent first. Their characters are *required*
   pieces: never pruned.
2. Seed: every substring of 2..max_len characters of every word, counted with f_w (a "▁" only
   as the first character, as in SentencePiece's split_by_whitespace). Memory stays bounded:
   whenever the counter holds more than `seed_cap` strings, those with at most the median
   count are dropped (unigram_em.count_substrings). Kept: the substrings seen at least twice,
   at most seed_size pieces in all, by largest count x length; the initial p(v) is
   proportional to the count x length (to the count for a character), as in SentencePiece.
3. Rounds, until |V| <= 1.1 vocab_size (SentencePiece's margin):
   - EM (em_iters times). E-step: per word, forward-backward over its lattice gives the
     expected count of every piece: c_v = sum_w f_w sum_{edges e = v} P(e | w), with
     P(e = i->j | w) = exp(a[i] + log p(v) + b[j] - log Z(w)). M-step, in log space and
     Bayesian as SentencePiece's: log p(v) = digamma(c_v) - digamma(sum_u c_u) (= log c_v -
     log sum c_u up to O(1/c)); pieces with c_v < 0.5 are dropped (required ones kept, at
     c_v = 0.5). The corpus log-likelihood L = sum_w f_w log Z(w) is reported per round.
   - Prune (unigram_em.prune_losses): drop the pieces never used by a word's Viterbi
     segmentation or whose own string segments better without them; keep the pieces of
     largest loss of likelihood, max(1.1 vocab_size, shrink |V|) pieces in all.
4. The required characters, then the remaining pieces of largest log p, up to vocab_size;
   their log-probabilities are renormalised to sum to 1.

Glossary: f_w = count of word w; c_v = expected count of piece v; a/b = forward/backward log
weights over a word's lattice; Z(w) = sum over the word's segmentations of P(s).
"""
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .charsmap import SPACE
from .normalizer import Normalizer
from .pretokenize import read_blocks, special_regex, split_special
from .unigram import Unigram
from .unigram_em import count_substrings, expected_counts, prune_losses, viterbi_counts
from .unigram_lattice import PieceTrie, code_points


@dataclass(frozen=True)
class TrainerSpec:
    """The seed, EM and pruning options of train_unigram (SentencePiece's TrainerSpec names in
    brackets, its defaults here).

    max_len: longest seed piece, in characters (max_sentencepiece_length);
    seed_size: most seed pieces, characters included (seed_sentencepiece_size);
    seed_cap: most distinct substrings held while counting the seed (memory bound, rule 2);
    shrink: fraction of the pieces a pruning round keeps, 0 < shrink < 1 (shrinking_factor);
    em_iters: EM steps per round, >= 1 (num_sub_iterations)."""
    max_len: int = 16
    seed_size: int = 1_000_000
    seed_cap: int = 2_000_000
    shrink: float = 0.75
    em_iters: int = 2

    def __post_init__(self):
        for name in ("max_len", "seed_size", "seed_cap", "em_iters"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"TrainerSpec: {name} must be an integer >= 1, got {v!r}")
        if isinstance(self.shrink, bool) or not isinstance(self.shrink, (int, float)) \
                or not 0 < self.shrink < 1:
            raise ValueError(f"TrainerSpec: shrink must be a number in (0, 1), "
                             f"got {self.shrink!r}")


def _words(path, special_tokens, normalize):
    """Counter of the distinct words of a text file (normalised, each starting with ▁)."""
    words, tail = Counter(), ""
    specials = special_regex(special_tokens)
    for block in read_blocks(path):
        lines = (tail + block).split("\n")
        tail = lines.pop()
        for line in lines:
            _count_line(line, specials, normalize, words)
    _count_line(tail, specials, normalize, words)
    return words


def _count_line(line, specials, normalize, words):
    for is_special, piece in split_special(line, specials):
        if not is_special:
            first, *rest = normalize(piece).split(SPACE)
            words.update(SPACE + w for w in rest)
            if first:
                words[first] += 1


def _word_arrays(words):
    """(pool, off, freq) of the words, most frequent first (ties by string)."""
    items = sorted(words.items(), key=lambda e: (-e[1], e[0]))
    lens = np.fromiter((len(w) for w, _ in items), np.int64, len(items))
    off = np.concatenate([[0], np.cumsum(lens)])
    freq = np.fromiter((f for _, f in items), np.float64, len(items))
    return code_points("".join(w for w, _ in items)), off, freq


def _seed(pool, off, freq, trainer):
    """(piece pool, piece offsets, log p, number of required characters): rule 2."""
    chars, inverse = np.unique(pool, return_inverse=True)
    char_counts = np.bincount(inverse, weights=np.repeat(freq, np.diff(off)))
    starts, lens, counts = count_substrings(pool, off, freq, trainer.max_len, trainer.seed_cap)
    score = counts * lens
    order = np.lexsort((lens, starts, -score))
    order = order[counts[order] >= 2][:max(trainer.seed_size - len(chars), 0)]
    starts, lens = starts[order], lens[order]
    rel = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
    piece_pool = np.concatenate([chars.astype(np.int32), pool[np.repeat(starts, lens) + rel]])
    piece_off = np.concatenate([np.arange(len(chars) + 1), len(chars) + np.cumsum(lens)])
    value = np.concatenate([char_counts, score[order]])
    return piece_pool, piece_off, np.log(value) - np.log(value.sum()), len(chars)


def digamma(x):
    """psi(x) for x >= 0.5 (float64 array): recurrence up to 7, then the asymptotic series
    (SentencePiece's Digamma)."""
    x, out = np.array(x, dtype=np.float64), np.zeros(np.shape(x))
    for _ in range(7):
        small = x < 7
        out[small] -= 1 / x[small]
        x[small] += 1
    x = x - 0.5
    xx2 = 1 / x ** 2
    xx4 = xx2 * xx2
    return out + np.log(x) + xx2 / 24 - 7 / 960 * xx4 + 31 / 8064 * xx4 * xx2 - \
        127 / 30720 * xx4 * xx4


class _Pieces:
    """The current pieces: code points (pool, off), log p, required mask, and their trie."""

    def __init__(self, pool, off, logp, required):
        self.pool, self.off, self.logp, self.required = pool, off, logp, required
        self.trie = PieceTrie(pool, off, np.arange(len(logp)), len(logp))

    def keep(self, mask, logp):
        lens = np.diff(self.off)[mask]
        starts = self.off[:-1][mask]
        rel = np.arange(lens.sum()) - np.repeat(np.cumsum(lens) - lens, lens)
        return _Pieces(self.pool[np.repeat(starts, lens) + rel],
                       np.concatenate([[0], np.cumsum(lens)]), logp[mask], self.required[mask])

    def strings(self):
        return [self.trie.piece(k) for k in range(len(self.logp))]


def _em_step(pieces, pool, off, freq):
    """One E-step and M-step: (new pieces, corpus log-likelihood before the M-step)."""
    counts, ll = expected_counts(pool, off, freq, pieces.trie, pieces.logp)
    keep = (counts >= 0.5) | pieces.required
    counts = np.maximum(counts, 0.5)
    logp = digamma(counts) - digamma(counts[keep].sum())
    return pieces.keep(keep, logp), ll


def _prune(pieces, pool, off, freq, size):
    """Pieces kept by rule 3's pruning, `size` in all (fewer if many are removable)."""
    loss = prune_losses(pieces.trie, pieces.logp,
                        viterbi_counts(pool, off, freq, pieces.trie, pieces.logp))
    sure = pieces.required | (loss == np.inf)
    ranked = np.flatnonzero(~sure & (loss > -np.inf))
    ranked = ranked[np.argsort(-loss[ranked], kind="stable")][:max(size - sure.sum(), 0)]
    keep = sure.copy()
    keep[ranked] = True
    return pieces.keep(keep, pieces.logp)


def _rounds(pieces, words, target, trainer, report):
    """Rule 3: rounds of EM and pruning until at most 1.1 target pieces remain.
    words: (pool, off, freq) of _word_arrays. Returns (pieces, [(round, size, log-lik)])."""
    pool, off, freq = words
    log, most = [], int(1.1 * target)
    while True:
        for _ in range(trainer.em_iters):
            pieces, ll = _em_step(pieces, pool, off, freq)
        log.append((len(log) + 1, len(pieces.logp), ll))
        if report is not None:
            report(*log[-1])
        if len(pieces.logp) <= most:
            return pieces, log
        pieces = _prune(pieces, pool, off, freq,
                        max(most, int(trainer.shrink * len(pieces.logp))))


def _best(pieces, n_learned):
    """Rule 4: [(piece, log p)] of n_learned pieces: the required characters, then the other
    pieces of largest log p; log p renormalised; by decreasing log p (ties by string)."""
    n_other = n_learned - int(pieces.required.sum())
    rest = np.flatnonzero(~pieces.required)
    rest = rest[np.argsort(-pieces.logp[rest], kind="stable")][:n_other]
    final = pieces.keep(pieces.required | np.isin(np.arange(len(pieces.logp)), rest),
                        pieces.logp)
    scores = final.logp - np.logaddexp.reduce(final.logp)
    return sorted(zip(final.strings(), scores.tolist()), key=lambda e: (-e[1], e[0]))


def train_unigram(path, vocab_size, special_tokens=(), *, trainer=TrainerSpec(),
                  normalizer=Normalizer(), report=None):
    """A Unigram tokenizer of vocab_size pieces (<unk> first, then special_tokens, then the
    learned pieces by score) trained on a UTF-8 text file. trainer: the TrainerSpec of the
    seed, EM and pruning; normalizer: how the text is normalised (the tokenizer keeps it).
    report(round, size, log-lik) is called after each round; the same triples are in the
    returned tokenizer's train_log."""
    for name, value, cls in (("trainer", trainer, TrainerSpec),
                             ("normalizer", normalizer, Normalizer)):
        if not isinstance(value, cls):
            raise TypeError(f"train_unigram: {name} must be a {cls.__name__}, got {value!r}")
    reserved = 1 + len(special_tokens)
    words = _word_arrays(_words(path, special_tokens, normalizer.normalize))
    piece_pool, piece_off, logp, n_chars = _seed(*words, trainer)
    if n_chars + reserved > vocab_size:
        raise ValueError(f"train_unigram: vocab_size {vocab_size} < {n_chars} characters "
                         f"+ {reserved} reserved pieces")
    pieces = _Pieces(piece_pool, piece_off, logp, np.arange(len(logp)) < n_chars)
    pieces, log = _rounds(pieces, words, vocab_size - reserved, trainer, report)
    tok = Unigram([("<unk>", 0.0)] + [(t, 0.0) for t in special_tokens] +
                  _best(pieces, vocab_size - reserved), 0,
                  {t: 1 + k for k, t in enumerate(special_tokens)}, normalizer=normalizer)
    tok.train_log = log
    return tok
