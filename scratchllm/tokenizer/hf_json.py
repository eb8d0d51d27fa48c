"""Read a Hugging Face `tokenizers` tokenizer.json into a tokenizer that encodes as it does.

from_tokenizer_json (tokenizer_from_spec for a parsed file) dispatches on the model and its
text pipeline. Three fast forms have specialised tokenizers (Numba kernels):
    model.type Unigram, a Metaspace pre-tokenizer, NFKC / Precompiled / no normalizer
                                                       -> Unigram (unigram_files.py)
    BPE over characters: Prepend("▁") + Replace(" ", "▁"), or Metaspace without split
                                                       -> SentencePieceBPE (Llama 2, Mistral
                                                          v0.1; unigram_files.load_bpe_json)
    BPE over bytes: ByteLevel / Split(Isolated) with one regex, a Unicode normal form or none
                                                       -> Tokenizer or HFByteLevel (below)
and every other file (WordPiece, WordLevel, every other normalizer and pre-tokenizer, added
tokens with lstrip / rstrip / single_word) goes to hf_pipeline.HFPipeline, which runs each
step as `tokenizers` does. Either is wrapped with the post_processor's special tokens
(hf_post.PostProcessed: encode(text, add_special_tokens=True) adds e.g. Llama's
<|begin_of_text|>). An unknown type anywhere (normalizer, pre-tokenizer, model, decoder) is an
error naming it, never silently dropped. The file's "truncation" and "padding" are options
of a batch encode call (a length to cut or pad to), not of the text pipeline: encode never
applies them.

What a byte-level file holds and what becomes of it in the fast form:
    model.vocab     {GPT-2-spelled token: id}  -> {id: bytes} (gpt2.from_printable)
    model.merges    ["a b", ...] (older files) or [["a", "b"], ...] (tokenizers >= 0.20)
                    -> [(bytes, bytes)] in rank order
    a byte with no single-byte token in the vocab: dropped from the text when model.unk_token
                    is null, as `tokenizers` does (SmolLM2); with an unk_token, an error
    model.ignore_merges  (Llama 3) a pre-token that is itself in the vocab is that one id,
                    whatever the merges would make of it
    pre_tokenizer   ByteLevel (GPT-2's regex when use_regex), or Split(Regex) followed by
                    ByteLevel(use_regex=False) (Llama 3, Qwen2), or a Sequence of these, or
                    Digits then ByteLevel (SmolLM2: one regex, DIGITS_GPT2)
                    -> the Tokenizer's pattern (a Split regex that is not a built-in one also
                    keeps the gaps between its matches, as Isolated does)
                    ByteLevel add_prefix_space: a space before every piece of text (between
                    added tokens) that does not start with one; after a Split, before every
                    Split piece that does not (as `tokenizers` runs it on each)
    added_tokens    [{"id", "content", ...}] -> special tokens: matched before
                    pre-tokenization, as `tokenizers` matches added tokens
    normalizer      null, or NFC (Qwen2, Qwen3) / NFD / NFKC / NFKD: applied to each piece
                    of text between added tokens
Reference: huggingface/tokenizers tokenizers/src/pre_tokenizers/byte_level.rs and
tokenizers/src/models/bpe/model.rs (the serialized fields).
"""
import json
import unicodedata

from .charsmap import SPACE
from .fast_scan import KIND
from .gpt2 import from_printable
from .hf_decoders import build_decoder
from .hf_pipeline import HFPipeline
from .hf_post import PostProcessed, post_processor_ids
from .tokenizer import Tokenizer
from .unigram_files import bpe_from_json, unigram_from_json

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
    if _digits_then_gpt2(steps):
        return DIGITS_GPT2[bool(steps[0].get("individual_digits"))], None
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
            pattern = regex if regex in KIND else _isolated(regex)
        else:
            _fail(path, f"pre_tokenizer {kind!r} is not implemented (ByteLevel, Split, "
                        f"Sequence)")
    if pattern is None:
        _fail(path, "no ByteLevel or Split pre-tokenizer: not a byte-level BPE tokenizer")
    return pattern, prefix


# Digits then GPT-2's regex on each piece (SmolLM2, StarCoder2) as one regex over the whole
# text: each numeric character alone (individual_digits) or numeric runs; GPT-2's
# alternatives never meet a numeric inside a Digits piece, and its \s+(?!\S) sees the end of
# the piece where a numeric follows, so the lookahead also lets a numeric follow.
_GPT2_BETWEEN_DIGITS = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?[^\s\p{L}\p{N}]+"""
                        r"""|\s+(?![^\s\p{N}])|\s+""")
DIGITS_GPT2 = {True: r"\p{N}|" + _GPT2_BETWEEN_DIGITS, False: r"\p{N}+|" + _GPT2_BETWEEN_DIGITS}


def _digits_then_gpt2(steps):
    """Digits followed by ByteLevel(use_regex, no prefix space): DIGITS_GPT2's form."""
    return len(steps) == 2 and (steps[0] or {}).get("type") == "Digits" and \
        (steps[1] or {}).get("type") == "ByteLevel" and steps[1].get("use_regex", True) and \
        not steps[1].get("add_prefix_space")


