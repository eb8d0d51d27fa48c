"""The Unigram kernels (unigram_lattice.py, unigram_em.py, unigram_viterbi.py): the E-step
against a brute-force enumeration of every segmentation, each Numba kernel against its Python
twin (`_ref`) on random words and vocabularies, with unknown characters, float32 and float64
scores; the double array against the vocabulary, the whitespace kernel against
Normalizer.normalize, and encode_ordinary_batch against per-text encoding."""
import itertools
import math

import numpy as np
import pytest

from scratchllm.tokenizer import unigram_em as em
from scratchllm.tokenizer.normalizer import Normalizer
from scratchllm.tokenizer.unigram import Unigram
from scratchllm.tokenizer.unigram_lattice import PieceTrie, code_points, lattice_edges
from scratchllm.tokenizer.unigram_train import digamma
from scratchllm.tokenizer.unigram_viterbi import DoubleArray, viterbi, viterbi_ref, whitespace

SP = "\u2581"


def _words(strings, freqs):
    lens = [len(w) for w in strings]
    return (code_points("".join(strings)), np.concatenate([[0], np.cumsum(lens)]),
            np.array(freqs, dtype=np.float64))


def _random_vocab(rng, alphabet, n):
    pieces = set(alphabet)
    while len(pieces) < n:
        k = int(rng.integers(2, 6))
        pieces.add((SP if rng.random() < 0.3 else "") + "".join(rng.choice(list(alphabet), k)))
    pieces = sorted(pieces)
    logp = np.log(rng.dirichlet(np.ones(len(pieces))))
    return pieces, logp


def _random_words(rng, alphabet, n):
    return [SP + "".join(rng.choice(list(alphabet), int(rng.integers(1, 12)))) for _ in range(n)]


