"""SentencePiece's normaliser: the text a Unigram or SentencePiece-BPE model segments.

The options are SentencePiece's NormalizerSpec (google/sentencepiece src/sentencepiece_model
.proto: add_dummy_prefix, remove_extra_whitespaces, the rules of precompiled_charsmap), plus
HF tokenizers' forms of the same steps (an NFKC or Precompiled normalizer, a Metaspace
pre-tokenizer whose prepend_scheme is the dummy prefix). In order:

    1. rules:      SentencePiece's precompiled rules (charsmap.py), else NFKC if asked;
    2. spaces:     with remove_extra_whitespaces, runs of " " collapse to one, ends stripped;
    3. prefix:     a dummy " " before the text (add_dummy_prefix);
    4. visible:    every " " becomes SPACE ("▁").

Glossary: normal form = the text after the four steps; dummy prefix = the " " that makes a
word at the start of the text look like a word after a space.
"""
import unicodedata
from dataclasses import dataclass

from .charsmap import SPACE, CharsMap

PREFIX_RULES = (True, False, "first", "always")


@dataclass(frozen=True)
class Normalizer:
    """How text is normalised before segmentation.

    add_dummy_prefix: True = a "▁" before text that does not start with a space (SentencePiece
        after its whitespace clean-up, HF's Metaspace), "always" = before any text (HF's
        Prepend), "first" = as True, but only at the start of the text, not after a special
        token (HF's Metaspace prepend_scheme "first"), False = never;
    nfkc: Unicode NFKC first (HF's NFKC normalizer);
    remove_extra_whitespaces: collapse runs of spaces and strip the ends (SentencePiece's
        default; HF's Metaspace keeps them);
    charsmap: a CharsMap (SentencePiece's precompiled rules) applied instead of nfkc, or None.
    """
    add_dummy_prefix: bool | str = True
    nfkc: bool = False
    remove_extra_whitespaces: bool = True
    charsmap: CharsMap | None = None

    def __post_init__(self):
        prefix = self.add_dummy_prefix
        if not (isinstance(prefix, bool) or prefix in ("first", "always")):
            self._fail("add_dummy_prefix", prefix, f"one of {PREFIX_RULES}")
        for name in ("nfkc", "remove_extra_whitespaces"):
            if not isinstance(getattr(self, name), bool):
                self._fail(name, getattr(self, name), "True or False")
        if self.charsmap is not None and not isinstance(self.charsmap, CharsMap):
            self._fail("charsmap", self.charsmap, "a CharsMap or None")
        if self.charsmap is not None and self.nfkc:
            self._fail("nfkc", self.nfkc, "False when a charsmap gives the rules")

    def _fail(self, name, got, expected):
        raise ValueError(f"Normalizer: {name} must be {expected}, got {got!r}")

    def normalize(self, text, at_start=True):
        """The normal form of `text` (str -> str, spaces shown as ▁); at_start False: the text
        follows a special token (no prefix with add_dummy_prefix "first")."""
        prefix = self.add_dummy_prefix if at_start or self.add_dummy_prefix != "first" \
            else False
        if self.charsmap is not None and not self.charsmap.hf:
            return self.charsmap.normalize(text, bool(prefix), self.remove_extra_whitespaces)
        if self.charsmap is not None:
            text = self.charsmap.normalize_hf(text)
        elif self.nfkc:
            text = unicodedata.normalize("NFKC", text)
        if self.remove_extra_whitespaces:
            text = " ".join(filter(None, text.split(" ")))
        if prefix == "always" and text or prefix and text and not text.startswith(" "):
            text = " " + text
        return text.replace(" ", SPACE)

    def strip_prefix(self, text):
        """Decoded `text` (spaces as " ") without the dummy prefix this normaliser adds."""
        return text[1:] if self.add_dummy_prefix and text.startswith(" ") else text
