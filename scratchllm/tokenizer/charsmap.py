"""SentencePiece's precompiled normalisation rules (normalizer_spec.precompiled_charsmap of a
.model file: the "nmt_nfkc", "nfkc", "nmt_nfkc_cf", ... rules), applied as SentencePiece's
normalizer does (google/sentencepiece src/normalizer.cc).

The blob: a little-endian uint32 n, then n bytes of a Darts double-array trie (uint32 units)
over UTF-8 byte strings, then the replacement strings, each NUL-terminated. A trie unit u has
    has_leaf = (u >> 8) & 1,  value = u & (2^31 - 1),  label = u & (2^31 | 0xFF),
    offset = (u >> 10) << ((u & 2^9) >> 6),
and a common-prefix search from node 0 walks node ^= offset(u); node ^= byte; check label ==
byte; node ^= offset; a leaf there gives a match (value = offset of its replacement).

Normalising: at each position the longest rule that matches the remaining bytes replaces them;
without a match one UTF-8 character is copied (an invalid byte becomes U+FFFD). With
remove_extra_whitespaces, leading spaces (after replacement) are skipped, a space after a
space is dropped; add_dummy_prefix puts a space first; every space becomes "▁"; then (with
remove_extra_whitespaces) trailing "▁" are removed, a "▁" of the text itself too.
HF tokenizers' Precompiled normaliser uses the same blob differently (normalize_hf).
"""
import numpy as np
import regex

SPACE = "\u2581"          # "▁", SentencePiece's visible space


class CharsMap:
    """The rules of one precompiled_charsmap blob (bytes); hf=True applies them as HF
    tokenizers' Precompiled normaliser does (normalize_hf)."""

    def __init__(self, blob, hf=False):
        self.hf, self.blob = hf, bytes(blob)
        blob = self.blob
        if len(blob) < 4 or int.from_bytes(blob[:4], "little") + 4 > len(blob):
            raise ValueError(f"CharsMap: a precompiled_charsmap of {len(blob)} bytes is "
                             f"truncated (expected a uint32 trie size and the trie)")
        size = int.from_bytes(blob[:4], "little")
        self.units = np.frombuffer(blob[4:4 + size], dtype="<u4").tolist()
        self.strings = blob[4 + size:]

    def _matches(self, data, i):
        """[(length, replacement bytes)] of every rule that is a prefix of data[i:], shortest
        first (the double array's common-prefix search)."""
        units, node, out = self.units, 0, []
        node ^= _offset(units[0])
        for k in range(i, len(data)):
            node ^= data[k]
            u = units[node] if node < len(units) else 0
            if u & 0x800000FF != data[k]:
                break
            node ^= _offset(u)
            if (u >> 8) & 1:
                value = units[node] & 0x7FFFFFFF
                out.append((k + 1 - i, self.strings[value:self.strings.index(b"\0", value)]))
        return out

    def _longest(self, data, i):
        """(length, replacement bytes) of the longest rule matching data[i:], or (0, None)."""
        return (self._matches(data, i) or [(0, None)])[-1]

    def normalize_hf(self, text):
        """HF tokenizers' Precompiled (huggingface/spm_precompiled src/lib.rs): per grapheme
        cluster of fewer than 6 UTF-8 bytes, the shortest rule that is a prefix of it
        replaces the whole cluster; otherwise each character is replaced by the shortest
        rule that is a prefix of it, or kept. Spaces are left as they are. (Each distinct
        cluster's result is remembered: texts repeat few of them.)"""
        memo = self.__dict__.setdefault("_hf_memo", {})
        out = []
        for g in regex.findall(r"\X", text):
            hit = memo.get(g)
            if hit is None:
                hit = memo[g] = self._grapheme_hf(g)
            out.append(hit)
        return "".join(out)

    def _grapheme_hf(self, g):
        data = g.encode("utf-8", "surrogatepass")
        found = self._matches(data, 0) if len(data) < 6 else []
        if found:
            return found[0][1].decode("utf-8")
        out = []
        for c in g:
            found = self._matches(c.encode("utf-8", "surrogatepass"), 0)
            out.append(found[0][1].decode("utf-8") if found else c)
        return "".join(out)

    def prefix(self, data, i):
        """(normalised bytes, bytes consumed) at data[i:] (SentencePiece's NormalizePrefix)."""
        length, out = self._longest(data, i)
        if length:
            return out, length
        n = _utf8_length(data, i)
        return (data[i:i + n], n) if n else ("\ufffd".encode(), 1)

    def normalize(self, text, add_dummy_prefix=True, remove_extra_whitespaces=True):
        """SentencePiece's normal form of text (spaces as ▁)."""
        data, i, out = text.encode("utf-8", "surrogatepass"), 0, bytearray()
        while remove_extra_whitespaces and i < len(data):
            piece, n = self.prefix(data, i)
            if piece != b" ":
                break
            i += n
        if i == len(data):
            return ""
        if add_dummy_prefix:
            out += b" "
        prev_space = remove_extra_whitespaces
        while i < len(data):
            piece, n = self.prefix(data, i)
            if prev_space:
                piece = piece.lstrip(b" ")
            if piece:
                out += piece
                prev_space = piece.endswith(b" ")
            i += n
            prev_space = prev_space and remove_extra_whitespaces
        out = out.decode("utf-8").replace(" ", SPACE)
        return out.rstrip(SPACE) if remove_extra_whitespaces else out


def _offset(u):
    return (u >> 10) << ((u & (1 << 9)) >> 6)


def _utf8_length(data, i):
    """Bytes of the valid UTF-8 character at data[i], or 0 if it is not one."""
    b = data[i]
    n = 1 if b < 0x80 else 2 if 0xC2 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else \
        4 if 0xF0 <= b < 0xF5 else 0
    if n == 0 or i + n > len(data):
        return 0
    try:
        data[i:i + n].decode("utf-8")
    except UnicodeDecodeError:
        return 0
    return n
