"""Hugging Face `tokenizers` models over pre-tokens (huggingface/tokenizers
tokenizers/src/models/{bpe,wordpiece,wordlevel,unigram}): each maps one pre-token to ids.

    BPE        the pre-token's characters (continuing_subword_prefix on all but the first,
               end_of_word_suffix on the last) become ids; a character not in the vocab
               becomes its <0xNN> byte pieces (byte_fallback), else the unknown id (a run of
               them one id with fuse_unk), else is dropped (no unk_token). Then the adjacent
               pair of lowest merge rank merges, leftmost first, until none has a rank.
               ignore_merges: a pre-token that is itself in the vocab is that one id.
    WordPiece  greedy longest match first: the longest vocab entry that prefixes the rest
               (spelled with "##" after the first piece); a pre-token with no such cover, or
               longer than max_input_chars_per_word characters, is one [UNK].
    WordLevel  the vocab id of the whole pre-token, else the unknown id.
    Unigram    the Viterbi segmentation of unigram.Unigram (fused unknowns, byte fallback).
One difference from `tokenizers`, on purpose: a model never gives the id of a special added
token (`special` ids), so text cannot forge one even where a special token's string is also a
vocabulary entry (`tokenizers` with encode_special_tokens=True lets its Unigram and WordLevel
models match "[CLS]" as a piece); the library's encode_ordinary promises no special id.
"""
from .normalizer import Normalizer
from .unigram import Unigram


def _fail(where, msg):
    raise ValueError(f"{where}: model {msg}")


class BPEModel:
    """HF's BPE model on pre-tokens (see the module docstring); vocab {token: id}, merges
    [(a, b)] in rank order."""

    def __init__(self, spec, where, special_ids=()):
        if spec.get("dropout"):
            _fail(where, f"BPE dropout {spec['dropout']} is not implemented (sampling "
                         f"segmentations; set it to null)")
        self.vocab = dict(spec["vocab"])
        self._symbol = {t: i for t, i in self.vocab.items() if i not in set(special_ids)}
        self.prefix = spec.get("continuing_subword_prefix") or ""
        self.suffix = spec.get("end_of_word_suffix") or ""
        self.unk = spec.get("unk_token")
        self.fuse_unk, self.byte_fallback = bool(spec.get("fuse_unk")), \
            bool(spec.get("byte_fallback"))
        self.ignore_merges = bool(spec.get("ignore_merges"))
        self.ranks = {}
        for r, m in enumerate(spec.get("merges", [])):
            a, b = m.split(" ") if isinstance(m, str) else m
            new = a + b[len(self.prefix):]
            for tok in (a, b, new):
                if tok not in self.vocab:
                    _fail(where, f"BPE merge {r} ({a!r}, {b!r}): {tok!r} is not in the vocab")
            self.ranks.setdefault((self.vocab[a], self.vocab[b]), (r, self.vocab[new]))
        if self.unk is not None and self.unk not in self.vocab:
            _fail(where, f"BPE unk_token {self.unk!r} is not in the vocab")
        self._cache = {}

    def _symbols(self, word):
        ids, unk = [], None
        for k, c in enumerate(word):
            s = (self.prefix if k else "") + c + (self.suffix if k == len(word) - 1 else "")
            if s in self._symbol:
                if unk is not None:
                    ids.append(unk)
                    unk = None
                ids.append(self._symbol[s])
                continue
            if self.byte_fallback:
                codes = [f"<0x{b:02X}>" for b in s.encode("utf-8")]
                if all(t in self.vocab for t in codes):
                    ids += [self.vocab[t] for t in codes]
                    continue
            if self.unk is not None:
                if unk is not None and not self.fuse_unk:
                    ids.append(unk)
                unk = self.vocab[self.unk]
        return ids + ([unk] if unk is not None else [])

    def tokenize(self, word):
        """The ids of one pre-token."""
        if not word:
            return []
        if self.ignore_merges and word in self._symbol:
            return [self._symbol[word]]
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        ids = self._symbols(word)
        while len(ids) > 1:
            best = min(((self.ranks[p][0], i) for i, p in enumerate(zip(ids, ids[1:]))
                        if p in self.ranks), default=None)
            if best is None:
                break
            i = best[1]
            ids[i:i + 2] = [self.ranks[(ids[i], ids[i + 1])][1]]
        if len(self._cache) < (1 << 16):
            self._cache[word] = ids
        return list(ids)


