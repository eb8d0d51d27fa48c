"""Hugging Face `tokenizers` pre-tokenizers, read from a tokenizer.json "pre_tokenizer" field
and run as `tokenizers` runs them (huggingface/tokenizers tokenizers/src/pre_tokenizers/*.rs,
the split behaviours of tokenizers/src/tokenizer/normalizer.rs).

A pre-tokenizer maps a list of pieces to a finer list; a piece is (text, at_start), at_start
True when the piece begins at offset 0 of the original text (Metaspace's "first" scheme asks).
Every kind cuts a piece with a pattern: the pattern marks spans (match or not, covering the
piece), and the behaviour decides what is kept:

    Removed             the non-matching spans          Isolated    every span
    MergedWithPrevious  a match glued to the span before it
    MergedWithNext      a match glued to the span after it
    Contiguous          runs of matches (and of non-matches) each one piece
    invert              matches and non-matches swap roles first
Empty pieces are dropped. The kinds:

    Whitespace        keep \\w+ | [^\\w\\s]+ (Rust regex: \\w = Alphabetic, Mark, Nd, Pc,
                      Join_Control)
    WhitespaceSplit   White_Space characters, Removed
    BertPreTokenizer  WhitespaceSplit, then punctuation Isolated
    Punctuation       ASCII punctuation or Unicode P*, behavior (default Isolated)
    Digits            Nd | Nl | No: each digit alone (individual_digits) or runs (Contiguous)
    CharDelimiterSplit  the delimiter, Removed
    UnicodeScripts    a cut where the script changes (" " belongs to every script; Hiragana,
                      Katakana and U+30FC count as Han). Python `regex`'s Script property,
                      corrected by hf_scripts.OVERRIDES where tokenizers' older table differs
                      (tools/make_hf_scripts_table.py probes tokenizers for every code point)
    Metaspace         " " -> replacement, then the replacement before a piece (prepend_scheme
                      always; first: only at_start; never) that does not start with it, then
                      (split) cut before each replacement (MergedWithNext)
    Split             {"String"}/{"Regex"} pattern, behavior, invert
    ByteLevel         (add_prefix_space) " " before a piece not starting with one, GPT-2's
                      regex (use_regex), then each UTF-8 byte as its printable character
    FixedLength       pieces of `length` characters
    Sequence          each in turn on every piece
"""

import bisect
import functools

import regex

from .gpt2 import bytes_to_unicode
from .hf_normalizers import pattern_regex
from .hf_scripts import OVERRIDES
from .pretokenize import PATTERNS

BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")
_WORDS = regex.compile(r"[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+"
                       r"|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+")
_WS = regex.compile(r"\p{White_Space}")             # each pattern below matches one character
_PUNCT = regex.compile(r"[\p{P}!-/:-@\[-`{-~]")      # Unicode P* or ASCII punctuation
_NUMERIC = regex.compile(r"[\p{Nd}\p{Nl}\p{No}]")    # Rust's char::is_numeric
_GPT2 = regex.compile(PATTERNS["gpt2"])
_BYTE_CHAR = bytes_to_unicode()
_SCRIPTS = ("Adlam Ahom AnatolianHieroglyphs Arabic Armenian Avestan Balinese Bamum BassaVah "
            "Batak Bengali Bhaiksuki Bopomofo Brahmi Braille Buginese Buhid CanadianAboriginal "
            "Carian CaucasianAlbanian Chakma Cham Cherokee Common Coptic Cuneiform Cypriot "
            "Cyrillic Deseret Devanagari Duployan EgyptianHieroglyphs Elbasan Ethiopic Georgian "
            "Glagolitic Gothic Grantha Greek Gujarati Gurmukhi Han Hangul Hanunoo Hatran Hebrew "
            "Hiragana ImperialAramaic Inherited InscriptionalPahlavi InscriptionalParthian "
            "Javanese Kaithi Kannada Katakana KayahLi Kharoshthi Khmer Khojki Khudawadi Lao "
            "Latin Lepcha Limbu LinearA LinearB Lisu Lycian Lydian Mahajani Malayalam Mandaic "
            "Manichaean Marchen MeeteiMayek MendeKikakui MeroiticCursive MeroiticHieroglyphs "
            "Miao Modi Mongolian Mro Multani Myanmar Nabataean NewTaiLue Newa Nko Ogham OlChiki "
            "OldHungarian OldItalic OldNorthArabian OldPermic OldPersian OldSouthArabian "
            "OldTurkic Oriya Osage Osmanya PahawhHmong Palmyrene PauCinHau PhagsPa Phoenician "
            "PsalterPahlavi Rejang Runic Samaritan Saurashtra Sharada Shavian Siddham "
            "SignWriting Sinhala SoraSompeng Sundanese SylotiNagri Syriac Tagalog Tagbanwa TaiLe "
            "TaiTham TaiViet Takri Tamil Tangut Telugu Thaana Thai Tibetan Tifinagh Tirhuta "
            "Ugaritic Vai WarangCiti Yi").split()