def _isolated(pattern):
    """A regex whose matches are pattern's matches and the gaps between them (Split's
    Isolated behaviour keeps both); a covering pattern matches as before."""
    return f"(?:{pattern})|(?:(?!(?:{pattern}))[\\s\\S])+"


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


def _plain_added(spec):
    """Added tokens that the specialised tokenizers match as `tokenizers` does: raw text, no
    lstrip / rstrip / single_word."""
    return not any(t.get(k) for t in spec.get("added_tokens", [])
                   for k in ("lstrip", "rstrip", "single_word"))


def _metaspace_ok(pre, split_ok):
    return bool(pre) and pre.get("type") == "Metaspace" and pre.get("replacement") == SPACE \
        and (split_ok or not pre.get("split", True))


def _fast_unigram(spec):
    """The forms unigram_files.load_unigram_json reproduces: NFKC / Precompiled / no rules,
    a Metaspace pre-tokenizer (with split, each ▁-word is segmented alone)."""
    norm = spec.get("normalizer")
    steps = norm.get("normalizers", [None]) if norm and norm.get("type") == "Sequence" else \
        [norm]
    return len(steps) <= 1 and (steps[0] or {}).get("type") in (None, "NFKC", "Precompiled") \
        and _metaspace_ok(spec.get("pre_tokenizer"), True) and _plain_added(spec)


def _fast_sentencepiece_bpe(spec):
    """The forms unigram_files.load_bpe_json reproduces (Llama 2 / Mistral)."""
    model, norm, pre = spec["model"], spec.get("normalizer"), spec.get("pre_tokenizer")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or \
            model.get("dropout") or not _plain_added(spec):
        return False
    steps = (norm or {}).get("normalizers", [])
    if pre is None and [n.get("type") for n in steps] == ["Prepend", "Replace"]:
        return steps[0].get("prepend") == SPACE and steps[1].get("pattern") == {"String": " "} \
            and steps[1].get("content") == SPACE
    return norm is None and _metaspace_ok(pre, False)


def _fast_byte_level(spec):
    """The forms _byte_level reproduces: a Unicode normal form or none, ByteLevel / Split
    (Isolated) pre-tokenizers with one regex, plain added tokens."""
    model, pre, norm = spec["model"], spec.get("pre_tokenizer"), spec.get("normalizer")
    if norm is not None and norm.get("type") not in NORMALIZERS or \
            model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or \
            model.get("byte_fallback") or not _plain_added(spec):
        return False
    steps = pre.get("pretokenizers", []) if pre and pre.get("type") == "Sequence" else [pre]
    if _digits_then_gpt2(steps):
        return True
    regexes = 0
    for step in steps:
        kind = (step or {}).get("type")
        if kind == "Split" and "Regex" in (step.get("pattern") or {}) and \
                step.get("behavior") == "Isolated" and not step.get("invert"):
            regexes += 1
        elif kind == "ByteLevel":
            regexes += bool(step.get("use_regex", True))
        else:
            return False
    return regexes == 1


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
    return tokenizer_from_spec(spec, path)


def tokenizer_from_spec(spec, path="tokenizer.json"):
    """from_tokenizer_json of an already parsed tokenizer.json (a dict); `path` names it in
    errors. The Unigram and SentencePiece-BPE fast forms read `path` itself."""
    kind = (spec.get("model") or {}).get("type")
    build_decoder(spec.get("decoder"), f"tokenizer.json {path}")  # an unknown one is an error
    if kind == "Unigram" and _fast_unigram(spec):
        tok = unigram_from_json(spec, f"tokenizer.json {path}")
    elif kind == "BPE" and _is_sentencepiece(spec) and _fast_sentencepiece_bpe(spec):
        tok = bpe_from_json(spec, f"tokenizer.json {path}")
    elif kind == "BPE" and not _is_sentencepiece(spec) and _fast_byte_level(spec):
        tok = _byte_level(path, spec)
    else:
        tok = HFPipeline(spec, f"tokenizer.json {path}")
    return PostProcessed(tok, *post_processor_ids(spec.get("post_processor"),
                                                  f"tokenizer.json {path}"))