class WordPieceModel:
    """HF's WordPiece (see the module docstring)."""

    def __init__(self, spec, where, special_ids=()):
        self.vocab = dict(spec["vocab"])
        self._piece = {t: i for t, i in self.vocab.items() if i not in set(special_ids)}
        self.unk = spec.get("unk_token", "[UNK]")
        self.prefix = spec.get("continuing_subword_prefix", "##")
        self.max_chars = int(spec.get("max_input_chars_per_word", 100))
        if self.unk not in self.vocab:
            _fail(where, f"WordPiece unk_token {self.unk!r} is not in the vocab")

    def tokenize(self, word):
        """The ids of one pre-token."""
        if len(word) > self.max_chars:
            return [self.vocab[self.unk]]
        out, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = (self.prefix if start else "") + word[start:end]
                if piece in self._piece:
                    break
                end -= 1
            if end == start:
                return [self.vocab[self.unk]]
            out.append(self._piece[piece])
            start = end
        return out


class WordLevelModel:
    """HF's WordLevel: one id per pre-token."""

    def __init__(self, spec, where, special_ids=()):
        self.vocab = dict(spec["vocab"])
        self._word = {t: i for t, i in self.vocab.items() if i not in set(special_ids)}
        self.unk = spec.get("unk_token")
        self.where = where

    def tokenize(self, word):
        """The ids of one pre-token."""
        if word in self._word:
            return [self._word[word]]
        if self.unk not in self.vocab:
            _fail(self.where, f"WordLevel: {word!r} is not in the vocab and there is no "
                              f"unk_token")
        return [self.vocab[self.unk]]


class UnigramModel:
    """HF's Unigram on pre-tokens: unigram.Unigram's lattice without its normaliser."""

    def __init__(self, spec, where, special_ids=()):
        pieces = [tuple(v) for v in spec["vocab"]]
        unk = spec.get("unk_id")
        if unk is None:
            _fail(where, "Unigram without unk_id is not implemented")
        specials = {pieces[i][0]: i for i in special_ids if i != unk and i < len(pieces)}
        self.inner = Unigram(pieces, unk_id=unk, byte_fallback=bool(spec.get("byte_fallback")),
                             special_tokens=specials,
                             normalizer=Normalizer(add_dummy_prefix=False,
                                                   remove_extra_whitespaces=False),
                             fuse_unk=True)
        self.vocab = {p: i for i, (p, _) in reversed(list(enumerate(pieces)))}

    def tokenize(self, word):
        """The ids of one pre-token."""
        return self.inner.segment_ids([word])[0] if word else []

    def tokenize_many(self, words):
        """[tokenize(w) for w in words], one lattice kernel call."""
        words = list(words)
        return self.inner.segment_ids(words) if words else []


MODEL_KINDS = {"BPE": BPEModel, "WordPiece": WordPieceModel, "WordLevel": WordLevelModel,
          "Unigram": UnigramModel}


def build_model(spec, where="tokenizer.json", special_ids=()):
    """The model of a tokenizer.json "model" field; special_ids: ids it must never give."""
    kind = (spec or {}).get("type")
    if kind is None and spec and "vocab" in spec:   # old files: the type is implied
        kind = "BPE" if "merges" in spec else "WordPiece" if "max_input_chars_per_word" in \
            spec else "WordLevel"
    if kind not in MODEL_KINDS:
        _fail(where, f"type {kind!r} is not one of {sorted(MODEL_KINDS)}")
    return MODEL_KINDS[kind](spec, where, special_ids)
