"""BPE training: a corpus worked by hand, fast == naive twin, workers, specials, files, errors,
and the CLI."""
import base64
import json
import os
import warnings

import pytest
from hypothesis import given, settings, strategies as st

from scratchllm.tokenizer import Tokenizer, train_bpe, train_bpe_ref
from scratchllm.tokenizer import pretokenize
from scratchllm.cli.bpe import main as bpe_main

FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures")
SLICE = os.path.join(FIX, "python-docs-slice.txt")
EOT = "<|endoftext|>"


def test_hand_worked_corpus_tie_and_special_mid_word():
    # pieces: "xy xy zw z" | "w"  -> pre-tokens "xy", " xy", " zw", " z", "w"
    # counts: (x,y)=2 (' ',z)=2 (' ',x)=1 (z,w)=1. Tie at 2: (b"x", b"y") > (b" ", b"z").
    # then (' ',z)=2 wins; then (' z',w)=1 ties (' ',xy)=1: b" z" > b" " (prefix is smaller).
    # The special token cut "z<|s|>w": without it (z,w) would count 2 and win step 2.
    corpus = ["xy xy zw z<|s|>", "w"]
    want = [(b"x", b"y"), (b" ", b"z"), (b" z", b"w"), (b" ", b"xy")]
    for train in (train_bpe, train_bpe_ref):
        vocab, merges = train(corpus, 256 + 4 + 1, ["<|s|>"])
        assert merges == want
        assert vocab[256] == b"xy" and vocab[259] == b" xy" and vocab[260] == b"<|s|>"
        assert len(vocab) == 261


def test_runs_out_of_pairs_with_a_warning():
    with pytest.warns(UserWarning, match="only 2 possible merges"):
        vocab, merges = train_bpe(["ab ab"], 300, workers=1)
    assert merges == [(b"a", b"b"), (b" ", b"ab")] and len(vocab) == 258


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "ab", "ba", " ", "  ", "\n", "é", "<|s|>", "'s"]),
                min_size=1, max_size=60).map("".join), st.integers(257, 300))
def test_fast_equals_naive_on_tie_heavy_corpora(text, vocab_size):
    # few symbols: many equal counts, so the heap's tie-break decides most merges
    if not text.replace("<|s|>", ""):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert train_bpe([text], vocab_size, ["<|s|>"], workers=1) == \
            train_bpe_ref([text], vocab_size, ["<|s|>"])


@pytest.fixture(scope="module")
def trained():
    return train_bpe(SLICE, 500, [EOT], workers=1)


def test_fast_equals_naive_on_python_docs(trained):
    fast = train_bpe(SLICE, 400, [EOT], workers=1)              # 219 KB of text
    ref = train_bpe_ref(SLICE, 400, [EOT])
    assert fast == ref and len(ref[0]) == 400
    assert fast[1] == trained[1][:400 - 257]                    # a bigger vocab extends it
    assert len(trained[0]) == 500 and len(trained[1]) == 500 - 257


def test_workers_one_equals_two(trained, monkeypatch):
    monkeypatch.setattr(pretokenize, "CHUNK_CHARS", 20_000)    # ~11 chunks for the 2 workers
    assert len(list(pretokenize.iter_chunks(pretokenize.read_blocks(SLICE), [EOT], "gpt2"))) > 5
    assert train_bpe(SLICE, 500, [EOT], workers=2) == trained


def test_special_tokens_never_inside_a_merge(trained):
    vocab, merges = trained
    assert vocab[499] == EOT.encode()
    assert all(b"<|" not in a + b for a, b in merges)     # "<|endoftext|>" is never counted
    ids = Tokenizer(vocab, merges, [EOT]).encode_ordinary("a" + EOT)
    assert 499 not in ids


def test_cl100k_and_custom_patterns():
    corpus = ["ab  12345 ab\r\n\r\nab"]
    for pattern in ("cl100k", r"\S+|\s+"):
        fast, ref = train_bpe(corpus, 262, pattern=pattern, workers=1), \
            train_bpe_ref(corpus, 262, pattern=pattern)
        assert fast == ref
    assert (b"12", b"3") not in train_bpe(corpus, 262, pattern="cl100k", workers=1)[1]


def test_save_load_roundtrip(trained, tmp_path):
    vocab, merges = trained
    for pattern in ("gpt2", r"\p{L}+|[^\p{L}]"):
        tok = Tokenizer(vocab, merges, [EOT], pattern)
        tok.save(tmp_path / "t.bpe")
        back = Tokenizer.load(tmp_path / "t.bpe")
        assert (back.vocab, back.merges, back.special_tokens, back.pattern) == \
            (tok.vocab, tok.merges, tok.special_tokens, tok.pattern)
        text = "Hello  world\n\n" + EOT + " x"
        assert back.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")


