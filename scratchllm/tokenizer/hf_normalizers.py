"""Hugging Face `tokenizers` normalizers, read from a tokenizer.json "normalizer" field and run
on text as `tokenizers` runs them (huggingface/tokenizers tokenizers/src/normalizers/*.rs).

A normalizer maps a piece of text (between added tokens) to its normal form. Each one here is
a function  text -> (text', kept)  where kept is False when the piece's first original
character was deleted (Metaspace's prepend_scheme "first" asks whether a pre-token starts at
original offset 0; hf_pipeline tracks that flag). The kinds:

    NFC, NFD, NFKC, NFKD   unicodedata.normalize
    Lowercase              per character (char::to_lowercase: no final-sigma rule)
    Strip                  strip_left / strip_right of Unicode White_Space
    StripAccents           drop combining marks (\\p{M}); usually after NFD
    Replace                pattern {"String": s} (literal) or {"Regex": r} -> content
    Prepend                prepend before a non-empty piece
    BertNormalizer         clean_text: drop NUL, U+FFFD and other-category characters
                           (Cc Cf Cn Co Cs) except \\t \\n \\r, whitespace -> " ";
                           handle_chinese_chars: " c " around each CJK ideograph;
                           strip_accents (default: = lowercase): NFD then drop Mn;
                           lowercase
    Nmt                    drop ASCII controls, map other spacing characters to " "
    Precompiled            SentencePiece's rules as HF applies them (charsmap.CharsMap)
    ByteLevel              each UTF-8 byte as GPT-2's printable character
    Sequence               each in turn
"""
import base64
import unicodedata

import regex

from .charsmap import CharsMap
from .gpt2 import bytes_to_unicode

_WS = regex.compile(r"\p{White_Space}")
_MARK = regex.compile(r"\p{M}")
_CJK = regex.compile("[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\U0002a700-\U0002b73f"
                     "\U0002b740-\U0002b81f\U0002b920-\U0002ceaf\uf900-\ufaff"
                     "\U0002f800-\U0002fa1f]")
_BERT_DROP = regex.compile(r"[\x00\ufffd]|(?![\t\n\r])\p{C}")   # NUL, U+FFFD, other (C*)
_BERT_SPACE = regex.compile(r"[\t\n\r\p{White_Space}]")
_NONSPACING = regex.compile(r"\p{Mn}")
_NMT_DROP = {*range(0x01, 0x09), 0x0B, *range(0x0E, 0x20), 0x7F, 0x8F, 0x9F}
_NMT_SPACE = {0x09, 0x0A, 0x0C, 0x0D, 0x1680, *range(0x200B, 0x2010), 0x2028, 0x2029, 0x2581,
              0xFEFF, 0xFFFD}
_BYTE_CHAR = bytes_to_unicode()


def _fail(where, msg):
    raise ValueError(f"{where}: normalizer {msg}")


def _filtered(text, keep):
    """(text without the characters keep() refuses, whether its first character stayed)."""
    out = "".join(c for c in text if keep(c))
    return out, not text or keep(text[0])


def bert_normalize(text, spec):
    """BertNormalizer (tokenizers/src/normalizers/bert.rs): (text', first character kept)."""
    kept = True
    if spec.get("clean_text", True):
        out = _BERT_DROP.sub("", text)
        kept = not text or _BERT_DROP.match(text[0]) is None
        text = _BERT_SPACE.sub(" ", out)
    if spec.get("handle_chinese_chars", True):
        text = _CJK.sub(lambda m: f" {m.group()} ", text)
    lowercase = spec.get("lowercase", True)
    strip = spec.get("strip_accents")
    if lowercase if strip is None else strip:
        nfd = unicodedata.normalize("NFD", text)
        kept = kept and not (nfd and _NONSPACING.match(nfd[0]))
        text = _NONSPACING.sub("", nfd)
    if lowercase:
        text = "".join(map(str.lower, text))
    return text, kept


def pattern_regex(pattern, where):
    """The compiled regex of a tokenizer.json pattern {"String": s} or {"Regex": r}."""
    if not isinstance(pattern, dict) or len(pattern) != 1 or \
            not set(pattern) <= {"String", "Regex"}:
        raise ValueError(f"{where}: pattern {pattern!r} is neither {{'String': s}} nor "
                         f"{{'Regex': r}}")
    (kind, value), = pattern.items()
    return regex.compile(regex.escape(value) if kind == "String" else value)


def _replace(compiled, content):
    def run(text):
        m = compiled.search(text)
        kept = not (m is not None and m.start() == 0 and m.end() > 0 and not content)
        return compiled.sub(lambda _: content, text), kept
    return run


def _strip(left, right):
    def run(text):
        out = text
        if left:
            out = regex.sub(r"^\p{White_Space}+", "", out)
        if right:
            out = regex.sub(r"\p{White_Space}+$", "", out)
        return out, not (left and text and _WS.match(text[0]))
    return run


def _nmt(text):
    out, kept = _filtered(text, lambda c: ord(c) not in _NMT_DROP)
    return "".join(" " if ord(c) in _NMT_SPACE else c for c in out), kept


def _precompiled(charsmap):
    def run(text):
        out = charsmap.normalize_hf(text)
        first = regex.match(r"\X", text)
        return out, first is None or charsmap.normalize_hf(first.group()) != ""
    return run


def _sequence(steps):
    def run(text):
        kept = True
        for step in steps:
            text, k = step(text)
            kept = kept and k
        return text, kept
    return run


def build_normalizer(spec, where="tokenizer.json"):
    """The function text -> (normal form, first character kept) of a tokenizer.json
    normalizer (None: the identity). An unknown type is an error naming it."""
    if spec is None:
        return lambda text: (text, True)
    kind = spec.get("type")
    if kind in ("NFC", "NFD", "NFKC", "NFKD"):
        return lambda text: (unicodedata.normalize(kind, text), True)
    if kind == "Lowercase":
        return lambda text: ("".join(c.lower() for c in text), True)
    if kind == "Strip":
        return _strip(spec.get("strip_left", True), spec.get("strip_right", True))
    if kind == "StripAccents":
        return lambda text: _filtered(text, lambda c: not _MARK.match(c))
    if kind == "Replace":
        return _replace(pattern_regex(spec.get("pattern"), f"{where} Replace"),
                        spec.get("content", ""))
    if kind == "Prepend":
        return lambda text: ((spec["prepend"] + text) if text else text, True)
    if kind == "BertNormalizer":
        return lambda text: bert_normalize(text, spec)
    if kind == "Nmt":
        return _nmt
    if kind == "Precompiled":
        blob = base64.b64decode(spec.get("precompiled_charsmap") or "")
        if not blob:
            return lambda text: (text, True)
        return _precompiled(CharsMap(blob, hf=True))
    if kind == "ByteLevel":
        return lambda text: ("".join(_BYTE_CHAR[b] for b in text.encode("utf-8")), True)
    if kind == "Sequence":
        return _sequence([build_normalizer(s, where) for s in spec.get("normalizers", [])])
    _fail(where, f"{kind!r} is not one of the tokenizers library's (NFC, NFD, NFKC, NFKD, "
                 f"Lowercase, Strip, StripAccents, Replace, Prepend, BertNormalizer, Nmt, "
                 f"Precompiled, ByteLevel, Sequence)")