def test_expected_counts_equal_brute_force():
    pieces = [SP, "a", "b", "ab", "ba", SP + "a", SP + "ab", "aba"]
    logp = np.log(np.array([2, 3, 1, 1.5, 1, 2, 0.5, 0.7]) / 11.7)
    trie = PieceTrie.from_strings(pieces, range(len(pieces)), len(pieces))
    strings, freqs = [SP + "abab", SP + "bab"], [3.0, 2.0]
    want, want_ll = np.zeros(len(pieces)), 0.0
    for w, f in zip(strings, freqs):
        every = []
        for cuts in itertools.product([0, 1], repeat=len(w) - 1):
            bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [len(w)]
            parts = [w[a:b] for a, b in zip(bounds, bounds[1:])]
            if all(p in pieces for p in parts):
                ids = [pieces.index(p) for p in parts]
                every.append((sum(logp[i] for i in ids), ids))
        z = np.logaddexp.reduce([s for s, _ in every])
        want_ll += f * z
        for s, ids in every:
            for i in ids:
                want[i] += f * math.exp(s - z)
    for fn in (em.expected_counts, em.expected_counts_ref):
        counts, ll = fn(*_words(strings, freqs), trie, logp)
        assert math.isclose(ll, want_ll, rel_tol=1e-12)
        np.testing.assert_allclose(counts, want, rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_kernels_agree_with_their_twins(seed):
    rng = np.random.default_rng(seed)
    alphabet = "abcdé漢" + SP
    pieces, logp = _random_vocab(rng, alphabet, 60)
    logp[rng.integers(len(alphabet), len(pieces), 5)] = -np.inf        # removed pieces
    trie = PieceTrie.from_strings(pieces, range(len(pieces)), len(pieces))
    strings = _random_words(rng, alphabet.replace(SP, ""), 20) + [     # words made of pieces
        SP + "".join(p.strip(SP) for p in rng.choice(pieces, 3)) for _ in range(20)]
    words = _words(strings, rng.integers(1, 9, len(strings)))
    c, ll = em.expected_counts(*words, trie, logp)
    c_ref, ll_ref = em.expected_counts_ref(*words, trie, logp)
    assert math.isclose(ll, ll_ref, rel_tol=1e-12) and ll < 0
    np.testing.assert_allclose(c, c_ref, rtol=1e-10, atol=1e-12)
    f = em.viterbi_counts(*words, trie, logp)
    np.testing.assert_array_equal(f, em.viterbi_counts_ref(*words, trie, logp))
    assert f.sum() > 0
    loss, loss_ref = em.prune_losses(trie, logp, f), em.prune_losses_ref(trie, logp, f)
    np.testing.assert_array_equal(np.isinf(loss), np.isinf(loss_ref))
    np.testing.assert_allclose(loss, loss_ref, rtol=1e-12)
    assert np.isfinite(loss).sum() >= 3 and (loss == np.inf).sum() >= 1


@pytest.mark.parametrize("cap", [10 ** 6, 50])
def test_count_substrings_agrees_with_its_twin(cap):
    rng = np.random.default_rng(3)
    strings = _random_words(rng, "abcd", 60) + [SP + "ab" + SP + "cab"]
    words = _words(strings, rng.integers(1, 5, len(strings)))
    got, want = em.count_substrings(*words, 5, cap), em.count_substrings_ref(*words, 5, cap)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    if cap == 50:
        assert len(got[0]) <= 50
    else:   # every distinct substring: the ▁ rule, counts summed over the words
        subs = {s[i:j] for s in strings for i in range(len(s))
                for j in range(i + 2, min(len(s), i + 5) + 1) if SP not in s[i + 1:j]}
        assert len(got[0]) == len(subs)
        pool = words[0]
        k = [pool[a:a + b].tobytes().decode("utf-32-le") for a, b in zip(got[0], got[1])]
        assert got[2][k.index("ab")] == sum(f * sum(s[i:i + 2] == "ab" for i in range(len(s)))
                                            for s, f in zip(strings, words[2]))


def test_trie_walk_finds_every_piece_of_the_text():
    rng = np.random.default_rng(5)
    pieces, logp = _random_vocab(rng, "abc" + SP, 40)
    trie = PieceTrie.from_strings(pieces, range(len(pieces)), len(pieces))
    assert trie.index == {p: k for k, p in enumerate(pieces)}
    text = SP + "abcabba" + SP + "cab"
    edges = lattice_edges(text, trie.index, trie.max_len, logp, -1, -1.0)
    x = code_points(text)
    es, ee, ep = (np.empty(len(x) * (trie.max_len + 1), np.int64) for _ in range(3))
    m = em._edges(x, 0, len(x), trie.keys, trie.child, trie.node_piece, trie.max_len, logp,
                  es, ee, ep)
    got = sorted(zip(es[:m].tolist(), ee[:m].tolist(), ep[:m].tolist()))
    want = sorted((i, j, k) for i, out in enumerate(edges) for j, k, _ in out)
    assert got == want == sorted((i, j, pieces.index(text[i:j])) for i in range(len(text))
                                 for j in range(i + 1, len(text) + 1) if text[i:j] in pieces)


def test_digamma_matches_its_series_and_recurrence():
    x = np.array([0.5, 1.0, 3.25, 7.0, 120.0])
    euler = 0.5772156649015329
    want = [-euler - 2 * math.log(2), -euler, None, None, None]
    got = digamma(x)
    assert abs(got[0] - want[0]) < 1e-6 and abs(got[1] - want[1]) < 1e-6
    np.testing.assert_allclose(digamma(x + 1) - got, 1 / x, rtol=1e-6)
    assert abs(got[4] - (math.log(120) - 1 / 240 - 1 / (12 * 120 ** 2))) < 1e-9


# ---- encoding's fast path (unigram_viterbi.py) ----------------------------------------
def _walk(da, s):
    """The id of the piece s by the double array's rule v = base[u] + code, check[v] == u."""
    u = 0
    for ch in s:
        c = ord(ch)
        code = da.cmap[c] if c < len(da.cmap) else 0
        if code == 0 or da.check[da.base[u] + code] != u:
            return None
        u = da.base[u] + code
    return int(da.value[u]) if da.value[u] >= 0 else None


def test_double_array_holds_exactly_the_pieces():
    rng = np.random.default_rng(0)
    pieces, _ = _random_vocab(rng, "abcdé" + SP + "\U0001F600", 300)
    ids = rng.permutation(1000)[:len(pieces)]
    da = DoubleArray(PieceTrie.from_strings(pieces, ids, 1000))
    assert [_walk(da, p) for p in pieces] == ids.tolist()
    others = {"".join(rng.choice(list("abcdéx" + SP), int(rng.integers(1, 8))))
              for _ in range(500)} - set(pieces)
    assert others and all(_walk(da, s) is None for s in others)
    assert len(da.base) == len(da.check) == len(da.value)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_viterbi_agrees_with_its_twin(dtype):
    rng = np.random.default_rng(4)
    pieces, logp = _random_vocab(rng, "abcé" + SP + "\U0001F600", 60)
    scores = logp.astype(dtype)
    scores[pieces.index("ab") if "ab" in pieces else 5] = -np.inf         # an absent piece
    trie = PieceTrie.from_strings(pieces, range(len(pieces)), len(pieces))
    texts = _random_words(rng, "abcéxy\U0001F600\U0010FFFF", 40) + ["", "x", SP + "a" * 40]
    x = code_points("".join(texts))                                # x, y, U+10FFFF unknown
    bounds = np.concatenate([[0], np.cumsum([len(t) for t in texts])])
    got, want = viterbi(x, bounds, trie, scores, 99, -30.0), \
        viterbi_ref(x, bounds, trie, scores, 99, -30.0)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    starts, ends, ids, counts = got
    assert counts[-3] == 0 and counts[-2] == 1 and ids[counts[:-2].sum()] == 99   # "", "x"
    assert (ids == 99).sum() > 10
    ends_of_text = ends[np.cumsum(counts)[counts > 0] - 1]
    assert ends_of_text.tolist() == [len(t) for t in texts if t]


def test_viterbi_float32_ties_as_sentencepiece():
    """▁a + b = -6 against ▁ + ab = -6 - 1e-9: in float64 the first is better; in float32 the
    two tie and the edge from the smaller start (ab from 1, not b from 2) is kept."""
    pieces = [SP, "a", "b", SP + "a", "ab"]
    scores = np.array([-1.0, -2.0, -3.0, -3.0, -5.0 - 1e-9])
    trie = PieceTrie.from_strings(pieces, range(5), 5)
    x, bounds = code_points(SP + "ab"), np.array([0, 3])
    for dtype, want in (("float32", [0, 4]), ("float64", [3, 2])):
        got = viterbi(x, bounds, trie, scores.astype(dtype), 9, -20.0)[2].tolist()
        ref = viterbi_ref(x, bounds, trie, scores.astype(dtype), 9, -20.0)[2].tolist()
        assert got == ref == want


@pytest.mark.parametrize("prefix", [True, False, "always", "first"])
@pytest.mark.parametrize("collapse", [True, False])
def test_whitespace_kernel_equals_normalizer(prefix, collapse):
    rng = np.random.default_rng(1)
    texts = ["".join(rng.choice(list("ab  é\t" + SP), int(rng.integers(0, 12))))
             for _ in range(300)] + ["", " ", "   ", "a", " a ", "a  b"]
    norm = Normalizer(add_dummy_prefix=prefix, remove_extra_whitespaces=collapse)
    bounds = np.concatenate([[0], np.cumsum([len(t) for t in texts])])
    y, yb = whitespace(code_points("".join(texts)), bounds, collapse, prefix)
    got = [y[a:b].tobytes().decode("utf-32-le") for a, b in zip(yb[:-1], yb[1:])]
    assert got == [norm.normalize(t) for t in texts]


def test_encode_ordinary_batch_equals_each_text():
    rng = np.random.default_rng(2)
    pieces, logp = _random_vocab(rng, "abcé" + SP, 80)
    texts = [" ".join(t[1:] for t in _random_words(rng, "abcéx", int(rng.integers(1, 5))))
             for _ in range(100)] + ["", "  ", " a  b ", "x"]
    for kw in ({}, dict(fuse_unk=True), dict(score_dtype="float32")):
        for norm in (Normalizer(), Normalizer(add_dummy_prefix=False,
                                              remove_extra_whitespaces=False)):
            tok = Unigram([("<unk>", 0.0)] + list(zip(pieces, logp)), normalizer=norm, **kw)
            assert tok.encode_ordinary_batch(texts) == [tok.encode_ordinary(t) for t in texts]
