"""Tokenizer files are not trusted blindly: a pattern outside the known safe set, a truncated
file, ids outside [0, 2^31), duplicate ids, an empty special token and invalid UTF-8 are
errors naming the file."""
import re

import pytest

from scratchllm.tokenizer import Tokenizer


def _saved(tmp_path, edit):
    path = tmp_path / "tok.bpe"
    Tokenizer({b: bytes([b]) for b in range(256)}, [], ["<|eot|>"]).save(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    path.write_text("\n".join(edit(lines)), encoding="utf-8")
    return path


@pytest.mark.parametrize("edit, match", [
    (lambda ls: [ls[0], 'pattern "(a|a)+$"'] + ls[2:], r"pattern '\(a\|a\)\+\$' is not one of "
                                                      r"the known safe patterns"),
    (lambda ls: [ls[0], 'pattern "[a-z]+"'] + ls[2:], r"is not one of the known safe patterns"),
    (lambda ls: ls[:100], r"line 5: the file is truncated: 'vocab 256' promises 256 records"),
    (lambda ls: ls[:3] + [f"{1 << 31} \"<|eot|>\""] + ls[4:], r"id 2147483648 is outside"),
    (lambda ls: ls[:3] + ["-4 \"<|eot|>\""] + ls[4:], r"id -4 is outside"),
    (lambda ls: ls[:3] + ["7 \"<|eot|>\""] + ls[4:], r"id 7 is used twice"),
    (lambda ls: ls[:3] + ["256 \"\""] + ls[4:], r"an empty special token"),
    (lambda ls: ls[:6] + [ls[5]] + ls[7:], r"line 7: id 0 used twice"),
])
def test_a_bad_tokenizer_file_is_an_error_naming_it(tmp_path, edit, match):
    path = _saved(tmp_path, edit)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}.*{match}"):
        Tokenizer.load(path)


def test_the_file_round_trips_and_a_custom_pattern_needs_the_caller(tmp_path):
    path = tmp_path / "tok.bpe"
    vocab = {b: bytes([b]) for b in range(256)}
    Tokenizer(vocab, [], pattern=r"\p{L}+|[^\p{L}]").save(path)
    with pytest.raises(ValueError, match="not one of the known safe patterns"):
        Tokenizer.load(path)
    assert Tokenizer.load(path, allow_pattern=r"\p{L}+|[^\p{L}]").encode("ab c") == [97, 98,
                                                                                    32, 99]
    Tokenizer(vocab, [], pattern="cl100k").save(path)
    assert Tokenizer.load(path).pattern == "cl100k"


def test_invalid_utf8_names_the_file(tmp_path):
    path = tmp_path / "tok.bpe"
    path.write_bytes(b"scratchllm-bpe 1\npattern \"gpt2\"\n\xff\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: not valid UTF-8 text"):
        Tokenizer.load(path)
