"""tokenizer.json (byte-level BPE, SentencePiece BPE) read by scratchllm gives the ids of HF `tokenizers` on the
corpus slice and on multilingual, emoji and special-token samples (expected ids recorded by
tools/make_hf_fixtures.py), for encode and encode_ordinary; both merge spellings load."""
import json

import pytest

from scratchllm.hub import load_tokenizer
from scratchllm.tokenizer import Tokenizer, from_tokenizer_json
from hub_fixtures import HF

KINDS = ["tokenizer_bytelevel", "tokenizer_split", "tokenizer_nfc"]


@pytest.mark.parametrize("kind", KINDS)
def test_ids_equal_hf_tokenizers(kind):
    expected = json.loads((HF / kind / "expected.json").read_text(encoding="utf-8"))
    tok = load_tokenizer(HF / kind)
    for text, ids, ordinary in zip(expected["texts"], expected["encode"],
                                   expected["encode_ordinary"]):
        # HF tokenizers' encode matches added tokens in the text; ours does only when asked
        assert tok.encode(text, allowed_special="all") == ids, text[:40]
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
    for field, kind in (("normalizer", "NoSuch"), ("pre_tokenizer", "Nope"),
                        ("decoder", "Never")):
        broken = dict(spec, **{field: {"type": kind}})
        (tmp_path / "tokenizer.json").write_text(json.dumps(broken), encoding="utf-8")
        with pytest.raises(ValueError, match=f"{field} '{kind}' is not one of the tokenizers"):
            from_tokenizer_json(tmp_path / "tokenizer.json")
    with pytest.raises(ValueError, match="has no tokenizer.json"):
        load_tokenizer(tmp_path / "nowhere")


# tools/make_hf_tokenizer_fixtures.py: add_prefix_space, ignore_merges, SentencePiece BPE forms,
# post-processors; "encode_special" = HF's encode(text) with add_special_tokens=True
PIPELINES = ["tokenizer_prefix", "tokenizer_prefix_split", "tokenizer_llama3",
             "tokenizer_llama2", "tokenizer_metaspace", "tokenizer_missing_bytes"]


@pytest.mark.parametrize("kind", PIPELINES)
def test_pipeline_ids_equal_hf_tokenizers(kind):
    expected = json.loads((HF / kind / "expected.json").read_text(encoding="utf-8"))
    tok = load_tokenizer(HF / kind)
    for text, ids, special, ordinary in zip(expected["texts"], expected["encode"],
                                            expected["encode_special"],
                                            expected["encode_ordinary"]):
        assert tok.encode(text, allowed_special="all") == ids, text[:40]
        assert tok.encode(text, allowed_special="all", add_special_tokens=True) == special
        assert tok.encode_ordinary(text) == ordinary, text[:40]


def test_the_fixtures_exercise_each_option(tmp_path):
    """Without ignore_merges, the prefix space or the template, the ids differ from HF's."""
    first = {k: json.loads((HF / k / "expected.json").read_text(encoding="utf-8"))
             for k in PIPELINES}
    text = first["tokenizer_llama3"]["texts"][0]
    spec = json.loads((HF / "tokenizer_llama3" / "tokenizer.json").read_text(encoding="utf-8"))
    spec["model"]["ignore_merges"] = False
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    assert load_tokenizer(tmp_path).encode(text) != first["tokenizer_llama3"]["encode"][0]
    for kind, without in (("tokenizer_prefix", "tokenizer_bytelevel"),
                          ("tokenizer_prefix_split", "tokenizer_split")):
        assert load_tokenizer(HF / without).encode(text) != first[kind]["encode"][0]
    bos = load_tokenizer(HF / "tokenizer_llama2").encode("Hello", add_special_tokens=True)
    assert bos[0] == 1 and bos[1:] == load_tokenizer(HF / "tokenizer_llama2").encode("Hello")


def test_prefix_space_refuses_chunked_encoding(tmp_path):
    tok = load_tokenizer(HF / "tokenizer_prefix")
    with pytest.raises(ValueError, match="encode_iterable: a tokenizer with add_prefix_space"):
        list(tok.encode_iterable(["a", "b"]))
    (tmp_path / "t.txt").write_text("a b", encoding="utf-8")
    with pytest.raises(ValueError, match="encode_file: a tokenizer with add_prefix_space"):
        tok.encode_file(tmp_path / "t.txt")


@pytest.mark.parametrize("post, message", [
    ({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}],
      "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}, "has no \\$A"),
    ({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<x>", "type_id": 0}},
                                               {"Sequence": {"id": "A", "type_id": 0}}],
      "special_tokens": {}}, "names '<x>', not in its special_tokens"),
    ({"type": "Marian"}, "'Marian' is not implemented")])
def test_unsupported_post_processors_are_errors(post, message, tmp_path):
    spec = json.loads((HF / "tokenizer_split" / "tokenizer.json").read_text(encoding="utf-8"))
    spec["post_processor"] = post
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match=f"post_processor .*{message}"):
        load_tokenizer(tmp_path)


def test_bert_and_roberta_post_processors_wrap_cls_and_sep(tmp_path):
    spec = json.loads((HF / "tokenizer_split" / "tokenizer.json").read_text(encoding="utf-8"))
    spec["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "RobertaProcessing", "sep": ["<|endoftext|>", 0], "cls": ["<|endoftext|>", 0]},
        {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}},
                                                  {"SpecialToken": {"id": "e", "type_id": 0}}],
         "special_tokens": {"e": {"id": "e", "ids": [7, 8], "tokens": ["e"]}}}]}
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    tok = load_tokenizer(tmp_path)
    assert tok.encode("hi", add_special_tokens=True) == [0] + tok.encode("hi") + [0, 7, 8]


def test_missing_byte_tokens_are_dropped_only_without_unk_token(tmp_path):
    """tokenizer_missing_bytes lacks b"\\x04" (and four more): HF drops it, merges over the gap
    ("!\\x04!" -> "!!"); with an unk_token (HF would emit it) or in a plain Tokenizer, an error;
    a merge of a missing byte is a malformed file."""
    tok = load_tokenizer(HF / "tokenizer_missing_bytes")
    assert tok.encode("\x04") == [] and tok.encode("!\x04!") == [tok.encode("!!")[0]]
    assert tok.encode("a\x04b") == tok.encode("a") + tok.encode("b")
    spec = json.loads((HF / "tokenizer_missing_bytes" / "tokenizer.json").read_text("utf-8"))
    with pytest.raises(ValueError, match="byte token b'\\\\x04' is not in the vocab"):
        Tokenizer(tok.vocab, tok.merges)
    for change in ({"unk_token": "!"}, {"merges": spec["model"]["merges"] + [["\u0104", "!"]]}):
        broken = dict(spec, model=dict(spec["model"], **change))
        (tmp_path / "tokenizer.json").write_text(json.dumps(broken), encoding="utf-8")
        with pytest.raises(ValueError, match="token b'\\\\x04' is not in the vocab"):
            load_tokenizer(tmp_path)
