"""tokenizer.json (byte-level BPE) read by scratchllm gives the ids of HF `tokenizers` on the
corpus slice and on multilingual, emoji and special-token samples (expected ids recorded by
tools/make_hf_fixtures.py), for encode and encode_ordinary; both merge spellings load."""
import json
from pathlib import Path

import pytest

from scratchllm.hub import load_tokenizer
from scratchllm.tokenizer import from_tokenizer_json

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
KINDS = ["tokenizer_bytelevel", "tokenizer_split", "tokenizer_nfc"]


@pytest.mark.parametrize("kind", KINDS)
def test_ids_equal_hf_tokenizers(kind):
    expected = json.loads((HF / kind / "expected.json").read_text(encoding="utf-8"))
    tok = load_tokenizer(HF / kind)
    for text, ids, ordinary in zip(expected["texts"], expected["encode"],
                                   expected["encode_ordinary"]):
        assert tok.encode(text) == ids, text[:40]
        assert tok.encode_ordinary(text) == ordinary, text[:40]
        if kind != "tokenizer_nfc":  # NFC changes the text, so decoding gives the NFC form
            assert tok.decode(ids) == text


@pytest.mark.parametrize("kind", KINDS)
def test_both_merge_spellings_give_the_same_tokenizer(kind, tmp_path):
    spec = json.loads((HF / kind / "tokenizer.json").read_text(encoding="utf-8"))
    merges = spec["model"]["merges"]
    spaced = [" ".join(m) if isinstance(m, list) else m for m in merges]
    listed = [m.split(" ") if isinstance(m, str) else m for m in merges]
    toks = []
    for form in (spaced, listed):
        spec["model"]["merges"] = form
        (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
        toks.append(from_tokenizer_json(tmp_path / "tokenizer.json"))
    assert toks[0].merges == toks[1].merges and len(toks[0].merges) > 0
    assert toks[0].encode("Hello wörld 🙂") == toks[1].encode("Hello wörld 🙂")


def test_unsupported_fields_are_errors(tmp_path):
    spec = json.loads((HF / "tokenizer_split" / "tokenizer.json").read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "Lowercase"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match="normalizer 'Lowercase' is not implemented"):
        from_tokenizer_json(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        load_tokenizer(tmp_path / "nowhere")
