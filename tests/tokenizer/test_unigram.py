"""The Unigram tokenizer: Viterbi, n-best, log-likelihood and sampling against a brute-force
enumeration of every segmentation; encoding identical to HF tokenizers and sentencepiece on
their own models (fixture ids written by tools/make_unigram_fixtures.py)."""
import itertools
import json
import math
import os

import numpy as np
import pytest

from scratchllm.tokenizer.unigram import SPACE, Unigram
from scratchllm.tokenizer.unigram_files import (load_sentencepiece, load_unigram_json,
                                                save_unigram_json)

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                   "unigram")
TOY = [("<unk>", 0.0), (SPACE, -2.0), ("a", -1.5), ("b", -2.5), ("ab", -3.2), ("ba", -3.0),
       (SPACE + "a", -2.9), (SPACE + "ab", -4.4), ("aba", -4.0), ("c", -5.0)]


def _segmentations(tok, x):
    """Every segmentation of normalised x: [(log P, ids)] by brute force."""
    out = []
    for cuts in itertools.product([0, 1], repeat=len(x) - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [len(x)]
        parts = [x[a:b] for a, b in zip(bounds, bounds[1:])]
        ids = [tok._index.get(p) for p in parts]
        if None in ids:
            continue
        out.append((sum(tok.pieces[i][1] for i in ids), ids))
    return out


@pytest.mark.parametrize("text", ["ab", "abab", "ba ab", "aab ba", "abcab", "b a ba"])
def test_viterbi_nbest_likelihood_equal_brute_force(text):
    tok = Unigram(TOY)
    x = tok.normalize(text)
    every = sorted(_segmentations(tok, x), key=lambda e: -e[0])
    assert every, x
    assert tok.encode_ordinary(text) == every[0][1]
    got = tok.nbest(text, 4)
    assert [round(s, 9) for _, s in got] == [round(s, 9) for s, _ in every[:4]]
    assert got[0][0] == every[0][1]
    assert math.isclose(tok.log_likelihood(text), np.logaddexp.reduce([s for s, _ in every]),
                        rel_tol=1e-12)
    assert tok.decode(tok.encode_ordinary(text)) == " ".join(text.split())


def test_sampling_follows_p_to_the_alpha():
    tok = Unigram(TOY)
    text, alpha, draws = "abab", 0.5, 4000
    every = _segmentations(tok, tok.normalize(text))
    logw = np.array([alpha * s for s, _ in every])            # (S,)
    want = np.exp(logw - np.logaddexp.reduce(logw))            # (S,)
    rng = np.random.default_rng(0)
    counts = {tuple(ids): 0 for _, ids in every}
    for _ in range(draws):
        counts[tuple(tok.sample(text, alpha, rng))] += 1
    freq = np.array([counts[tuple(ids)] / draws for _, ids in every])   # (S,)
    assert np.abs(freq - want).max() < 4 * np.sqrt(want.max() / draws)


def test_unknown_characters_and_byte_fallback():
    tok = Unigram(TOY)
    assert tok.encode_ordinary("a☃") == [tok._index[SPACE + "a"], 0]
    bytes_ = [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    fb = Unigram(TOY + bytes_, byte_fallback=True)
    ids = fb.encode_ordinary("a☃b")
    assert ids[1:4] == [len(TOY) + b for b in "☃".encode("utf-8")]
    assert fb.decode(ids) == "a☃b"


def _fixture(name):
    with open(os.path.join(FIX, f"{name}_ids.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    return data["texts"], data["ids"]


def test_hf_tokenizers_unigram_ids(tmp_path):
    tok = load_unigram_json(os.path.join(FIX, "hf_unigram.json"))
    texts, ids = _fixture("hf_unigram")
    assert [tok.encode_ordinary(t) for t in texts] == ids
    save_unigram_json(tok, tmp_path / "back.json")
    back = load_unigram_json(tmp_path / "back.json")
    assert back.pieces == tok.pieces and [back.encode_ordinary(t) for t in texts] == ids


@pytest.mark.parametrize("name", ["spm_unigram", "spm_unigram_bytes"])
def test_sentencepiece_unigram_ids(name):
    tok = load_sentencepiece(os.path.join(FIX, f"{name}.model"))
    texts, ids = _fixture(name)
    assert [tok.encode_ordinary(t) for t in texts] == ids
    assert tok.encode_ordinary_batch(texts) == ids
    assert [tok.decode(i) for i in ids[:50]] == [" ".join(t.split()) for t in texts[:50]]


def test_train_unigram_small(tmp_path):
    from scratchllm.tokenizer import train_unigram
    src = os.path.join(os.path.dirname(FIX), "python-docs-slice.txt")
    text = open(src, encoding="utf-8").read()[:20_000]
    path = tmp_path / "small.txt"
    path.write_text(text, encoding="utf-8")
    seen = []
    tok = train_unigram(path, 300, ["<|endoftext|>"], report=lambda *r: seen.append(r))
    assert seen == tok.train_log and len(seen) >= 2
    assert [size for _, size, _ in seen][-1] <= int(1.1 * (300 - 2)) < seen[0][1]
    assert len(tok.pieces) == 300 and tok.pieces[1][0] == "<|endoftext|>"
    chars = {c for line in text.replace("<|endoftext|>", "").split("\n")
             for c in tok.normalize(line)}
    assert chars <= {p for p, _ in tok.pieces}
    sample = "def tokenize(text): return the pieces"
    assert tok.decode(tok.encode_ordinary(sample)) == sample
    assert 1 in tok.encode("a<|endoftext|>b", allowed_special="all")
    assert 1 not in tok.encode_ordinary("a<|endoftext|>b")


@pytest.mark.parametrize("name", ["spm_bpe", "spm_bpe_bytes"])
def test_sentencepiece_bpe_ids_with_byte_fallback(name):
    from scratchllm.tokenizer.spm_bpe import SentencePieceBPE
    tok = load_sentencepiece(os.path.join(FIX, f"{name}.model"))
    assert isinstance(tok, SentencePieceBPE) and tok.byte_fallback == name.endswith("bytes")
    texts, ids = _fixture(name)
    assert [tok.encode_ordinary(t) for t in texts] == ids
    if tok.byte_fallback:              # text outside the vocabulary round-trips through bytes
        assert [tok.decode(i) for i in ids] == [" ".join(w for w in t.split(" ") if w)
                                                for t in texts]     # spaces collapsed
    with pytest.raises(TypeError, match="one segmentation"):
        tok.nbest("x", 2)


def test_hf_llama_form_bpe_json_ids():
    from scratchllm.tokenizer.unigram_files import load_bpe_json
    tok = load_bpe_json(os.path.join(FIX, "hf_bpe_bytes.json"))
    texts, ids = _fixture("hf_bpe_bytes")
    assert [tok.encode_ordinary(t) for t in texts] == ids
    assert [tok.decode(i) for i in ids] == texts          # bytes and spaces round-trip


def test_sentencepiece_precompiled_charsmap_normalisation():
    """nmt_nfkc (sentencepiece's default rules): the normal form and the ids sentencepiece
    gives, on the slice, the multilingual sample and a sample of what the rules rewrite
    (fullwidth, ligatures, compatibility forms, odd spaces, control and zero-width chars)."""
    tok = load_sentencepiece(os.path.join(FIX, "spm_unigram_nmt_nfkc.model"))
    with open(os.path.join(FIX, "spm_unigram_nmt_nfkc_ids.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    assert tok.normalizer.charsmap is not None
    assert [tok.normalize(t) for t in data["texts"]] == data["normalized"]
    assert [tok.encode_ordinary(t) for t in data["texts"]] == data["ids"]
    plain = Unigram(tok.pieces)                    # the same whitespace rules, no charsmap
    assert sum(plain.normalize(t) != n for t, n in zip(data["texts"], data["normalized"])) >= 8


def test_charsmap_rejects_a_truncated_blob():
    from scratchllm.tokenizer.charsmap import CharsMap
    with pytest.raises(ValueError, match="truncated"):
        CharsMap(b"\x10\x00\x00\x00abc")


def test_hf_precompiled_normaliser(tmp_path):
    """The same charsmap as HF tokenizers' Precompiled normaliser applies it (per grapheme
    cluster), with a Metaspace pre-tokenizer: HF's normal form and ids; saved and loaded back."""
    tok = load_unigram_json(os.path.join(FIX, "hf_unigram_precompiled.json"))
    with open(os.path.join(FIX, "hf_unigram_precompiled_ids.json"), encoding="utf-8") as fh:
        data = json.load(fh)
    charsmap = tok.normalizer.charsmap
    assert charsmap is not None and charsmap.hf
    assert [charsmap.normalize_hf(t) for t in data["texts"]] == data["normalized"]
    assert [tok.encode_ordinary(t) for t in data["texts"]] == data["ids"]
    save_unigram_json(tok, tmp_path / "back.json")
    back = load_unigram_json(tmp_path / "back.json")
    assert [back.encode_ordinary(t) for t in data["texts"]] == data["ids"]