def test_gpt2_save_load_roundtrip(tmp_path):
    gpt2 = Tokenizer.from_gpt2_files(os.path.join(FIX, "gpt2", "vocab.json"),
                                     os.path.join(FIX, "gpt2", "merges.txt"))
    gpt2.save(tmp_path / "gpt2.bpe")
    back = Tokenizer.load(tmp_path / "gpt2.bpe")
    assert back.vocab == gpt2.vocab and back.merges == gpt2.merges
    assert back.encode("Hello world" + EOT, allowed_special="all") == [15496, 995, 50256]


def test_save_tiktoken(trained, tmp_path):
    vocab, merges = trained
    tok = Tokenizer(vocab, merges, [EOT])
    tok.save_tiktoken(tmp_path / "t.tiktoken")
    lines = (tmp_path / "t.tiktoken").read_text(encoding="ascii").splitlines()
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in lines)}
    assert ranks == {t: i for i, t in vocab.items() if i != 499}
    import tiktoken  # the test extra brings it: GPT-2 compatibility is checked, not skipped
    from tiktoken.load import load_tiktoken_bpe
    from scratchllm.tokenizer.pretokenize import PATTERNS
    enc = tiktoken.Encoding("ours", pat_str=PATTERNS["gpt2"],
                            mergeable_ranks=load_tiktoken_bpe(str(tmp_path / "t.tiktoken")),
                            special_tokens={EOT: 499})
    with open(SLICE, encoding="utf-8") as fh:
        text = fh.read()[:20000]
    assert enc.encode(text, allowed_special="all") == tok.encode(text, allowed_special="all")


@pytest.mark.parametrize("args, match", [
    ((["abc"], 255), "vocab_size must be an integer >= 256"),
    ((["abc"], 257, ["<a>", "<b>"]), r">= 256 \+ 2 special tokens = 258"),
    (([EOT, EOT], 300, [EOT]), "the corpus is empty"),
    (([], 300), "the corpus is empty"),
])
def test_bad_training_input(args, match):
    with pytest.raises(ValueError, match=match):
        train_bpe(*args, workers=1)
    with pytest.raises(ValueError, match=match):
        train_bpe_ref(*args)


def test_malformed_files_name_file_and_line(tmp_path):
    bad_json = tmp_path / "vocab.json"
    bad_json.write_text('{\n"a": 0,\n"b": 1,,\n}', encoding="utf-8")
    good_json = tmp_path / "good.json"
    good_json.write_text(json.dumps({chr(c): i for i, c in enumerate(range(33, 127))}))
    merges = tmp_path / "merges.txt"
    merges.write_text("#version: 0.2\na b\nab\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.json line 3: not valid JSON"):
        Tokenizer.from_gpt2_files(bad_json, merges)
    with pytest.raises(ValueError, match=r"merges.txt line 3: expected two tokens"):
        Tokenizer.from_gpt2_files(good_json, merges)
    saved = tmp_path / "t.bpe"
    Tokenizer({b: bytes([b]) for b in range(256)}, [], [EOT]).save(saved)
    lines = saved.read_text(encoding="utf-8").splitlines()
    lines[10] = "7 a b"
    saved.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t.bpe line 11: malformed record '7 a b'"):
        Tokenizer.load(saved)


def test_cli_train_and_encode(tmp_path, capsys):
    out = tmp_path / "tok"
    assert bpe_main(["train", SLICE, "--vocab-size", "300", "--special", EOT,
                     "--workers", "1", "-o", str(out)]) == 0
    tok = Tokenizer.load(out)
    assert len(tok.vocab) == 300 and tok.special_tokens == {EOT: 299}
    assert os.path.exists(out / "tokenizer.tiktoken")
    small = tmp_path / "small.txt"
    small.write_text("the the" + EOT, encoding="utf-8")
    capsys.readouterr()
    assert bpe_main(["encode", "-t", str(out), str(small), "--workers", "1",
                     "--allow-special"]) == 0
    assert capsys.readouterr().out.split() == \
        [str(i) for i in tok.encode("the the" + EOT, allowed_special="all")]
    assert bpe_main(["encode", "-t", str(out), str(small), "--stats"]) == 0
    assert "bytes/token" in capsys.readouterr().out
    assert bpe_main(["train", str(small), "--vocab-size", "10", "-o", str(out)]) == 1
