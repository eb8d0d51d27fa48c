"""Tokenizer files: GPT-2's vocab.json + merges.txt, our own text format, tiktoken's format.

GPT-2 stores byte strings as printable unicode: `bytes_to_unicode()` maps each of the 256
bytes to one character (printable ASCII and Latin-1 map to themselves, the other 68 bytes to
U+0100...U+0143), so "Ġworld" is b" world". Our format reuses that spelling.

Our format (`.save` / `.load`, UTF-8 text, one record per line, round-trips exactly):

    scratchllm-bpe 1
    pattern "<the pre-tokenizer regex, as a JSON string>"
    specials K
    <id> "<special token, as a JSON string>"          (K lines)
    vocab N
    <id> <token bytes, GPT-2 spelling>                 (N lines, specials excluded)
    merges M
    <a> <b>                                            (M lines in rank order, GPT-2 spelling)

tiktoken's `.tiktoken` format: "<base64 of the token bytes> <rank>" per line; the ranks are
our ids (merge order for a trained tokenizer), special tokens are not in the file.
Every reader raises ValueError naming the file and the line of the first bad record.
"""
import base64
import json
from collections import Counter

from scratchllm.core.atomic import write_text

from .pretokenize import PATTERNS


def bytes_to_unicode():
    """GPT-2's map byte -> printable character (dict[int, str], 256 entries)."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
            + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


_B2U = bytes_to_unicode()
_U2B = {c: b for b, c in _B2U.items()}


def to_printable(token):
    """bytes -> GPT-2 spelling, e.g. b" world" -> "Ġworld"."""
    return "".join(_B2U[b] for b in token)


def from_printable(text, where):
    """GPT-2 spelling -> bytes; `where` ("file line N") names the record in errors."""
    try:
        return bytes(_U2B[c] for c in text)
    except KeyError as err:
        raise ValueError(f"{where}: {text!r} has character {err.args[0]!r}, which is not in "
                         "GPT-2's byte-to-unicode alphabet") from None


def read_utf8(path):
    """A file's text; invalid UTF-8 is a ValueError naming the file, line and byte."""
    data = open(path, "rb").read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise ValueError(f"{path} line {line}: invalid UTF-8 (byte {data[err.start]:#04x} at "
                         f"offset {err.start})") from None


