"""Read a Hugging Face `tokenizers` tokenizer.json into a tokenizer that encodes as it does.

from_tokenizer_json dispatches on the model and its text pipeline:
    model.type Unigram                                 -> Unigram (unigram_files.py)
    BPE over characters: byte_fallback, or a Metaspace
      pre-tokenizer, or a Prepend/Replace normalizer   -> SentencePieceBPE (Llama 2, Mistral
                                                          v0.1; unigram_files.load_bpe_json)
    BPE over bytes (ByteLevel)                         -> Tokenizer or HFByteLevel (below)
and wraps it with the post_processor's special tokens (hf_post.PostProcessed: encode(text,
add_special_tokens=True) adds e.g. Llama's <|begin_of_text|>).

What a byte-level file holds and what becomes of it:
    model.vocab     {GPT-2-spelled token: id}  -> {id: bytes} (gpt2.from_printable)
    model.merges    ["a b", ...] (older files) or [["a", "b"], ...] (tokenizers >= 0.20)
                    -> [(bytes, bytes)] in rank order
    a byte with no single-byte token in the vocab: dropped from the text when model.unk_token
                    is null, as `tokenizers` does (SmolLM2); with an unk_token, an error
    model.ignore_merges  (Llama 3) a pre-token that is itself in the vocab is that one id,
                    whatever the merges would make of it
    pre_tokenizer   ByteLevel (GPT-2's regex when use_regex), or Split(Regex) followed by
                    ByteLevel(use_regex=False) (Llama 3, Qwen2), or a Sequence of these
                    -> the Tokenizer's pattern
                    ByteLevel add_prefix_space: a space before every piece of text (between
                    added tokens) that does not start with one; after a Split, before every
                    Split piece that does not (as `tokenizers` runs it on each)
    added_tokens    [{"id", "content", ...}] -> special tokens: matched before
                    pre-tokenization, as `tokenizers` matches added tokens
    normalizer      null, or NFC (Qwen2, Qwen3) / NFD / NFKC / NFKD: applied to each piece
                    of text between added tokens
A field the tokenizer cannot reproduce (another normalizer, a Split that keeps only the gaps,
BPE dropout) is an error naming it, never silently dropped.
Reference: huggingface/tokenizers tokenizers/src/pre_tokenizers/byte_level.rs and
tokenizers/src/models/bpe/model.rs (the serialized fields).
"""
import json
import unicodedata

from .gpt2 import from_printable
from .hf_post import PostProcessed, post_processor_ids
from .tokenizer import Tokenizer
from .unigram_files import load_bpe_json, load_unigram_json

NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")


class HFByteLevel(Tokenizer):
    """A Tokenizer with the parts of a `tokenizers` byte-level pipeline that the plain one
    lacks: a Unicode normal form applied to the text pieces (normal_form), a space put before
    them (prefix "piece": each piece between added tokens; "pretoken": each pre-token, the
    ByteLevel-after-Split case) and ignore_merges (a pre-token in the vocab is its id).
    The pre-token prefix and ignore_merges run on the regex path, not the Numba scanner."""

    def __init__(self, vocab, merges, special_tokens=None, pattern="gpt2", *, normal_form=None,
                 prefix=None, ignore_merges=False, drop_missing_bytes=False):
        super().__init__(vocab, merges, special_tokens, pattern,
                         drop_missing_bytes=drop_missing_bytes)
        self.normal_form, self.prefix, self.ignore_merges = normal_form, prefix, ignore_merges
        if prefix == "pretoken" or ignore_merges:
            self._fast = False

    def _pieces(self, text, special_re):
        out = []
        for is_special, piece in super()._pieces(text, special_re):
            if not is_special and self.normal_form:
                piece = unicodedata.normalize(self.normal_form, piece)
            if not is_special and self.prefix == "piece" and not piece.startswith(" "):
                piece = " " + piece
            out.append((is_special, piece))
        return out

    def _pretokens(self, piece):
        pre = super()._pretokens(piece)
        if self.prefix != "pretoken":
            return pre
        return [p if p.startswith(" ") else " " + p for p in pre]

    def _bpe(self, token):
        whole = self._id_of.get(token) if self.ignore_merges else None
        return (whole,) if whole is not None else super()._bpe(token)

    def encode_iterable(self, iterable, *args, **kwargs):
        if self.prefix:  # each chunk would get its own space
            raise ValueError("encode_iterable: a tokenizer with add_prefix_space encodes "
                             "whole texts only (use encode)")
        return super().encode_iterable(iterable, *args, **kwargs)

    def encode_file(self, path, *args, **kwargs):
        if self.prefix:
            raise ValueError("encode_file: a tokenizer with add_prefix_space encodes whole "
                             "texts only (use encode)")
        return super().encode_file(path, *args, **kwargs)


