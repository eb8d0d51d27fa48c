"""Training SentencePiece's BPE model (google/sentencepiece src/bpe_model_trainer.cc and
trainer_interface.cc, model_type=bpe), step for step, so the pieces equal its trainer's.

    1. sentences: each input line (empty lines, lines over 4192 bytes and lines holding "▅"
       skipped), normalised (normalizer.py: ▁ for spaces, dummy prefix, whitespace clean-up);
       the special pieces' strings become a boundary that no piece crosses (sentencepiece
       0.2.3 counts a tab as an ordinary character, as here);
    2. characters: counted over the sentences; the most frequent ones (ties: smaller code
       point) are kept until character_coverage of all occurrences is reached; every other
       character becomes "▅" (unknown), which joins no piece;
    3. words: each sentence cut before every ▁; words counted;
    4. merges: every adjacent pair of symbols in every word is a candidate; the candidate of
       highest frequency (counting each position, weighted by the word's count) wins, ties
       to the shorter piece, then the smaller string; its positions merge left to right,
       and the pairs around them are recounted. A pair is never formed when the piece would
       be invalid: longer than max_piece_length characters, ▁ anywhere but at its start, or
       two Unicode scripts (Hiragana and Katakana count as Han; Inherited marks take the
       script before them; digits are their own Common script). A piece whose string an
       earlier merge already made (the same string reached through another split) is
       dropped without merging its positions, as SentencePiece does.
       Like SentencePiece, only the max(1000, 5% of all symbols) most frequent pairs are
       candidates, refreshed every 100 pieces (pairs created by a merge join at once).
    5. vocabulary: <unk>, <s>, </s>, the special tokens, the 256 <0xNN> pieces (byte
       fallback), then the merged pieces with score -rank, then the kept characters (most
       frequent first) continuing the scores.

Where it can differ from sentencepiece: ties that its hash-ordered containers break
arbitrarily (two different symbols of one string and one frequency; pairs of equal frequency
at the edge of the candidate set, which we break by length and string), and characters whose
Unicode script Python's `regex` tables and SentencePiece's own table disagree on. On the test
corpora the pieces, scores and ids are equal.
"""
import os

import regex

from .charsmap import SPACE
from .hf_pretokenizers import unicode_script
from .normalizer import Normalizer
from .spm_bpe import SentencePieceBPE

UNK_CHAR, BOUNDARY = "\u2585", "\U000f0002"   # a special piece's string becomes BOUNDARY
MAX_SENTENCE_BYTES = 4192


class _Symbol:
    __slots__ = ("text", "left", "right", "freq", "positions", "unk")

    def __init__(self, text, left=None, right=None, freq=0, unk=False):
        self.text, self.left, self.right, self.freq, self.unk = text, left, right, freq, unk
        self.positions = set()


def _script(c):
    """SentencePiece's script of a character for piece validity: Hiragana, Katakana and
    U+30FC count as Han."""
    s = unicode_script(c)
    return "Han" if s in ("Hiragana", "Katakana") or c == "\u30fc" else s


def valid_piece(piece, max_len):
    """SentencePiece's IsValidSentencePiece for a BPE piece (split by whitespace, scripts and
    numbers, no whitespace-only pieces)."""
    if not piece or len(piece) > max_len:
        return False
    prev = None
    for k, c in enumerate(piece):
        if c in (UNK_CHAR, "\0", BOUNDARY, " "):
            return False
        if c == SPACE:
            if k > 0:
                return False
            continue
        s = _script(c)
        if s == "Inherited":
            s = prev
        if s is not None and prev is not None and s != prev:
            return False
        prev = s
    return True


class _Trainer:
    def __init__(self, words, chars, max_len):
        self.words = [[w, n] for w, n in words]        # [word, count]
        self.chars, self.max_len = chars, max_len      # {char: count}
        self.cache = {}                                # key -> _Symbol (chars and pairs)
        self.active = set()
        self.seqs = []

    def char(self, c):
        key = ("c", c)
        if key not in self.cache:
            self.cache[key] = _Symbol(c, freq=self.chars.get(c, 1), unk=c == UNK_CHAR)
        return self.cache[key]

    def pair(self, a, b):
        if a is None or b is None or a.unk or b.unk:
            return None
        key = (id(a), id(b))
        if key not in self.cache:
            if not valid_piece(a.text + b.text, self.max_len):
                return None
            self.cache[key] = _Symbol(a.text + b.text, a, b)
        return self.cache[key]

    def freq(self, s):
        if s.freq > 0:
            return s.freq
        for pos in sorted(s.positions):
            sid, left, right = pos
            if self.seqs[sid][left] is not s.left or self.seqs[sid][right] is not s.right:
                s.positions.discard(pos)
            else:
                s.freq += self.words[sid][1]
        return s.freq

    def add_pair(self, sid, left, right):
        if left < 0 or right < 0:
            return
        s = self.pair(self.seqs[sid][left], self.seqs[sid][right])
        if s is not None:
            self.active.add(s)
            s.positions.add((sid, left, right))

    def reset(self, sid, left, right, best):
        if left < 0 or right < 0:
            return
        s = self.pair(self.seqs[sid][left], self.seqs[sid][right])
        if s is not None and s is not best:
            s.freq = 0

    def refresh(self):
        pairs = [s for s in self.cache.values() if s.left is not None]
        for s in pairs:
            self.freq(s)
        size = min(max(1000, int(len(self.cache) * 0.05)), len(pairs))
        pairs.sort(key=lambda s: (-s.freq, len(s.text), s.text))
        self.active = set(pairs[:size])

    def step(self, seq, i, step):
        j = i + step
        while 0 <= j < len(seq) and seq[j] is None:
            j += step
        return j if 0 <= j < len(seq) else -1

    def train(self, n_pieces):
        self.seqs = [[self.char(c) for c in w] for w, _ in self.words]
        for sid, seq in enumerate(self.seqs):
            for i in range(1, len(seq)):
                self.add_pair(sid, i - 1, i)
        pieces, seen = [], set()
        while len(pieces) < n_pieces:
            if len(pieces) % 100 == 0:
                self.refresh()
            best = min(self.active, key=lambda s: (-self.freq(s), len(s.text), s.text),
                       default=None)
            if best is None:
                break
            key = (id(best.left), id(best.right))
            if best.text in seen:
                self.cache.pop(key, None)
                self.active.discard(best)
                continue
            seen.add(best.text)
            pieces.append(best.text)
            for sid, left, right in sorted(best.positions):
                seq = self.seqs[sid]
                if seq[left] is None:
                    continue
                nxt, prev = self.step(seq, right, 1), self.step(seq, left, -1)
                self.reset(sid, prev, left, best)
                self.reset(sid, right, nxt, best)
                seq[left], seq[right] = best, None
                self.add_pair(sid, prev, left)
                self.add_pair(sid, left, nxt)
            self.cache.pop(key, None)
            self.active.discard(best)
        return pieces


