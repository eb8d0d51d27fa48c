"""Tokenizer encode/decode: GPT-2 exactness, round trips, streaming, fast == reference paths."""
import io
import json
import os

import numpy as np
import pytest
import regex
from hypothesis import given, settings, strategies as st

from scratchllm.tokenizer import Tokenizer, fast, pretokenize
from scratchllm.tokenizer.pretokenize import PATTERNS

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
SLICE = os.path.join(FIX, "python-docs-slice.txt")
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def gpt2():
    return Tokenizer.from_gpt2_files(os.path.join(FIX, "gpt2", "vocab.json"),
                                     os.path.join(FIX, "gpt2", "merges.txt"))


@pytest.fixture(scope="module")
def docs():
    with open(SLICE, encoding="utf-8", newline="") as fh:
        return fh.read()


@pytest.mark.parametrize("text, ids", [
    ("Hello world", [15496, 995]),
    ("Hello, world! 🙃", [15496, 11, 995, 0, 12520, 247, 225]),
    ("12345 67.89", [10163, 2231, 8275, 13, 4531]),
    ("don't I'll we've", [9099, 470, 314, 1183, 356, 1053]),
    (EOT, [50256]),
])
def test_gpt2_known_ids(gpt2, text, ids):
    assert gpt2.encode(text, allowed_special="all") == ids
    assert gpt2.decode(ids) == text


def test_overlapping_specials_match_longest_first():
    vocab = {b: bytes([b]) for b in range(256)}
    tok = Tokenizer(vocab, [], ["<|a|>", "<|a|><|b|>"])
    long_id, short_id = tok.special_tokens["<|a|><|b|>"], tok.special_tokens["<|a|>"]
    assert tok.encode("x<|a|><|b|><|a|>", allowed_special="all") == \
        [ord("x"), long_id, short_id]


def _no_pairs(s):
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in s)


TEXT = st.lists(st.one_of(st.characters(), st.sampled_from(
    [" ", "  ", "\n", "\r\n", "\t", "\u00a0", "'s", "'ll", "\ud800", "\udbff", EOT, "1", "é"])),
    max_size=30).map("".join)


@settings(max_examples=150, deadline=None)
@given(TEXT)
def test_roundtrip_any_unicode(gpt2, s):
    # lone (high) surrogates cannot be UTF-8: they come back as U+FFFD, as in tiktoken
    assert gpt2.decode(gpt2.encode(s, allowed_special="all")) == _no_pairs(s)
    assert gpt2.decode(gpt2.encode_ordinary(s)) == _no_pairs(s)


@settings(max_examples=150, deadline=None)
@given(TEXT)
def test_scanner_equals_regex(s):
    s = _no_pairs(s)
    data = s.encode("utf-8")
    ends = fast.scan_gpt2(np.frombuffer(data, np.uint8), fast.char_classes(),
                          np.array([len(data)], dtype=np.int64)).tolist()
    got = [data[a:b] for a, b in zip([0] + ends[:-1], ends)]
    assert got == [m.encode("utf-8") for m in regex.findall(PATTERNS["gpt2"], s)]


@settings(max_examples=60, deadline=None)
@given(TEXT)
def test_numba_encoder_equals_python_bpe_and_ref(gpt2, s):
    pieces = regex.findall(PATTERNS["gpt2"], _no_pairs(s).replace(EOT, ""))
    py = [i for p in pieces for i in gpt2._bpe(p.encode("utf-8"))]
    ref = [i for p in pieces for i in gpt2._bpe_ref(p.encode("utf-8"))]
    assert gpt2.encode_ordinary(_no_pairs(s).replace(EOT, "")) == py == ref


def test_numba_encoder_equals_python_path_on_corpus(gpt2, docs):
    slow = Tokenizer(gpt2.vocab, gpt2.merges, gpt2.special_tokens, PATTERNS["gpt2"] + "|(?!)")
    assert not slow._fast and gpt2._fast
    text = docs[:30000] + " x" * 50 + "\n\n  \t\n" + "a" * 300    # long pre-tokens skip the cache
    assert gpt2.encode(text, allowed_special="all") == \
        slow.encode(text, allowed_special="all")


def test_cache_across_calls_and_when_full(gpt2, docs):
    text = docs[:20000]
    want = gpt2.encode(text, allowed_special="all")
    for cache in (fast.new_cache(), fast.new_cache(16, 8, 4)):    # roomy, and full at once
        gpt2._fast_cache = cache
        assert gpt2.encode(text, allowed_special="all") == want
        assert gpt2.encode(text, allowed_special="all") == want
    assert 0 < cache[6][0] <= 8 and cache[6][1] <= 8 and cache[6][2] <= 4


