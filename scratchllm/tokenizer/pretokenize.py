"""Pre-tokenization: special tokens first, then the GPT-2 (cl100k, o200k, llama3) regex, then
safe chunking.

Byte-level BPE never merges across pre-token boundaries. A text is cut in three stages:

1. special tokens (e.g. "<|endoftext|>") are split out first, longest match first when they
   overlap; they bound documents and never take part in a merge;
2. each piece between special tokens is split into pre-tokens by a regex: GPT-2's
   `'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+`
   ("gpt2"), GPT-4's ("cl100k"), GPT-4o's ("o200k"), Llama-3's ("llama3") or any custom
   pattern;
3. BPE merges bytes inside each pre-token (train.py learns the merges, tokenizer.py applies).

Big inputs are processed in chunks. A cut is *safe* when it gives the same pre-tokens as the
uncut text: right before a special token, or (built-in patterns only) right after a "\\n" that
follows a non-space character and precedes a non-space character other than "/" (no built-in
pre-token can cross it, and both halves tokenize the "\\n" alone or glued to the punctuation
before it, as the whole does; o200k's punctuation runs take [\\r\\n/]*, hence the "/").

Glossary: piece = text between special tokens; pre-token = one regex match; chunk = a run of
whole pieces/pre-tokens small enough to hand to one worker.
"""
import itertools
from collections import deque

import regex

PATTERNS = {
    "gpt2": r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "cl100k": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++"""
              r"""[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+""",
    "o200k": "|".join([
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"""
        r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""",
        r"""\s+"""]),
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
              r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}
CHUNK_CHARS = 1 << 20           # characters per chunk handed to one worker
_SAFE_CUT = regex.compile(r"(?<=\S\n)(?=[^\s/])")


def pattern_string(pattern):
    """The regex source for a built-in pattern name (PATTERNS) or a custom pattern string."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"pattern must be one of {sorted(PATTERNS)} or a regex string, got "
                         f"{pattern!r}")
    return PATTERNS.get(pattern, pattern)


def compile_pattern(pattern):
    """Compile a pre-tokenizer pattern, with a clear error for a broken custom regex and for
    one that matches the empty string (its findall would yield empty pre-tokens)."""
    try:
        compiled = regex.compile(pattern_string(pattern))
    except regex.error as err:
        raise ValueError(f"pattern {pattern!r} is not a valid regex: {err}") from None
    if compiled.fullmatch("") is not None:
        raise ValueError(f"pattern {pattern!r} matches the empty string; a pre-tokenizer "
                         f"pattern must match at least one character (use + rather than *)")
    return compiled


def covering_pretokens(compiled, text, fn="encode"):
    """The pattern's matches in `text`, which must cover it: their concatenation is the text
    (a pattern that skips characters would drop them from the encoding silently)."""
    pieces = compiled.findall(text)
    if "".join(pieces) != text:
        pos = next((i for i, (a, b) in enumerate(zip("".join(pieces), text)) if a != b),
                   len("".join(pieces)))
        raise ValueError(f"{fn}: pattern {compiled.pattern!r} does not cover the text: "
                         f"character {pos} ({text[pos]!r}) is in no pre-token; a custom "
                         f"pattern must match every character")
    return pieces


def special_regex(special_tokens):
    """A regex matching any special token, longest first (so overlapping ones match longest)."""
    if not special_tokens:
        return None
    toks = sorted(set(special_tokens), key=lambda s: (-len(s), s))
    return regex.compile("|".join(regex.escape(t) for t in toks))


def split_special(text, special_re):
    """Yield (is_special, string) pieces of `text` in order; empty pieces are skipped."""
    if special_re is None:
        if text:
            yield False, text
        return
    pos = 0
    for m in special_re.finditer(text):
        if m.start() > pos:
            yield False, text[pos:m.start()]
        yield True, m.group()
        pos = m.end()
    if pos < len(text):
        yield False, text[pos:]


def clean_surrogates(text):
    """Replace lone surrogates by U+FFFD (as tiktoken does) so the text encodes to UTF-8."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def safe_cut(buf, special_re, max_special, builtin):
    """The largest position p > 0 where buf[:p] / buf[p:] tokenize as the whole does, or 0.

    Candidates: the start of the last special token in buf; after it, the last "\\S\\n|[^\\s/]"
    boundary (built-in patterns) that no special token still arriving could straddle.
    """
    best, after = 0, 0
    if special_re is not None:
        for m in special_re.finditer(buf):
            best, after = m.start(), m.end()
    if builtin:
        limit = len(buf) - max(max_special - 1, 0)
        start = max(after, limit - (1 << 16))
        for m in _SAFE_CUT.finditer(buf, start, max(start, limit)):
            best = max(best, m.start())
    return best


def iter_chunks(pieces, special_tokens, pattern, chunk_chars=None):
    """Re-cut an iterable of str (file lines, blocks, documents...) into safe chunks.

    The chunks concatenate to the input and each tokenizes exactly as it does inside the whole
    text, so chunks can be pre-tokenized independently (memory stays bounded by one chunk plus
    the carry-over when no safe cut exists, e.g. a custom pattern and no special tokens).
    """
    chunk_chars = chunk_chars or CHUNK_CHARS
    special_re = special_regex(special_tokens)
    max_special = max((len(t) for t in special_tokens), default=0)
    builtin = pattern in PATTERNS
    parts, size, need = [], 0, chunk_chars
    for piece in pieces:
        parts.append(piece)
        size += len(piece)
        if size < need:
            continue
        buf, cut = "".join(parts), 1
        while len(buf) >= chunk_chars and cut:
            cut = (safe_cut(buf[:chunk_chars], special_re, max_special, builtin)
                   or safe_cut(buf, special_re, max_special, builtin))
            if cut:
                yield buf[:cut]
                buf = buf[cut:]
        parts, size = [buf], len(buf)
        need = chunk_chars if cut else size + chunk_chars
    if size:
        yield "".join(parts)


def read_blocks(path, block_chars=1 << 20):
    """Yield the text of a UTF-8 file in blocks (newlines kept as they are: no translation)."""
    with open(path, encoding="utf-8", newline="") as fh:
        while True:
            try:
                block = fh.read(block_chars)
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: not valid UTF-8 text ({e})") from None
            if not block:
                return
            yield block


def several(chunks):
    """(iterator over the same chunks, True when there are at least two: worth a pool)."""
    chunks = iter(chunks)
    head = list(itertools.islice(chunks, 2))
    return itertools.chain(head, chunks), len(head) == 2


def bounded_map(pool, fn, items, window):
    """Ordered pool.map over a lazy iterable with at most `window` chunks in flight (Pool.imap
    would read the whole input ahead into its task queue)."""
    pending = deque()
    for item in items:
        pending.append(pool.apply_async(fn, (item,)))
        if len(pending) >= window:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()
