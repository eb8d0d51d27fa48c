"""The option specs of the Unigram tokenizer: Normalizer (SentencePiece's NormalizerSpec):
its normal forms, and clear errors naming the field, what it got and what it expects."""
import re

import pytest

from scratchllm.tokenizer import Normalizer, Unigram
from scratchllm.tokenizer.charsmap import SPACE


@pytest.mark.parametrize("options,text,at_start,want", [
    ({}, "  a  b ", True, SPACE + "a" + SPACE + "b"),
    ({"remove_extra_whitespaces": False}, " a  b", True, SPACE + "a" + SPACE * 2 + "b"),
    ({"add_dummy_prefix": False}, "a b", True, "a" + SPACE + "b"),
    ({"add_dummy_prefix": "first"}, "a", False, "a"),
    ({"add_dummy_prefix": "first"}, "a", True, SPACE + "a"),
    ({"add_dummy_prefix": "always", "remove_extra_whitespaces": False}, " a", True,
     SPACE * 2 + "a"),
    ({"nfkc": True}, "\ufb01 x", True, SPACE + "fi" + SPACE + "x"),
])
def test_normal_forms(options, text, at_start, want):
    assert Normalizer(**options).normalize(text, at_start) == want


def test_strip_prefix_undoes_the_dummy_prefix():
    assert Normalizer().strip_prefix(" a b") == "a b"
    assert Normalizer(add_dummy_prefix=False).strip_prefix(" a b") == " a b"


@pytest.mark.parametrize("field,value,expected", [
    ("add_dummy_prefix", "sometimes", "one of"),
    ("add_dummy_prefix", 1, "one of"),
    ("nfkc", "yes", "True or False"),
    ("remove_extra_whitespaces", None, "True or False"),
    ("charsmap", b"\x00\x00\x00\x00", "a CharsMap or None"),
])
def test_normalizer_names_the_bad_field(field, value, expected):
    with pytest.raises(ValueError, match=rf"^Normalizer: {field} must be {expected}.*, got "
                                         rf"{re.escape(repr(value))}$"):
        Normalizer(**{field: value})


def test_normalizer_refuses_nfkc_beside_a_charsmap():
    from scratchllm.tokenizer.charsmap import CharsMap
    with pytest.raises(ValueError, match="^Normalizer: nfkc must be False when a charsmap"):
        Normalizer(nfkc=True, charsmap=CharsMap(b"\x00\x00\x00\x00"))


def test_unigram_takes_a_normalizer():
    with pytest.raises(TypeError, match="^Unigram: normalizer must be a Normalizer"):
        Unigram([("<unk>", 0.0)], normalizer={"nfkc": True})
