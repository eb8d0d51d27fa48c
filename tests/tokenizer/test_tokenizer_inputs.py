"""Tokenizer inputs that would corrupt silently are refused, by class, on generated inputs: a
vocabulary that is not a bijection onto non-negative integer ids, special tokens that are empty
or one string, a custom pattern that skips characters or matches the empty string, non-integer
ids in decode, and vocab.json / merges.txt files that are truncated or not UTF-8 (the error
names the file and the line)."""
import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from scratchllm.tokenizer import Tokenizer, train_bpe

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "gpt2")
BYTES = {i: bytes([i]) for i in range(256)}
extra_tokens = st.lists(st.binary(min_size=2, max_size=4), min_size=1, max_size=8, unique=True)


@settings(max_examples=40, deadline=None)
@given(extra_tokens, st.data())
def test_two_ids_with_the_same_bytes_are_refused(extra, data):
    vocab = {**BYTES, **{256 + k: t for k, t in enumerate(extra)}}
    copied = data.draw(st.sampled_from(sorted(vocab)))
    vocab[len(vocab)] = vocab[copied]
    with pytest.raises(ValueError, match=rf"ids {copied} and {len(vocab) - 1} both hold"):
        Tokenizer(vocab, [])


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.integers(max_value=-1), st.integers(min_value=2 ** 31),
                 st.floats(allow_nan=False), st.booleans(), st.text(max_size=3)))
def test_ids_outside_the_non_negative_integers_are_refused(bad_id):
    vocab = {bad_id: b"zz", **BYTES}  # first, so a bad key equal to a byte id (0.0, True) stays
    with pytest.raises(ValueError, match="vocab ids must be integers in"):
        Tokenizer(vocab, [])


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.floats(allow_nan=False), st.booleans(), st.text(min_size=1, max_size=2),
                 st.none()))
def test_decode_refuses_ids_that_are_not_integers(bad):
    with pytest.raises(TypeError, match="decode: ids must be integers"):
        Tokenizer(BYTES, []).decode([104, bad])


@settings(max_examples=25, deadline=None)
@given(st.text(min_size=1, max_size=6))
def test_special_tokens_given_as_one_string_are_refused(special):
    with pytest.raises(TypeError, match="special_tokens must be a list of strings"):
        Tokenizer(BYTES, [], special)
    with pytest.raises(TypeError, match="special_tokens must be a list of strings"):
        train_bpe(["some text"], 300, special_tokens=special)


def test_an_empty_special_token_is_refused():
    for specials in ([""], {"": 256}):
        with pytest.raises(ValueError, match="special tokens must be non-empty strings"):
            Tokenizer(BYTES, [], specials)


ALPHABET = "abcXYZ 12,."


@settings(max_examples=60, deadline=None)
@given(st.sets(st.sampled_from(ALPHABET), min_size=1), st.text(ALPHABET, min_size=1,
                                                               max_size=30))
def test_a_custom_pattern_must_cover_the_text(chars, text):
    cls = "".join("\\" + c if c in "-]^\\" else c for c in sorted(chars))
    tok = Tokenizer(BYTES, [], pattern=f"[{cls}]+")
    if set(text) <= chars:
        assert tok.decode(tok.encode(text)) == text
    else:
        first = next(i for i, c in enumerate(text) if c not in chars)
        with pytest.raises(ValueError, match=rf"does not cover the text: character {first} "):
            tok.encode(text)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(ALPHABET.replace(" ", "")), st.sampled_from(["*", "?", "{0,3}"]))
def test_a_pattern_matching_the_empty_string_is_refused(char, quantifier):
    with pytest.raises(ValueError, match="matches the empty string"):
        Tokenizer(BYTES, [], pattern=f"{char}{quantifier}")


def _gpt2_lines(name):
    with open(os.path.join(FIX, name), encoding="utf-8") as fh:
        return fh.read().split("\n")


@settings(max_examples=8, deadline=None)
@given(kept=st.integers(min_value=1, max_value=49_999))
def test_a_truncated_merges_file_is_refused(kept, tmp_path_factory):
    merges = tmp_path_factory.mktemp("m") / "merges.txt"
    merges.write_text("\n".join(_gpt2_lines("merges.txt")[:kept]), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"merges.txt: {kept} merges, but .* 50000 multi-byte"):
        Tokenizer.from_gpt2_files(os.path.join(FIX, "vocab.json"), merges)


@settings(max_examples=10, deadline=None)
@given(line=st.integers(min_value=2, max_value=400),
       junk=st.sampled_from([b"\xff", b"\xc3", b"\x80"]))
def test_invalid_utf8_names_the_file_and_line(line, junk, tmp_path_factory):
    d = tmp_path_factory.mktemp("u")
    lines = [s.encode("utf-8") for s in _gpt2_lines("merges.txt")[:500]]
    lines[line - 1] = junk + lines[line - 1]
    (d / "merges.txt").write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match=rf"merges.txt line {line}: invalid UTF-8"):
        Tokenizer.from_gpt2_files(os.path.join(FIX, "vocab.json"), d / "merges.txt")
    table = json.dumps({"a": 0, "b": 1}, indent=1).encode().split(b"\n")
    table[2] = table[2].replace(b'"b"', b'"' + junk + b'"')
    (d / "vocab.json").write_bytes(b"\n".join(table))
    with pytest.raises(ValueError, match=r"vocab.json line 3: invalid UTF-8"):
        Tokenizer.from_gpt2_files(d / "vocab.json", d / "merges.txt")
