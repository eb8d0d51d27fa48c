"""Read a Hugging Face `tokenizers` tokenizer.json of a byte-level BPE model into a Tokenizer.

What the file holds and what becomes of it:
    model.vocab     {GPT-2-spelled token: id}  -> {id: bytes} (gpt2.from_printable)
    model.merges    ["a b", ...] (older files) or [["a", "b"], ...] (tokenizers >= 0.20)
                    -> [(bytes, bytes)] in rank order
    pre_tokenizer   ByteLevel (GPT-2's regex when use_regex), or Split(Regex) followed by
                    ByteLevel(use_regex=False) (Llama 3, Qwen2), or a Sequence of these
                    -> the Tokenizer's pattern
    added_tokens    [{"id", "content", ...}] -> special tokens: matched before
                    pre-tokenization, as `tokenizers` matches added tokens
    normalizer      null, or NFC (Qwen2, Qwen3): the text is NFC-normalised before encoding
                    (NormalizedTokenizer)
A field the Tokenizer cannot reproduce (another normalizer, add_prefix_space, a Split that
keeps only the gaps, ignore_merges) is an error naming it, never silently dropped.
Reference: huggingface/tokenizers tokenizers/src/pre_tokenizers/byte_level.rs and
tokenizers/src/models/bpe/model.rs (the serialized fields).
"""
import json
import unicodedata

from .gpt2 import from_printable
from .tokenizer import Tokenizer

NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")


class NormalizedTokenizer(Tokenizer):
    """A Tokenizer that applies a Unicode normal form to the text before encoding it, as a
    `tokenizers` normalizer of that type does (added tokens are matched after it here; they
    are ASCII in the checkpoints this serves, where the order does not matter)."""

    def __init__(self, vocab, merges, special_tokens=None, pattern="gpt2", normal_form="NFC"):
        super().__init__(vocab, merges, special_tokens, pattern)
        self.normal_form = normal_form

    def encode(self, text, allowed_special="all"):
        return super().encode(unicodedata.normalize(self.normal_form, text), allowed_special)

    def encode_ordinary(self, text):
        return super().encode_ordinary(unicodedata.normalize(self.normal_form, text))


def _fail(path, msg):
    raise ValueError(f"tokenizer.json {path}: {msg}")


def _pattern(path, pre):
    """The regex pattern of a byte-level pre-tokenizer (ByteLevel / Split / Sequence)."""
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    pattern = None
    for step in steps:
        kind = (step or {}).get("type")
        if kind == "ByteLevel":
            if step.get("add_prefix_space"):
                _fail(path, "pre_tokenizer ByteLevel add_prefix_space=true is not implemented")
            if step.get("use_regex", True):
                if pattern is not None:
                    _fail(path, "two regex pre-tokenizers in a row are not implemented")
                pattern = "gpt2"  # GPT-2's regex: the Tokenizer's Numba scanner
        elif kind == "Split":
            regex = step.get("pattern", {}).get("Regex")
            if regex is None or step.get("behavior") != "Isolated" or step.get("invert"):
                _fail(path, f"pre_tokenizer Split {step} is not implemented (only a Regex "
                            f"pattern with behavior Isolated, invert false)")
            if pattern is not None:
                _fail(path, "two regex pre-tokenizers in a row are not implemented")
            pattern = regex
        else:
            _fail(path, f"pre_tokenizer {kind!r} is not implemented (ByteLevel, Split, "
                        f"Sequence)")
    if pattern is None:
        _fail(path, "no ByteLevel or Split pre-tokenizer: not a byte-level BPE tokenizer")
    return pattern


def _merge(path, rank, m):
    a, b = m.split(" ") if isinstance(m, str) else m
    where = f"tokenizer.json {path} merge {rank}"
    return from_printable(a, where), from_printable(b, where)


def from_tokenizer_json(path):
    """The Tokenizer of a byte-level BPE tokenizer.json (see the module docstring)."""
    with open(path, encoding="utf-8") as fh:
        spec = json.load(fh)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        _fail(path, f"model.type {model.get('type')!r} is not BPE")
    normal_form = (spec.get("normalizer") or {}).get("type")
    if normal_form is not None and normal_form not in NORMALIZERS:
        _fail(path, f"normalizer {normal_form!r} is not implemented (only {NORMALIZERS})")
    if model.get("ignore_merges") or model.get("dropout") or model.get("byte_fallback"):
        _fail(path, "model.ignore_merges / dropout / byte_fallback are not implemented")
    pattern = _pattern(path, spec.get("pre_tokenizer"))
    added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    vocab = {i: from_printable(tok, f"tokenizer.json {path} token {tok!r}")
             for tok, i in model["vocab"].items() if tok not in added}
    merges = [_merge(path, r, m) for r, m in enumerate(model.get("merges", []))]
    if normal_form is None:
        return Tokenizer(vocab, merges, added, pattern)
    return NormalizedTokenizer(vocab, merges, added, pattern, normal_form)