def _lines(input):
    if isinstance(input, (str, os.PathLike)):
        with open(input, encoding="utf-8", newline="") as fh:
            yield from fh.read().split("\n")
    else:
        for text in input:
            yield from text.split("\n")


def _sentences(input, normalizer, metas):
    """{normal form: count} of the usable input lines (step 1)."""
    meta_re = regex.compile("|".join(regex.escape(m) for m in sorted(metas, key=len,
                                                                     reverse=True)))
    out = {}
    for line in _lines(input):
        if not line or len(line.encode("utf-8")) > MAX_SENTENCE_BYTES or UNK_CHAR in line:
            continue
        x = meta_re.sub(BOUNDARY, normalizer.normalize(line))
        if x:
            out[x] = out.get(x, 0) + 1
    return out


def _kept_chars(sentences, coverage):
    """{char: count} of the characters kept (step 2)."""
    counts = {}
    for s, n in sentences.items():
        for c in s:
            if c not in (" ", BOUNDARY):
                counts[c] = counts.get(c, 0) + n
    total, acc, kept = sum(counts.values()), 0, {}
    for c, n in sorted(counts.items(), key=lambda e: (-e[1], e[0])):
        if acc / total >= coverage:
            break
        acc += n
        kept[c] = n
    return kept


def train_sentencepiece_bpe(input, vocab_size, special_tokens=(), *, byte_fallback=False,
                            normalizer=Normalizer(), character_coverage=1.0,
                            max_piece_length=16):
    """A SentencePieceBPE trained as sentencepiece's BPE trainer trains one (see the module
    docstring) on a path or an iterable of str (lines). vocab_size counts every piece; it
    must be reachable (sentencepiece's hard_vocab_limit)."""
    if not 0.98 <= character_coverage <= 1.0:
        raise ValueError(f"train_sentencepiece_bpe: character_coverage must be in [0.98, 1], "
                         f"got {character_coverage}")
    metas = ["<unk>", "<s>", "</s>", *special_tokens]
    metas += [f"<0x{b:02X}>" for b in range(256)] * bool(byte_fallback)
    if len(set(metas)) != len(metas):
        raise ValueError(f"train_sentencepiece_bpe: special_tokens {list(special_tokens)} "
                         f"repeat a piece of {metas[:3]} or each other")
    sentences = _sentences(input, normalizer, metas[:3 + len(special_tokens)])
    if not sentences:
        raise ValueError("train_sentencepiece_bpe: the input holds no usable line")
    chars = _kept_chars(sentences, character_coverage)
    n_merges = vocab_size - len(metas) - len(chars)
    if n_merges < 0:
        raise ValueError(f"train_sentencepiece_bpe: vocab_size {vocab_size} is smaller than "
                         f"the {len(metas)} special pieces + {len(chars)} characters")
    words = {}
    for s, n in sentences.items():
        s = "".join(c if c in chars else UNK_CHAR for c in s)
        for w in regex.split(f"(?={SPACE})", s):
            if w:
                words[w] = words.get(w, 0) + n
    merged = _Trainer(sorted(words.items(), key=lambda e: (-e[1], e[0])), chars,
                      max_piece_length).train(n_merges)
    if len(merged) < n_merges:
        raise ValueError(f"train_sentencepiece_bpe: the corpus gives only {len(merged)} merges; "
                         f"vocab_size can be at most {vocab_size - n_merges + len(merged)}")
    final = merged + [c for c, _ in sorted(chars.items(), key=lambda e: (-e[1], e[0]))]
    pieces = [(m, 0.0) for m in metas] + [(p, -float(k)) for k, p in enumerate(final)]
    tok = SentencePieceBPE(pieces, unk_id=0,
                           special_tokens={m: i for i, m in
                                           enumerate(metas[1:3 + len(special_tokens)], 1)},
                           normalizer=normalizer, byte_fallback=byte_fallback, fuse_unk=True,
                           score_dtype="float32")
    kinds = {0: "unknown", 1: "control", 2: "control"}
    kinds.update({i: "byte" for i in range(3 + len(special_tokens), len(metas))})
    tok.sentencepiece_kinds = kinds
    return tok
