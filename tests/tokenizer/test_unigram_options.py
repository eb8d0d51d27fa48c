"""The option specs of the Unigram tokenizer: Normalizer (SentencePiece's NormalizerSpec) and
TrainerSpec (train_unigram's seed, EM and pruning options): their normal forms, and clear
errors naming the field, what it got and what it expects."""
import re

import pytest

from scratchllm.tokenizer import Normalizer, TrainerSpec, Unigram, train_unigram
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


@pytest.mark.parametrize("field,value,expected", [
    ("max_len", 0, "an integer >= 1"),
    ("seed_size", 1.5, "an integer >= 1"),
    ("seed_cap", True, "an integer >= 1"),
    ("em_iters", 0, "an integer >= 1"),
    ("shrink", 1.0, r"a number in \(0, 1\)"),
    ("shrink", 0, r"a number in \(0, 1\)"),
])
def test_trainer_spec_names_the_bad_field(field, value, expected):
    with pytest.raises(ValueError, match=rf"^TrainerSpec: {field} must be {expected}, got "
                                         rf"{re.escape(repr(value))}$"):
        TrainerSpec(**{field: value})


def test_options_must_be_their_specs(tmp_path):
    with pytest.raises(TypeError, match="^Unigram: normalizer must be a Normalizer"):
        Unigram([("<unk>", 0.0)], normalizer={"nfkc": True})
    with pytest.raises(TypeError, match="^train_unigram: trainer must be a TrainerSpec"):
        train_unigram(tmp_path / "none.txt", 100, trainer={"em_iters": 3})
    with pytest.raises(TypeError, match="^train_unigram: normalizer must be a Normalizer"):
        train_unigram(tmp_path / "none.txt", 100, normalizer=True)
