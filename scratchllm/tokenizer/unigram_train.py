"""Training a Unigram tokenizer by EM and pruning (Kudo 2018, arXiv 1804.10959; SentencePiece's
google/sentencepiece src/unigram_model_trainer.cc is the reference implementation).

1. Words: each line is normalised (unigram.py) and cut before every "▁"; distinct words w are
   counted (f_w). Characters of the words are *required* pieces: never pruned.
2. Seed: every substring of 2..max_len characters of every word, counted with f_w (a "▁" only
   as the first character, as in SentencePiece's split_by_whitespace). Memory stays bounded:
   when the counter holds more than `seed_cap` strings, the half with the smallest counts is
   dropped. Kept: the seed_size strings of largest count x length; score = log count / total.
3. Rounds, until |V| <= vocab_size:
   - EM (em_iters times). E-step: per word, forward-backward over its lattice gives the
     expected count of every piece: c_v = sum_w f_w sum_{edges e = v} P(e | w), with
     P(e = i->j | w) = exp(a[i] + log p(v) + b[j] - log Z(w)). M-step (log space):
     log p(v) = log c_v - log sum_u c_u; pieces with c_v < 0.5 are dropped (not required ones).
     Corpus log-likelihood L = sum_w f_w log Z(w) is reported per round.
   - Prune: F_v = Viterbi count of v; alt(v) = best segmentation of v's string without v;
     loss_v = F_v (log p(v) - sum_{u in alt(v)} log p'(u)), with p' the probabilities after
     F_v moves to alt(v) (SentencePiece's formula). Keep the max(vocab_size, shrink |V|) pieces
     of largest loss, plus every required character.

Glossary: f_w = count of word w; c_v = expected count of piece v; a/b = forward/backward log
weights over a word's lattice; Z(w) = sum over the word's segmentations of P(s).
"""
import math
from collections import Counter

import numpy as np

from .pretokenize import read_blocks, special_regex, split_special
from .unigram import SPACE, Unigram


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
            x = normalize(piece)
            cuts = [i for i, c in enumerate(x) if c == SPACE and i > 0] + [len(x)]
            for a, b in zip([0] + cuts[:-1], cuts):
                if b > a:
                    words[x[a:b]] += 1


def _seed(words, seed_size, max_len, seed_cap):
    """{piece: log prob} of the seed vocabulary (rule 2 of the module docstring)."""
    counts = Counter()
    for w, f in words.items():
        for i in range(len(w)):
            for j in range(i + 2, min(len(w), i + max_len) + 1):
                if SPACE not in w[i + 1:j]:
                    counts[w[i:j]] += f
        if len(counts) > seed_cap:
            counts = Counter(dict(counts.most_common(seed_cap // 2)))
    chars = Counter()
    for w, f in words.items():
        for c in w:
            chars[c] += f
    best = sorted(counts.items(), key=lambda e: (-e[1] * len(e[0]), e[0]))[:seed_size]
    pieces = dict(chars) | dict(best)
    total = sum(pieces.values())
    return {p: math.log(c / total) for p, c in pieces.items()}, set(chars)


def _lattice(w, logp, max_len):
    """edges[i] = [(j, piece, log p)] of word w."""
    return [[(j, w[i:j], logp[w[i:j]]) for j in range(i + 1, min(len(w), i + max_len) + 1)
             if w[i:j] in logp] for i in range(len(w))]


def _expected_counts(words, logp, max_len):
    """(expected counts {piece: c}, corpus log-likelihood) by forward-backward."""
    counts, total = Counter(), 0.0
    for w, f in words.items():
        n, edges = len(w), _lattice(w, logp, max_len)
        a = np.full(n + 1, -np.inf)                    # (n+1,) forward log weights
        b = np.full(n + 1, -np.inf)                    # (n+1,) backward log weights
        a[0], b[n] = 0.0, 0.0
        for i in range(n):
            for j, _, s in edges[i]:
                a[j] = np.logaddexp(a[j], a[i] + s)
        for i in range(n - 1, -1, -1):
            for j, _, s in edges[i]:
                b[i] = np.logaddexp(b[i], s + b[j])
        total += f * a[n]
        for i in range(n):
            for j, p, s in edges[i]:
                counts[p] += f * math.exp(a[i] + s + b[j] - a[n])
    return counts, total


def _viterbi(w, logp, max_len, banned=None):
    """Best segmentation of w (list of pieces) without the piece `banned`."""
    n, edges = len(w), _lattice(w, logp, max_len)
    best, back = [0.0] + [-math.inf] * n, [None] * (n + 1)
    for i in range(n):
        for j, p, s in edges[i]:
            if p != banned and best[i] + s > best[j]:
                best[j], back[j] = best[i] + s, (i, p)
    if back[n] is None:
        return None
    out, j = [], n
    while j > 0:
        i, p = back[j]
        out.append(p)
        j = i
    return out[::-1]


def _prune(words, logp, required, keep, max_len):
    """The `keep` pieces of largest likelihood loss, plus the required characters."""
    freq = Counter()
    for w, f in words.items():
        for p in _viterbi(w, logp, max_len):
            freq[p] += f
    total = sum(freq.values())
    loss = {}
    for p in logp:
        if p in required:
            continue
        alt = _viterbi(p, logp, max_len, banned=p) if freq[p] else []
        if alt is None:
            continue
        logsum_alt = math.log(total + freq[p] * (len(alt) - 1))
        lp_alt = sum(math.log(freq[u] + freq[p]) - logsum_alt for u in alt)
        lp = math.log(freq[p] / total) if freq[p] else -math.inf
        loss[p] = freq[p] * (lp - lp_alt) if freq[p] else -math.inf
    kept = sorted(loss, key=lambda p: (-loss[p], p))[:max(keep - len(required), 0)]
    return {p: logp[p] for p in list(required) + kept}


def train_unigram(path, vocab_size, special_tokens=(), *, max_len=16, seed_size=None,
                  seed_cap=2_000_000, shrink=0.8, em_iters=2, nfkc=False, report=None):
    """A Unigram tokenizer of vocab_size pieces (<unk> first, then special_tokens, then the
    learned pieces by score) trained on a UTF-8 text file. report(round, size, log-lik) is
    called after each round; the same triples are in the returned tokenizer's train_log."""
    reserved = 1 + len(special_tokens)
    norm = Unigram([("<unk>", 0.0)], nfkc=nfkc).normalize
    words = _words(path, special_tokens, norm)
    logp, required = _seed(words, seed_size or 10 * vocab_size, max_len, seed_cap)
    if len(required) + reserved > vocab_size:
        raise ValueError(f"train_unigram: vocab_size {vocab_size} < {len(required)} characters "
                         f"+ {reserved} reserved pieces")
    log, target = [], vocab_size - reserved
    while True:
        for _ in range(em_iters):
            counts, ll = _expected_counts(words, logp, max_len)
            counts = {p: c for p, c in counts.items() if c >= 0.5 or p in required}
            z = math.log(sum(counts.values()))
            logp = {p: math.log(max(c, 1e-12)) - z for p, c in counts.items()}
        log.append((len(log) + 1, len(logp), ll))
        if report is not None:
            report(*log[-1])
        if len(logp) <= target:
            break
        logp = _prune(words, logp, required, max(target, int(shrink * len(logp))), max_len)
    pieces = [("<unk>", 0.0)] + [(t, 0.0) for t in special_tokens]
    pieces += sorted(logp.items(), key=lambda e: (-e[1], e[0]))
    tok = Unigram(pieces, 0, {t: 1 + k for k, t in enumerate(special_tokens)}, nfkc=nfkc)
    tok.train_log = log
    return tok