def _utf8_line(raw, path, lineno):
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} line {lineno}: invalid UTF-8 (byte {raw[err.start]:#04x} "
                         f"at column {err.start + 1})") from None


def read_gpt2_vocab(path):
    """vocab.json -> dict[str, int] (GPT-2 spelling -> id), with file/line in every error."""
    text = read_utf8(path)
    try:
        table = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} line {err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(table, dict):
        raise ValueError(f"{path} line 1: expected a JSON object token -> id")
    seen = {}
    for tok, idx in table.items():
        line = None if isinstance(idx, int) and idx >= 0 and idx not in seen else (
            text[:max(text.find(json.dumps(tok)), 0)].count("\n") + 1)
        if not isinstance(idx, int) or idx < 0:
            raise ValueError(f"{path} line {line}: id of {tok!r} must be an integer >= 0, "
                             f"got {idx!r}")
        if idx in seen:
            raise ValueError(f"{path} line {line}: id {idx} used twice "
                             f"({seen[idx]!r} and {tok!r})")
        seen[idx] = tok
    return table


def read_gpt2_merges(path):
    """merges.txt -> list of (bytes, bytes), with or without the '#version' first line."""
    merges = []
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            line = _utf8_line(raw, path, lineno).rstrip("\r\n")
            if not line or (lineno == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2 or not all(parts):
                raise ValueError(f"{path} line {lineno}: expected two tokens separated by one "
                                 f"space, got {line!r}")
            where = f"{path} line {lineno}"
            merges.append((from_printable(parts[0], where), from_printable(parts[1], where)))
    return merges


def write_bpe(path, vocab, merges, specials, pattern):
    """Write our format. vocab: id -> bytes (specials excluded); specials: str -> id."""
    lines = ["scratchllm-bpe 1", "pattern " + json.dumps(pattern), f"specials {len(specials)}"]
    lines += [f"{idx} {json.dumps(tok)}" for tok, idx in specials.items()]
    lines.append(f"vocab {len(vocab)}")
    lines += [f"{idx} {to_printable(tok)}" for idx, tok in sorted(vocab.items())]
    lines.append(f"merges {len(merges)}")
    lines += [f"{to_printable(a)} {to_printable(b)}" for a, b in merges]
    write_text(path, "\n".join(lines) + "\n")


def read_bpe(path, allow_pattern=None):
    """Read our format -> (vocab, merges, specials, pattern); errors name file and line.
    Everything a file can say is checked (check_bpe_file): truncation, ids, the pattern (a
    custom one loads only when the caller names it: allow_pattern)."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().split("\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid UTF-8 text ({e})") from None
    pos = 0

    def take(prefix):
        nonlocal pos
        line = lines[pos] if pos < len(lines) else "<end of file>"
        pos += 1
        if not line.startswith(prefix + " "):
            raise ValueError(f"{path} line {pos}: expected '{prefix} ...', got {line!r}")
        return line[len(prefix) + 1:], f"{path} line {pos}"

    def records(prefix):
        value, where = take(prefix)
        if not value.isdigit():
            raise ValueError(f"{where}: expected a count after '{prefix}', got {value!r}")
        if pos + int(value) > len(lines):
            raise ValueError(f"{where}: the file is truncated: '{prefix} {value}' promises "
                             f"{value} records, {len(lines) - pos} lines follow")
        return [(lines[pos + i] if pos + i < len(lines) else "", f"{path} line {pos + i + 1}")
                for i in range(int(value))]

    version, where = take("scratchllm-bpe")
    if version != "1":
        raise ValueError(f"{where}: unsupported format version {version!r}")
    try:
        value, where = take("pattern")
        pattern = json.loads(value)
        specials = {}
        found = records("specials")
        for line, where in found:
            idx, tok = line.split(" ", 1)
            if json.loads(tok) in specials:
                raise ValueError(f"{where}: special token {json.loads(tok)!r} listed twice")
            specials[json.loads(tok)] = int(idx)
        pos += len(found)
        vocab = {}
        found = records("vocab")
        for line, where in found:
            idx, tok = line.split(" ")
            if int(idx) in vocab:
                raise ValueError(f"{where}: id {idx} used twice")
            vocab[int(idx)] = from_printable(tok, where)
        pos += len(found)
        merges = []
        for line, where in records("merges"):
            a, b = line.split(" ")
            merges.append((from_printable(a, where), from_printable(b, where)))
    except (ValueError, json.JSONDecodeError) as err:
        if str(err).startswith(str(path)):
            raise
        raise ValueError(f"{where}: malformed record {lines[int(where.split()[-1]) - 1]!r} "
                         f"({err})") from None
    check_bpe_file(path, vocab, specials, pattern, allow_pattern)
    return vocab, merges, specials, pattern


SAFE_PATTERNS = ("gpt2", "cl100k")  # a file may name only these (or give their exact source)


def check_bpe_file(path, vocab, specials, pattern, allow_pattern=None):
    """What a tokenizer file may say: ids in [0, 2^31) used once across vocab and specials,
    non-empty special tokens, and a pattern from SAFE_PATTERNS: a regex from a file could
    backtrack catastrophically ((a|a)+$) or silently drop text it does not match ([a-z]+);
    a custom pattern is trusted only when the code names it (allow_pattern=the same string)."""
    safe = pattern in SAFE_PATTERNS or pattern in [PATTERNS[p] for p in SAFE_PATTERNS]
    if not safe and pattern != allow_pattern:
        raise ValueError(f"{path}: pattern {pattern!r} is not one of the known safe patterns "
                         f"{list(SAFE_PATTERNS)}; to trust it, load with allow_pattern=it")
    ids = list(vocab) + list(specials.values())
    bad = [i for i in ids if not 0 <= i < 1 << 31]
    if bad:
        raise ValueError(f"{path}: id {bad[0]} is outside [0, 2^31)")
    if len(set(ids)) < len(ids):
        dup = next(i for i, n in Counter(ids).items() if n > 1)
        raise ValueError(f"{path}: id {dup} is used twice (vocab and special tokens share "
                         f"one id space)")
    if any(not tok for tok in specials):
        raise ValueError(f"{path}: an empty special token (it would match everywhere)")


def write_tiktoken(path, vocab):
    """tiktoken's format: '<base64 token> <rank>' per line, ranks = our ids (no specials)."""
    write_text(path, "".join(f"{base64.b64encode(tok).decode('ascii')} {idx}\n"
                             for idx, tok in sorted(vocab.items())))
