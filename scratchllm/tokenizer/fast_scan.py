"""Numba pre-token scanners for the cl100k (GPT-4), o200k (GPT-4o) and Llama-3 patterns.

`regex` runs these patterns at ~5 MB/s. As fast.py does for GPT-2's pattern, each scanner is
the pattern hand-compiled: at byte offset i it returns the end of the match `regex.findall`
would take there (alternatives tried in order, backtracking worked out below), with the
character classes of every code point computed by `regex` itself (`char_flags`). Twins:
`regex.findall` (tests/tokenizer/test_fast_scan.py, every class and the corpora).

cl100k (openai/tiktoken tiktoken_ext/openai_public.py):
    '(?i:[sdmt]|ll|ve|re) | [^\\r\\n\\p{L}\\p{N}]?+\\p{L}+ | \\p{N}{1,3}
    | ' '?[^\\s\\p{L}\\p{N}]++[\\r\\n]* | \\s*[\\r\\n] | \\s+(?!\\S) | \\s+
Llama-3 (meta-llama/llama3 llama/tokenizer.py) writes the same language without possessives
and with \\s*[\\r\\n]+: the possessive parts can never give back a character that the rest
could use, and \\s*[\\r\\n]+ backtracks to the last newline of the run exactly as \\s*[\\r\\n]
does, so one scanner serves both (the tests check it against both regexes).

o200k, with U = [\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}], W = [\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}],
X = [^\\r\\n\\p{L}\\p{N}], C = (?i:'s|'t|'re|'ve|'m|'ll|'d):
    X?U*W+C? | X?U+W*C? | \\p{N}{1,3} | ' '?[^\\s\\p{L}\\p{N}]+[\\r\\n/]* | \\s*[\\r\\n]+
    | \\s+(?!\\S) | \\s+
U*W+ at s: U* takes the whole U-run s..r, then gives back until W+ can start. W \\ U = Ll,
so W+ starts at r when char r is Ll (then runs over all W), else at the last W character q
inside the run (and ends at q+1, the characters after q being Lu/Lt). X? is greedy: tried
with X first, then without (a mark \\p{M} is both X and U). C? never fails, so it is
taken whenever it matches.

Glossary: flags = uint16 per code point (bits L N S U W below, and one bit per contraction
letter s t m d l v e r, case-folded as `regex` folds them, e.g. U+017F matches s).
"""
import numpy as np
import numba as nb
import regex

from scratchllm.core.compiling import inner_kernel

from .pretokenize import PATTERNS

L, N, S, U, W = 1, 2, 4, 8, 16
_LETTERS = "stmdlver"
LS, LT, LM, LD, LL, LV, LE, LR = (1 << (8 + k) for k in range(8))
GPT2, CL100K, O200K = 0, 1, 2          # scanner kinds (GPT2's scanner is fast.py's)
KIND = {PATTERNS["gpt2"]: GPT2, PATTERNS["cl100k"]: CL100K, PATTERNS["llama3"]: CL100K,
        PATTERNS["o200k"]: O200K}       # pattern string -> scanner
_FLAGS = None


def property_table(props, dtype):
    """(0x110000,) table: value OR-ed into every code point that regex matches, for each
    (value, regex) in props (the `regex` module decides: the scanners agree with it)."""
    codes = np.arange(0x110000, dtype=np.uint32)  # (0x110000,) every code point
    every = codes.tobytes().decode("utf-32-le", "surrogatepass")
    table = np.zeros(0x110000, dtype=dtype)       # (0x110000,)
    for value, prop in props:
        for m in regex.finditer(prop, every):
            table[m.start():m.end()] |= value
    return table


def char_flags():
    """uint16 (0x110000,) flags of every code point, as the `regex` module sees them."""
    global _FLAGS
    if _FLAGS is None:
        props = [(L, r"\p{L}+"), (N, r"\p{N}+"), (S, r"\s+"),
                 (U, r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"), (W, r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]+")]
        props += [(1 << (8 + k), f"(?i:{x})+") for k, x in enumerate(_LETTERS)]
        _FLAGS = property_table(props, np.uint16)
    return _FLAGS