def test_tiktoken_agrees_on_corpus(gpt2, docs):
    import tiktoken  # the test extra brings it: GPT-2 compatibility is checked, not skipped
    ranks = {t: i for i, t in gpt2.vocab.items() if i != 50256}
    enc = tiktoken.Encoding("gpt2-files", pat_str=PATTERNS["gpt2"], mergeable_ranks=ranks,
                            special_tokens={EOT: 50256})
    assert gpt2.encode(docs, allowed_special="all") == enc.encode(docs, allowed_special="all")


def test_decode_invalid_utf8_and_unknown_id(gpt2):
    assert gpt2.decode_bytes([12520, 247]) == b" " + "🙃".encode()[:3]
    assert gpt2.decode([12520, 247]) == " \ufffd"
    with pytest.raises(ValueError, match="id 50257 is not in the vocab"):
        gpt2.decode([15496, 50257])


def test_encode_iterable_equals_encode(gpt2, docs):
    text = docs[:20000] + "tail  \n\n x" + EOT + "\r\n\r\n  y" + EOT + EOT
    with io.StringIO(text, newline="") as fh:
        assert list(gpt2.encode_iterable(fh, 200, allowed_special="all")) == \
            gpt2.encode(text, allowed_special="all")
    assert list(gpt2.encode_iterable(iter(text), 64, allowed_special="all")) == \
        gpt2.encode(text, allowed_special="all")


def test_encode_file_equals_encode(gpt2, docs, tmp_path, monkeypatch):
    monkeypatch.setattr(pretokenize, "CHUNK_CHARS", 50_000)   # many chunks for the 2 workers
    path = tmp_path / "docs.txt"
    text = docs * 2
    path.write_text(text, encoding="utf-8", newline="")
    want = gpt2.encode(text, allowed_special="all")
    for workers in (1, 2):
        got = gpt2.encode_file(path, workers=workers, allowed_special="all")
        assert got.dtype == np.uint16 and got.tolist() == want


def test_gpt2_merges_with_or_without_version_line(tmp_path):
    with open(os.path.join(FIX, "gpt2", "merges.txt"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()[:2000]
    with open(os.path.join(FIX, "gpt2", "vocab.json"), encoding="utf-8") as fh:
        table = json.load(fh)  # GPT-2's id 256 + r is merge r's token: keep the first 2000
    vocab_path = tmp_path / "vocab.json"
    vocab_path.write_text(json.dumps({t: i for t, i in table.items() if i < 256 + 2000}),
                          encoding="utf-8")
    plain, versioned = tmp_path / "m1.txt", tmp_path / "m2.txt"
    plain.write_text("\n".join(lines) + "\n", encoding="utf-8")
    versioned.write_text("#version: 0.2\n" + "\n".join(lines) + "\n", encoding="utf-8")
    a = Tokenizer.from_gpt2_files(vocab_path, plain)
    b = Tokenizer.from_gpt2_files(vocab_path, versioned)
    assert a.merges == b.merges and len(a.merges) == 2000
    assert a.encode("Hello world") == b.encode("Hello world")


@settings(max_examples=120, deadline=None)
@given(st.lists(st.sampled_from(["a", "B", "7", ".", "'s", " ", "  ", "\n", "\r\n", "\t",
                                 "\u00a0", "é", EOT, "<|end", "/", ".\n/"]),
                max_size=80).map("".join),
       st.sampled_from(["gpt2", "cl100k", "o200k", "llama3"]), st.integers(1, 12))
def test_safe_chunks_pretokenize_like_the_whole(text, pattern, chunk_chars):
    from scratchllm.tokenizer.pretokenize import compile_pattern, iter_chunks, special_regex, \
        split_special
    pat, specials = compile_pattern(pattern), special_regex([EOT])

    def pretokens(s):
        return [t for is_special, p in split_special(s, specials)
                for t in ([p] if is_special else pat.findall(p))]

    chunks = list(iter_chunks(iter(text), [EOT], pattern, chunk_chars))
    assert "".join(chunks) == text
    assert [t for c in chunks for t in pretokens(c)] == pretokens(text)


def test_special_id_collision_is_an_error():
    vocab = {b: bytes([b]) for b in range(256)}
    with pytest.raises(ValueError, match="has id 5, which is already the token"):
        Tokenizer(vocab, [], {"<s>": 5})
