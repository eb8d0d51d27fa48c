"""The Numba scanners of cl100k, o200k and Llama-3 against `regex.findall` (every code point
class, every pair of class representatives, the whole code point range, random strings, the
corpora), and the fast encoders against tiktoken built from the same ranks and pattern."""
import os
from pathlib import Path

import numpy as np
import pytest
import regex
import tiktoken
from hypothesis import given, settings, strategies as st

from scratchllm.tokenizer import Tokenizer, fast_scan
from scratchllm.tokenizer.pretokenize import PATTERNS

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
CORPUS = Path(__file__).resolve().parents[2] / "scratchllm" / "data" / "python-docs.txt"
NAMES = ["cl100k", "o200k", "llama3"]
MULTI = ("Καλημέρα κόσμε — Привет, мир! 你好，世界。こんにちは世界 안녕하세요 مرحبا بالعالم "
         "שָׁלוֹם नमस्ते दुनिया สวัสดีชาวโลก 🙃👍🏽 café naïve ǅungla ʰa Ⅻ ٣٤٥ ² I'M YOU'RE "
         "they'll 'ſ x'LL \u00a0\u2028 \r\n\r\n  \t\n/ a.\n/b ..\n\n// 12345678 ABCdef "
         "DEFGhi\u0301")


def _scan(name, s):
    data = s.encode("utf-8")
    ends = fast_scan.scan(fast_scan.KIND[PATTERNS[name]], np.frombuffer(data, np.uint8),
                          fast_scan.char_flags(), np.array([len(data)], dtype=np.int64))
    ends = ends.tolist()
    return [data[a:b] for a, b in zip([0] + ends[:-1], ends)]


def _regex(name, s):
    return [m.encode("utf-8") for m in regex.findall(PATTERNS[name], s)]


def _representatives():
    """Up to 3 code points of every distinct flags value (no surrogates), plus the ASCII
    characters the patterns name."""
    flags = fast_scan.char_flags()
    codes = np.setdiff1d(np.arange(0x110000), np.arange(0xD800, 0xE000))   # (C,)
    reps = []
    for value in np.unique(flags[codes]):
        members = codes[flags[codes] == value]                              # (m,)
        reps += [int(members[0]), int(members[len(members) // 2]), int(members[-1])]
    reps += [ord(c) for c in " \t\n\r'/.sStTmMdDlLvVeErR0aA_"]
    return sorted(set(reps))


REPS = [chr(c) for c in _representatives()]


@pytest.mark.parametrize("name", NAMES)
def test_every_class_alone_and_in_pairs(name):
    for a in REPS:
        assert _scan(name, a) == _regex(name, a), repr(a)
        for b in REPS:
            assert _scan(name, a + b) == _regex(name, a + b), repr(a + b)


@pytest.mark.parametrize("name", NAMES)
def test_whole_code_point_range(name):
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    spaced = " ".join(every[::3]) + "'s".join(every[1::5])
    for text in (every, spaced):
        assert _scan(name, text) == _regex(name, text)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(REPS + [" ", "'s", "'LL", "\r\n", "  ", "a.\n/"]),
                max_size=14).map("".join), st.sampled_from(NAMES))
def test_random_strings_of_class_representatives(text, name):
    assert _scan(name, text) == _regex(name, text)


@pytest.mark.parametrize("name", NAMES)
def test_corpus_and_multilingual(name):
    text = CORPUS.read_bytes().decode("utf-8") + MULTI
    assert _scan(name, text) == _regex(name, text)


def test_llama3_is_cl100k_language():
    text = CORPUS.read_bytes().decode("utf-8")[:200_000] + MULTI
    assert _regex("llama3", text) == _regex("cl100k", text)


@pytest.fixture(scope="module")
def gpt2_ranks():
    base = Tokenizer.from_gpt2_files(os.path.join(FIX, "gpt2", "vocab.json"),
                                     os.path.join(FIX, "gpt2", "merges.txt"))
    return {i: t for i, t in base.vocab.items() if i != 50256}, base.merges


@pytest.mark.parametrize("name", NAMES)
def test_fast_encode_equals_tiktoken(gpt2_ranks, name):
    vocab, merges = gpt2_ranks
    ours = Tokenizer(vocab, merges, {"<|endoftext|>": 50256}, name)
    assert ours._fast
    theirs = tiktoken.Encoding(f"gpt2-ranks-{name}", pat_str=PATTERNS[name],
                               mergeable_ranks={t: i for i, t in vocab.items()},
                               special_tokens={"<|endoftext|>": 50256})
    text = CORPUS.read_bytes().decode("utf-8")[:300_000] + MULTI
    assert ours.encode(text, allowed_special="all") == theirs.encode(text, allowed_special="all")
    assert ours.encode_ordinary(MULTI * 3) == theirs.encode_ordinary(MULTI * 3)
