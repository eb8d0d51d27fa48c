"""Write one folder per kind under tests/fixtures/hf/ (tokenizer_<kind>): tokenizer.json files
with the options real checkpoints use beyond tools/make_hf_fixtures.py's three, and the ids HF
`tokenizers` gives.

    pip install tokenizers      # the ref extra
    PYTHONPATH=$PWD python tools/make_hf_tokenizer_fixtures.py   # after make_hf_fixtures.py

Each kind starts from an existing fixture file and changes what the name says:
    prefix        tokenizer_bytelevel + ByteLevel add_prefix_space=true (GPT-2 / RoBERTa
                  style) + TemplateProcessing "$A <|endoftext|>" (an end-of-text after)
    prefix_split  tokenizer_split + add_prefix_space=true on its ByteLevel step (then every
                  Split piece gets the space)
    llama3        tokenizer_split + model.ignore_merges=true, whole-word vocab entries that no
                  merge reaches, an added <|begin_of_text|>, and Llama 3's post-processor
                  Sequence[ByteLevel, TemplateProcessing "<|begin_of_text|> $A"]
    llama2        tests/fixtures/unigram/hf_bpe_bytes.json (SentencePiece BPE with byte
                  fallback, normalizer Prepend + Replace) + TemplateProcessing "<s> $A"
    metaspace     the same model with a Metaspace pre-tokenizer (prepend_scheme "first",
                  split false; the newer conversion of Llama 2) + TemplateProcessing
                  "<s> $A </s>"
    missing_bytes tokenizer_bytelevel without the single-byte tokens of MISSING (as
                  SmolLM2-135M's vocab lacks 21 bytes) and with a merge "!" "!": HF
                  `tokenizers` drops such a byte (no unk_token), so "!\x04!" is one "!!"
expected.json: texts (the multilingual, emoji and special-token samples of make_hf_fixtures,
more special-token samples, and the corpus slice: its first 6000 characters, 1000 for the
SentencePiece BPE kinds, whose merge loop is quadratic in the text's length), and per text the ids of encode(text,
add_special_tokens=False) ("encode"), of encode(text) ("encode_special": the template's
tokens added), and with encode_special_tokens=True ("encode_ordinary": added tokens as text).
"""
import json
from pathlib import Path

from tokenizers import Tokenizer, pre_tokenizers, processors

ROOT = Path(__file__).resolve().parents[1]
HF = ROOT / "tests" / "fixtures" / "hf"
CORPUS = ROOT / "tests" / "fixtures" / "python-docs-slice.txt"
SAMPLES = ["Hello world, héllo wörld! 你好，世界。 Привет мир. こんにちは 🙂🚀👍🏽 — naïve café",
           "decomposed: cafe\u0301 n\u0303 A\u030a, composed: café ñ Å; 한국어 ﬁ ① ²",
           "def f(x):\n    return x  # 3.14 1234567 don't I'm we'll\n\n\n  spaces   here",
           "<|endoftext|>after a special token<|endoftext|>",
           "<s>Hello</s> world <s>x<s></s>", "<|begin_of_text|>Hello world<|begin_of_text|>",
           " leading space", "\nnewline first", ""]
MISSING = b"\x04\x06\x13\xf0\xff"  # missing_bytes' absent bytes: controls and the emoji lead
SAMPLES_MISSING = ["\x04", "!\x04!", "a\x04b \x06\x13x\x7f", "emoji 🙂 gone\xff"]
WHOLE_WORDS = ["Hello", " world", " Привет", " 🙂🚀👍🏽", " return", "def"]  # llama3's extras


def printable(text):
    """GPT-2's printable spelling of text's UTF-8 bytes (as tokenizer.json vocabularies)."""
    (piece, _), = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                           use_regex=False).pre_tokenize_str(text)
    return piece


def spec_of(path):
    return json.loads(Path(path).read_text(encoding="utf-8"))


def prefix():
    spec = spec_of(HF / "tokenizer_bytelevel" / "tokenizer.json")
    spec["pre_tokenizer"]["add_prefix_space"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", 0)])
    return tok


def prefix_split():
    spec = spec_of(HF / "tokenizer_split" / "tokenizer.json")
    spec["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = True
    return Tokenizer.from_str(json.dumps(spec))


def llama3():
    spec = spec_of(HF / "tokenizer_split" / "tokenizer.json")
    vocab = spec["model"]["vocab"]
    for word in WHOLE_WORDS:
        assert printable(word) not in vocab, word
        vocab[printable(word)] = len(vocab)
    bos = len(vocab)
    spec["added_tokens"].append({"id": bos, "content": "<|begin_of_text|>", "single_word": False,
                                 "lstrip": False, "rstrip": False, "normalized": False,
                                 "special": True})
    spec["model"]["ignore_merges"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return tok


def llama2():
    tok = Tokenizer.from_file(str(ROOT / "tests" / "fixtures" / "unigram" / "hf_bpe_bytes.json"))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    return tok


def metaspace():
    spec = spec_of(ROOT / "tests" / "fixtures" / "unigram" / "hf_bpe_bytes.json")
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                             "prepend_scheme": "first", "split": False}
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
    return tok


def missing_bytes():
    spec = spec_of(HF / "tokenizer_bytelevel" / "tokenizer.json")
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]  # GPT-2's byte spelling:
    spelled = {b: chr(b) for b in kept}                            # these bytes as themselves,
    spelled.update({b: chr(256 + k) for k, b in enumerate(sorted(set(range(256)) - set(kept)))})
    assert set(spelled.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    for b in MISSING:
        assert not any(spelled[b] in "".join(m) for m in merges), b
        del vocab[spelled[b]]
    vocab["!!"] = max(vocab.values()) + 1
    merges.append(["!", "!"])
    return Tokenizer.from_str(json.dumps(spec))


def expectations(tok, corpus_chars):
    texts = SAMPLES + SAMPLES_MISSING * (tok.token_to_id("!!") is not None) + [CORPUS.read_text(encoding="utf-8")[:corpus_chars]]
    out = {"texts": texts, "encode": [tok.encode(t, add_special_tokens=False).ids for t in texts],
           "encode_special": [tok.encode(t).ids for t in texts]}
    tok.encode_special_tokens = True
    out["encode_ordinary"] = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    tok.encode_special_tokens = False
    return out


def main():
    for kind in (prefix, prefix_split, llama3, llama2, metaspace, missing_bytes):
        d = HF / f"tokenizer_{kind.__name__}"
        d.mkdir(exist_ok=True)
        tok = kind()
        tok.save(str(d / "tokenizer.json"))
        chars = 1000 if kind in (llama2, metaspace) else 6000  # SentencePieceBPE is O(n^2)
        expected = expectations(Tokenizer.from_file(str(d / "tokenizer.json")), chars)
        (d / "expected.json").write_text(json.dumps(expected, ensure_ascii=False),
                                         encoding="utf-8")
        print(f"{d.name}: {sum(map(len, expected['encode']))} ids")


if __name__ == "__main__":
    main()