def _fail(path, msg):
    raise ValueError(f"tokenizer.json {path}: {msg}")


def _pattern(path, pre):
    """(regex pattern, prefix mode) of a byte-level pre-tokenizer (ByteLevel / Split /
    Sequence); the mode is HFByteLevel's prefix (None without add_prefix_space)."""
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    pattern = prefix = None
    for step in steps:
        kind = (step or {}).get("type")
        if kind == "ByteLevel":
            if step.get("add_prefix_space"):
                prefix = "piece" if pattern is None else "pretoken"
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
    return pattern, prefix


def _merge(path, rank, m):
    a, b = m.split(" ") if isinstance(m, str) else m
    where = f"tokenizer.json {path} merge {rank}"
    return from_printable(a, where), from_printable(b, where)


def _is_sentencepiece(spec):
    """A BPE over characters with ▁ for spaces (Llama 2's form) rather than over bytes."""
    norm, pre = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
    steps = {n.get("type") for n in norm.get("normalizers", [norm])}
    return bool(spec["model"].get("byte_fallback") or pre.get("type") == "Metaspace"
                or steps & {"Prepend", "Replace"})


def _byte_level(path, spec):
    """The Tokenizer (or HFByteLevel) of a byte-level BPE tokenizer.json."""
    model = spec["model"]
    normal_form = (spec.get("normalizer") or {}).get("type")
    if normal_form is not None and normal_form not in NORMALIZERS:
        _fail(path, f"normalizer {normal_form!r} is not implemented (only {NORMALIZERS})")
    if model.get("dropout"):
        _fail(path, "model.dropout (BPE-dropout) is not implemented")
    pattern, prefix = _pattern(path, spec.get("pre_tokenizer"))
    added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    vocab = {i: from_printable(tok, f"tokenizer.json {path} token {tok!r}")
             for tok, i in model["vocab"].items() if tok not in added}
    merges = [_merge(path, r, m) for r, m in enumerate(model.get("merges", []))]
    ignore_merges = bool(model.get("ignore_merges"))
    drop = model.get("unk_token") is None  # `tokenizers` drops a byte with no token
    if normal_form is None and prefix is None and not ignore_merges:
        return Tokenizer(vocab, merges, added, pattern, drop_missing_bytes=drop)
    return HFByteLevel(vocab, merges, added, pattern, normal_form=normal_form, prefix=prefix,
                       ignore_merges=ignore_merges, drop_missing_bytes=drop)


def from_tokenizer_json(path):
    """The tokenizer of a tokenizer.json (see the module docstring), as PostProcessed: its
    encode(text, add_special_tokens=True) adds the post-processor's special tokens."""
    with open(path, encoding="utf-8") as fh:
        spec = json.load(fh)
    kind = (spec.get("model") or {}).get("type")
    if kind == "Unigram":
        tok = load_unigram_json(path)
    elif kind != "BPE":
        _fail(path, f"model.type {kind!r} is neither BPE nor Unigram")
    elif _is_sentencepiece(spec):
        tok = load_bpe_json(path)
    else:
        tok = _byte_level(path, spec)
    return PostProcessed(tok, *post_processor_ids(spec.get("post_processor"),
                                                  f"tokenizer.json {path}"))