@inner_kernel
def decode_utf8(data, i):
    """(code point, next offset) of the UTF-8 character at byte offset i (valid UTF-8)."""
    b0 = np.int64(data[i])
    if b0 < 0x80:
        return b0, i + 1
    if b0 < 0xE0:
        return ((b0 & 0x1F) << 6) | (data[i + 1] & 0x3F), i + 2
    if b0 < 0xF0:
        return ((b0 & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F), i + 3
    return (((b0 & 0x07) << 18) | ((data[i + 1] & 0x3F) << 12) | ((data[i + 2] & 0x3F) << 6)
            | (data[i + 3] & 0x3F)), i + 4


@inner_kernel
def _span(data, flags, i, n, want, mask):
    """Offset after the run of characters from i with flags & mask == want. (Callers pass
    np.int64 / np.bool_ values, not the constants: a literal argument compiles a callee
    once per value.)"""
    while i < n:
        c, j = decode_utf8(data, i)
        if flags[c] & mask != want:
            return i
        i = j
    return n


@inner_kernel
def _contraction(data, flags, i, n):
    """End of (?i:'s|'t|'re|'ve|'m|'ll|'d) at i, or -1."""
    if i + 1 >= n or data[i] != 39:
        return -1
    c, k = decode_utf8(data, i + 1)
    f = flags[c]
    if f & (LS | LT | LM | LD):
        return k
    if k < n:
        c2, k2 = decode_utf8(data, k)
        g = flags[c2]
        if (f & (LR | LV) and g & LE) or (f & LL and g & LL):
            return k2
    return -1


@inner_kernel
def _digits(data, flags, j, n):
    """End of \\p{N}{1,3} whose first digit ends at j."""
    for _ in range(2):
        if j >= n:
            return j
        c, k = decode_utf8(data, j)
        if not flags[c] & N:
            return j
        j = k
    return j


@inner_kernel
def _punct(data, flags, i, n, slash):
    """End of [^\\s\\p{L}\\p{N}]+ at i, then [\\r\\n]* ([\\r\\n/]* when slash)."""
    e = _span(data, flags, i, n, np.int64(0), np.int64(L | N | S))
    while e < n and (data[e] == 10 or data[e] == 13 or (slash and data[e] == 47)):
        e += 1
    return e


@inner_kernel
def _spaces(data, flags, i, n):
    """\\s*[\\r\\n]+ | \\s+(?!\\S) | \\s+ at the whitespace character at i: up to the run's
    last newline if it has one, else the run (minus its last character if \\S follows)."""
    last, p, nl = i, i, -1
    while p < n:
        c, q = decode_utf8(data, p)
        if not flags[c] & S:
            break
        if c == 10 or c == 13:
            nl = q
        last, p = p, q
    if nl >= 0:
        return nl
    if p == n or last == i:
        return p
    return last


@inner_kernel
def _rest(data, flags, c, f, i, j, n, slash):
    """The alternatives both patterns end with, at character c (flags f, next offset j):
    \\p{N}{1,3} | ' '?[^\\s\\p{L}\\p{N}]+[\\r\\n]* (or [\\r\\n/]* when slash) | whitespace."""
    if f & N:
        return _digits(data, flags, j, n)
    if c == 32 and j < n:                                      # ' ' punct+ newlines
        c2, _ = decode_utf8(data, j)
        if not flags[c2] & (L | N | S):
            return _punct(data, flags, j, n, slash)
    if not f & (L | N | S):
        return _punct(data, flags, i, n, slash)
    return _spaces(data, flags, i, n)


@inner_kernel
def _next_cl100k(data, flags, i, n):
    c, j = decode_utf8(data, i)
    f = flags[c]
    if c == 39:
        e = _contraction(data, flags, i, n)
        if e >= 0:
            return e
    if f & L:                                                   # \p{L}+
        return _span(data, flags, j, n, np.int64(L), np.int64(L))
    if not f & N and c != 10 and c != 13 and j < n:            # X \p{L}+
        c2, k = decode_utf8(data, j)
        if flags[c2] & L:
            return _span(data, flags, k, n, np.int64(L), np.int64(L))
    return _rest(data, flags, c, f, i, j, n, np.bool_(False))


@inner_kernel
def _upper_lower(data, flags, s, n):
    """End of U*W+ at s, or -1."""
    p, after_w = s, -1
    while p < n:
        c, q = decode_utf8(data, p)
        if not flags[c] & U:
            break
        if flags[c] & W:
            after_w = q
        p = q
    if p < n:
        c, q = decode_utf8(data, p)
        if flags[c] & W:                                  # an Ll right after the U-run
            return _span(data, flags, q, n, np.int64(W), np.int64(W))
    return after_w


@inner_kernel
def _upper(data, flags, s, n):
    """End of U+W* at s, or -1."""
    p = _span(data, flags, s, n, np.int64(U), np.int64(U))
    return -1 if p == s else _span(data, flags, p, n, np.int64(W), np.int64(W))


@inner_kernel
def _next_o200k(data, flags, i, n):
    c, j = decode_utf8(data, i)
    f = flags[c]
    x = not f & (L | N) and c != 10 and c != 13 and j < n     # X? can take c
    e = _upper_lower(data, flags, j, n) if x else -1
    if e < 0:
        e = _upper_lower(data, flags, i, n)
    if e < 0 and x:
        e = _upper(data, flags, j, n)
    if e < 0:
        e = _upper(data, flags, i, n)
    if e >= 0:
        k = _contraction(data, flags, e, n)
        return k if k >= 0 else e
    return _rest(data, flags, c, f, i, j, n, np.bool_(True))


def scan(kind, data, flags, seg_ends):
    """int64 (T,) end offsets of all pre-tokens of kind CL100K/O200K; each segment is
    scanned as its own string. A kernel per kind: one kernel for both compiled both
    scanners for a runtime kind (5.2 CPU s cold), where a cl100k scan needs one."""
    return (_scan_o200k if kind == O200K else _scan_cl100k)(data, flags, seg_ends)


@nb.njit(cache=True)
def _scan_cl100k(data, flags, seg_ends):
    ends = np.empty(data.shape[0], dtype=np.int64)  # (N,) upper bound: one per byte
    t, i = np.int64(0), np.int64(0)  # int64 from the start: one typing of the callee
    for n in seg_ends:
        while i < n:
            i = _next_cl100k(data, flags, i, n)
            ends[t] = i
            t += 1
    return ends[:t]


@nb.njit(cache=True)
def _scan_o200k(data, flags, seg_ends):
    """_scan_cl100k with the o200k scanner."""
    ends = np.empty(data.shape[0], dtype=np.int64)  # (N,)
    t, i = np.int64(0), np.int64(0)
    for n in seg_ends:
        while i < n:
            i = _next_o200k(data, flags, i, n)
            ends[t] = i
            t += 1
    return ends[:t]