_STARTS = [a for a, _, _ in OVERRIDES]
_SCRIPT = regex.compile("|".join(f"(?P<{s}>\\p{{Script={s}}})" for s in _SCRIPTS))


def _fail(where, msg):
    raise ValueError(f"{where}: pre_tokenizer {msg}")


def regex_spans(compiled, text):
    """[(start, end, is_match)] covering text: the regex's matches and the gaps between (a
    one-character pattern gives one match per character, as tokenizers' char predicates)."""
    if not text:
        return [(0, 0, False)]
    out, prev = [], 0
    for m in compiled.finditer(text):
        if m.start() != prev:
            out.append((prev, m.start(), False))
        out.append((m.start(), m.end(), True))
        prev = m.end()
    if prev != len(text):
        out.append((prev, len(text), False))
    return out


def apply_behavior(spans, behavior):
    """[(start, end)] the behaviour keeps of the spans (normalizer.rs NormalizedString.split)."""
    if behavior == "Removed":
        return [(a, b) for a, b, m in spans if not m]
    if behavior == "Isolated":
        return [(a, b) for a, b, _ in spans]
    acc, prev = [], False
    if behavior == "MergedWithNext":
        for a, b, m in reversed(spans):
            if m and not prev and acc:
                acc[-1] = (a, acc[-1][1])
            else:
                acc.append((a, b))
            prev = m
        return acc[::-1]
    for a, b, m in spans:
        glue = (m == prev) if behavior == "Contiguous" else (m and not prev)
        if glue and acc:
            acc[-1] = (acc[-1][0], b)
        else:
            acc.append((a, b))
        prev = m
    return acc


def _cut(pieces, spans_of, behavior):
    out = []
    for text, at_start in pieces:
        for a, b in apply_behavior(spans_of(text), behavior):
            if b > a:
                out.append((text[a:b], at_start and a == 0))
    return out


@functools.lru_cache(maxsize=1 << 16)
def unicode_script(c):
    """The Unicode Script of character c (Python `regex`'s table; "Common", "Inherited",
    "Latin", ...), or None for a script outside tokenizers' list."""
    m = _SCRIPT.match(c)
    return m.lastgroup if m else None


def hf_script(c, table=True):
    """The script UnicodeScripts gives c: regex's, Hiragana, Katakana and U+30FC as Han, None
    ("Any": joins every script) for " " and, with table, tokenizers' own answer where it
    differs (hf_scripts.OVERRIDES: characters newer than its table are Any)."""
    if c == " ":
        return None
    if table and OVERRIDES:
        k = bisect.bisect_right(_STARTS, ord(c)) - 1
        if k >= 0 and OVERRIDES[k][0] <= ord(c) <= OVERRIDES[k][1]:
            return OVERRIDES[k][2]
    if ord(c) == 0x30FC:
        return "Han"
    s = unicode_script(c)
    return "Han" if s in ("Hiragana", "Katakana") else s


def script_spans(text):
    """UnicodeScripts' cuts (unicode_scripts/pre_tokenizer.rs), as Isolated spans."""
    cuts, last = [], None
    for i, c in enumerate(text):
        s = hf_script(c)
        if s is not None and last != s:
            cuts.append(i)           # (a first character of "Any" is not a cut: it is dropped)
        if s is not None:
            last = s
    cuts.append(len(text))
    return [(a, b, False) for a, b in zip(cuts, cuts[1:])]


