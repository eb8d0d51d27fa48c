"""The bad-input audit's cases of the tokenizer: a long pre-token, broken or hostile tokenizer
files, a corpus that is not UTF-8."""
from audit_common import ERROR


# ---------------------------------------------------------------------------- long pre-tokens
def bpe_long_pretoken():
    from scratchllm.tokenizer import Tokenizer
    vocab = {b: bytes([b]) for b in range(256)}
    merges = [(b"a", b"b"), (b"ab", b"ab")]
    for a, b in merges:
        vocab[len(vocab)] = a + b
    return len(Tokenizer(vocab, merges).encode("ab" * 200_000))  # right: 100,000 ids


# ---------------------------------------------------------------------------- tokenizer files
def _tok_file(tmp, edit):
    from scratchllm.tokenizer import Tokenizer
    tok = Tokenizer({b: bytes([b]) for b in range(256)}, [])
    path = f"{tmp}/tok.bpe"
    tok.save(path)
    lines = open(path, encoding="utf-8").read().split("\n")
    open(path, "w", encoding="utf-8").write("\n".join(edit(lines)))
    return Tokenizer.load(path)


def _in_tmp(edit):
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        return _tok_file(tmp, edit)


def tokfile_redos_pattern():
    return _in_tmp(lambda ls: [ls[0], 'pattern "(a|a)+$"'] + ls[2:])


def tokfile_dropping_pattern():
    return _in_tmp(lambda ls: [ls[0], 'pattern "[a-z]+"'] + ls[2:])


def tokfile_truncated():
    return _in_tmp(lambda ls: ls[:100])


def tokfile_huge_id():
    return _in_tmp(lambda ls: [ls[0], ls[1], "specials 1", f"{1 << 31} \"<s>\""] + ls[3:])


def tokfile_duplicate_id():
    return _in_tmp(lambda ls: [ls[0], ls[1], "specials 1", "3 \"<s>\""] + ls[3:])


def tokfile_empty_special():
    return _in_tmp(lambda ls: [ls[0], ls[1], "specials 1", "999 \"\""] + ls[3:])


# ---------------------------------------------------------------------------- corpora
def corpus_bad_utf8():
    import tempfile
    from scratchllm.tokenizer import train_bpe
    with tempfile.TemporaryDirectory() as tmp:
        open(f"{tmp}/bad.txt", "wb").write(b"hello \xff world")
        return train_bpe(f"{tmp}/bad.txt", 260, workers=1)


TOKENIZER_CASES = [
    (bpe_long_pretoken, 100_000), (tokfile_redos_pattern, ERROR),
    (tokfile_dropping_pattern, ERROR), (tokfile_truncated, ERROR), (tokfile_huge_id, ERROR),
    (tokfile_duplicate_id, ERROR), (tokfile_empty_special, ERROR), (corpus_bad_utf8, ERROR),
]
