"""Hugging Face `tokenizers` decoders (huggingface/tokenizers tokenizers/src/decoders/*.rs):
the token strings of ids -> text. Each decoder maps the list of token strings to a new list;
decode joins the last list. The kinds:

    ByteLevel    printable characters -> bytes -> UTF-8 (invalid bytes as U+FFFD), one string
    Metaspace    replacement -> " ", in the first token -> "" (unless prepend_scheme
                 "never"; as metaspace.rs does, every replacement of that token goes)
    WordPiece    a token after the first loses its prefix ("##") or gets a " " before it;
                 cleanup joins " ." " ?" " !" " ," " ' " " n't" " 'm" " 's" " 've" " 're"
                 and turns " do not" into " don't"
    BPEDecoder   the suffix -> " " (-> "" in the last token)
    Replace      pattern -> content in each token
    ByteFallback runs of <0xNN> tokens -> their UTF-8 text (one U+FFFD per byte if invalid)
    Fuse         all tokens -> one
    Strip        up to `start` leading and `stop` trailing `content` characters removed
    CTC          repeats collapsed, pad removed, (cleanup) WordPiece's cleanup and the word
                 delimiter -> " "
    Sequence     each in turn
"""
import itertools

from .gpt2 import bytes_to_unicode
from .hf_normalizers import pattern_regex

_CHAR_BYTE = {c: b for b, c in bytes_to_unicode().items()}
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"),
            (" 're", "'re"))


def cleanup(text):
    """WordPiece's clean-up of spaces before punctuation and contractions."""
    for a, b in _CLEANUP:
        text = text.replace(a, b)
    return text


def _byte_level(tokens):
    """A token with a character outside GPT-2's alphabet (an added token) is its own UTF-8."""
    data = b"".join(bytes(_CHAR_BYTE[c] for c in t) if all(c in _CHAR_BYTE for c in t)
                    else t.encode("utf-8") for t in tokens)
    return [data.decode("utf-8", "replace")]


def _byte_fallback(tokens):
    out, run = [], []

    def flush():
        if run:
            try:
                out.append(bytes(run).decode("utf-8"))
            except UnicodeDecodeError:
                out.extend("\ufffd" * len(run))
            run.clear()
    for t in tokens:
        if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            try:
                run.append(int(t[3:5], 16))
                continue
            except ValueError:
                pass
        flush()
        out.append(t)
    flush()
    return out


def _metaspace(spec):
    rep = spec.get("replacement", "\u2581")
    scheme = "never" if spec.get("add_prefix_space") is False else \
        spec.get("prepend_scheme", "always")

    def run(tokens):
        return [t.replace(rep, "" if i == 0 and scheme != "never" else " ")
                for i, t in enumerate(tokens)]
    return run


def _wordpiece(spec):
    prefix, clean = spec.get("prefix", "##"), spec.get("cleanup", True)

    def run(tokens):
        out = []
        for i, t in enumerate(tokens):
            if i:
                t = t[len(prefix):] if t.startswith(prefix) else " " + t
            out.append(cleanup(t) if clean else t)
        return out
    return run


def _strip(spec):
    content, start, stop = spec["content"], int(spec.get("start", 0)), int(spec.get("stop", 0))

    def one(t):
        a = 0
        while a < min(start, len(t)) and t[a] == content:
            a += 1
        b = len(t)
        for _ in range(stop):
            if b > a and t[b - 1] == content:
                b -= 1
            else:
                break
        return t[a:b]
    return lambda tokens: [one(t) for t in tokens]


def _ctc(spec):
    pad, delim = spec.get("pad_token", "<pad>"), spec.get("word_delimiter_token", "|")
    clean = spec.get("cleanup", True)

    def run(tokens):
        out = []
        for t, _ in itertools.groupby(tokens):
            t = t.replace(pad, "")
            if clean:
                t = cleanup(t).replace(delim, " ")
            if t:
                out.append(t)
        return out
    return run


def build_decoder(spec, where="tokenizer.json"):
    """The function [token string] -> [string] of a tokenizer.json decoder (None: tokens
    joined with " ", as `tokenizers` does without a decoder)."""
    if spec is None:
        return lambda tokens: [" ".join(tokens)]
    kind = spec.get("type")
    if kind == "ByteLevel":
        return _byte_level
    if kind == "Metaspace":
        return _metaspace(spec)
    if kind == "WordPiece":
        return _wordpiece(spec)
    if kind == "BPEDecoder":
        suffix = spec.get("suffix", "</w>")
        return lambda tokens: [t.replace(suffix, "" if i == len(tokens) - 1 else " ")
                               for i, t in enumerate(tokens)]
    if kind == "Replace":
        compiled, content = pattern_regex(spec.get("pattern"), f"{where} decoder Replace"), \
            spec.get("content", "")
        return lambda tokens: [compiled.sub(lambda _: content, t) for t in tokens]
    if kind == "ByteFallback":
        return _byte_fallback
    if kind == "Fuse":
        return lambda tokens: ["".join(tokens)]
    if kind == "Strip":
        return _strip(spec)
    if kind == "CTC":
        return _ctc(spec)
    if kind == "Sequence":
        steps = [build_decoder(s, where) for s in spec.get("decoders", [])]

        def run(tokens):
            for step in steps:
                tokens = step(tokens)
            return tokens
        return run
    raise ValueError(f"{where}: decoder {kind!r} is not one of the tokenizers library's "
                     f"(ByteLevel, Metaspace, WordPiece, BPEDecoder, Replace, ByteFallback, "
                     f"Fuse, Strip, CTC, Sequence)")