def _metaspace(spec, where):
    rep = spec.get("replacement", "\u2581")
    scheme = spec.get("prepend_scheme", "always")
    if spec.get("add_prefix_space") is False:
        scheme = "never"
    if scheme not in ("always", "first", "never"):
        _fail(where, f"Metaspace prepend_scheme {scheme!r} is not always, first or never")
    split = spec.get("split", True)

    def run(pieces):
        out = []
        for text, at_start in pieces:
            text = text.replace(" ", rep)
            if not text.startswith(rep) and (scheme == "always" or scheme == "first"
                                             and at_start):
                text = rep + text
            out.append((text, at_start))
        if not split:
            return out
        rep_re = regex.compile(regex.escape(rep))
        return _cut(out, lambda t: regex_spans(rep_re, t), "MergedWithNext")
    return run


def _byte_level(spec):
    def run(pieces):
        if spec.get("add_prefix_space", True):
            pieces = [(t if t.startswith(" ") else " " + t, s) for t, s in pieces]
        if spec.get("use_regex", True):
            pieces = _cut(pieces, lambda t: regex_spans(_GPT2, t), "Isolated")
        return [("".join(_BYTE_CHAR[b] for b in t.encode("utf-8")), s) for t, s in pieces]
    return run


def _split(spec, where):
    behavior = spec.get("behavior")
    if behavior not in BEHAVIORS:
        _fail(where, f"Split behavior {behavior!r} is not one of {BEHAVIORS}")
    compiled = pattern_regex(spec.get("pattern"), f"{where} pre_tokenizer Split")
    invert = bool(spec.get("invert", False))

    def spans(text):
        return [(a, b, m != invert) for a, b, m in regex_spans(compiled, text)]
    return lambda pieces: _cut(pieces, spans, behavior)


def _fixed(length):
    def run(pieces):
        return [(t[i:i + length], s and i == 0) for t, s in pieces
                for i in range(0, len(t), length)]
    return run


def build_pretokenizer(spec, where="tokenizer.json"):
    """The function [(text, at_start)] -> [(pre-token, at_start)] of a tokenizer.json
    pre_tokenizer (None: each piece is one pre-token). An unknown type is an error."""
    if spec is None:
        return lambda pieces: [p for p in pieces if p[0]]
    kind = spec.get("type")
    if kind == "Whitespace":
        return lambda p: _cut(p, lambda t: [(a, b, not m) for a, b, m
                                            in regex_spans(_WORDS, t)], "Removed")
    if kind == "WhitespaceSplit":
        return lambda p: _cut(p, lambda t: regex_spans(_WS, t), "Removed")
    if kind == "BertPreTokenizer":
        return lambda p: _cut(_cut(p, lambda t: regex_spans(_WS, t), "Removed"),
                              lambda t: regex_spans(_PUNCT, t), "Isolated")
    if kind == "Punctuation":
        behavior = spec.get("behavior", "Isolated")
        if behavior not in BEHAVIORS:
            _fail(where, f"Punctuation behavior {behavior!r} is not one of {BEHAVIORS}")
        return lambda p: _cut(p, lambda t: regex_spans(_PUNCT, t), behavior)
    if kind == "Digits":
        behavior = "Isolated" if spec.get("individual_digits", False) else "Contiguous"
        return lambda p: _cut(p, lambda t: regex_spans(_NUMERIC, t), behavior)
    if kind == "CharDelimiterSplit":
        d = regex.compile(regex.escape(spec["delimiter"]))
        return lambda p: _cut(p, lambda t: regex_spans(d, t), "Removed")
    if kind == "UnicodeScripts":
        return lambda p: _cut(p, script_spans, "Isolated")
    if kind == "Metaspace":
        return _metaspace(spec, where)
    if kind == "Split":
        return _split(spec, where)
    if kind == "ByteLevel":
        return _byte_level(spec)
    if kind == "FixedLength":
        return _fixed(int(spec.get("length", 5)))
    if kind == "Sequence":
        steps = [build_pretokenizer(s, where) for s in spec.get("pretokenizers", [])]

        def run(pieces):
            for step in steps:
                pieces = step(pieces)
            return pieces
        return run
    _fail(where, f"{kind!r} is not one of the tokenizers library's (Whitespace, "
                 f"WhitespaceSplit, BertPreTokenizer, Punctuation, Digits, CharDelimiterSplit, "
                 f"UnicodeScripts, Metaspace, Split, ByteLevel, FixedLength, Sequence)")
