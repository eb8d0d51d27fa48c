"""Every normalizer, pre-tokenizer, model and decoder kind of HF `tokenizers` read from a
tokenizer.json gives the ids (and decoded text) `tokenizers` gives, on multilingual, emoji,
digit, punctuation, control-character and special-token texts (tools/make_hf_pipeline_fixtures.py
wrote the expectations). Where a fast specialised tokenizer takes the file, the general
HFPipeline is checked on it too."""
import gzip
import json
from pathlib import Path
from re import escape as regex_escape

import pytest

from scratchllm.tokenizer import HFPipeline, tokenizer_from_spec

FIX = Path(__file__).resolve().parents[1] / "fixtures"
with gzip.open(FIX / "hf" / "pipelines.json.gz", "rt", encoding="utf-8") as _fh:
    DATA = json.load(_fh)
_BLOB = json.loads((FIX / "unigram" / "hf_unigram_precompiled.json").read_text("utf-8"))


def _charsmap():
    steps = _BLOB["normalizer"].get("normalizers", [_BLOB["normalizer"]])
    return next(s for s in steps if s["type"] == "Precompiled")["precompiled_charsmap"]


def spec_of(name):
    case = DATA["cases"][name]
    text = json.dumps(case["spec"], ensure_ascii=False).replace("@precompiled_charsmap",
                                                               _charsmap())
    return dict(json.loads(text), model=DATA["models"][case["model"]])


def check(tok, case, name):
    special = {i for t, i in tok.special_tokens.items() if t not in ("[UNK]", "<unk>")}
    for k, text in enumerate(DATA["texts"]):
        where = f"{name} text {k} {text[:30]!r}"
        assert tok.encode(text, allowed_special="all") == case["encode"][k], where
        ordinary = tok.encode_ordinary(text)
        if special & set(case["encode_ordinary"][k]):  # tokenizers' model matched "[CLS]"
            assert not special & set(ordinary), where  # as a piece: ours never gives it
        else:
            assert ordinary == case["encode_ordinary"][k], where
        assert tok.encode(text, allowed_special="all", add_special_tokens=True) == \
            case["encode_special"][k], where


@pytest.mark.parametrize("name", sorted(DATA["cases"]))
def test_ids_equal_hf_tokenizers(name):
    case, spec = DATA["cases"][name], spec_of(name)
    tok = tokenizer_from_spec(spec, name)
    check(tok, case, name)
    if not isinstance(tok.inner, HFPipeline):
        check(type(tok)(HFPipeline(spec, name), tok.prefix, tok.suffix), case, name)


@pytest.mark.parametrize("name", sorted(DATA["cases"]))
def test_decode_equals_hf_tokenizers(name):
    case = DATA["cases"][name]
    tok = HFPipeline(spec_of(name), name)
    for k, ids in enumerate(case["encode"]):
        assert tok.decode(ids) == case["decode"][k], f"{name} text {k}"


def test_what_the_pipeline_cannot_honour_is_named():
    spec = spec_of("whitespace")
    bad = {"model": dict(spec["model"], dropout=0.1),
           "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Sideways",
                             "invert": False},
           "normalizer": {"type": "Replace", "pattern": {"Glob": "*"}, "content": ""}}
    messages = {"model": "BPE dropout 0.1 is not implemented",
                "pre_tokenizer": "Split behavior 'Sideways' is not one of",
                "normalizer": "neither {'String': s} nor {'Regex': r}"}
    for field, value in bad.items():
        with pytest.raises(ValueError, match=regex_escape(messages[field])):
            HFPipeline(dict(spec, **{field: value}), "case")
    with pytest.raises(ValueError, match="model type 'Char' is not one of"):
        HFPipeline(dict(spec, model={"type": "Char"}), "case")
    with pytest.raises(ValueError, match="WordLevel: 'zzz' is not in the vocab and there is no"):
        HFPipeline(dict(spec, model={"type": "WordLevel", "vocab": {"a": 0}}),
                   "case").encode_ordinary("zzz")


def test_digits_regex_equals_the_pipeline_on_random_strings():
    """The fast form of Digits + ByteLevel (one regex) cuts random strings of letters,
    numerics of several kinds, spaces, newlines and punctuation as the step-by-step pipeline."""
    import random
    rnd = random.Random(0)
    alphabet = ["a", "B", " ", "  ", "\n", "\t", "1", "23", "٣", "½", "Ⅻ", "'s", "'", ".", "$",
                "é", "中", "🙂"]
    for name in ("digits_individual", "digits_contiguous"):
        spec = spec_of(name)
        fast, slow = tokenizer_from_spec(spec, name), HFPipeline(spec, name)
        assert not isinstance(fast.inner, HFPipeline)
        for _ in range(300):
            text = "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(1, 12)))
            assert fast.encode_ordinary(text) == slow.encode_ordinary(text), repr(text)
