"""Any tokenizer.json, run the way Hugging Face `tokenizers` runs it
(huggingface/tokenizers tokenizers/src/tokenizer/{mod.rs,added_vocabulary.rs}):

    1. added tokens with normalized=false are cut out of the raw text (leftmost, longest
       first; single_word, lstrip, rstrip as added_vocabulary.rs find_matches);
    2. each remaining piece is normalised (hf_normalizers), and the added tokens with
       normalized=true are cut out of the normal form (matched in their own normal form);
    3. each remaining piece is pre-tokenised (hf_pretokenizers);
    4. the model maps each pre-token to ids (hf_models: BPE, WordPiece, WordLevel, Unigram);
    decode: ids -> token strings (added tokens by their content, normalised when they match
    normalised) -> the decoder
    (hf_decoders) -> joined.

hf_json.from_tokenizer_json keeps the fast specialised tokenizers (byte-level BPE with the
Numba scanner, SentencePiece BPE, Unigram) for the forms they reproduce and gives every
other file to HFPipeline. Special tokens follow the library's rule (specials.py): encode
matches a special added token only when allowed; non-special added tokens are always
matched, as in `tokenizers`.
"""
import regex

from .gpt2 import bytes_to_unicode
from .hf_decoders import build_decoder
from .hf_models import build_model
from .hf_normalizers import build_normalizer
from .hf_pretokenizers import build_pretokenizer
from .specials import check_disallowed, special_plan

_CHAR_BYTE = {c: b for b, c in bytes_to_unicode().items()}
_BYTE_PIECE = regex.compile(r"<0x[0-9A-Fa-f]{2}>")
_WORD = regex.compile(r"[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]")  # Rust's \w
_SPACE = regex.compile(r"\p{White_Space}")
_SPACES = regex.compile(r"\p{White_Space}*")


def _find_added(text, tokens):
    """[(start, end, token dict or None)] covering text: added-token matches and the gaps
    (added_vocabulary.rs find_matches)."""
    if not tokens or not text:
        return [(0, len(text), None)]
    by_content = {t["content"]: t for t in tokens}
    alternation = regex.compile("|".join(regex.escape(c) for c in
                                         sorted(by_content, key=lambda c: (-len(c), c))))
    out, offset = [], 0
    for m in alternation.finditer(text):
        start, stop, tok = m.start(), m.end(), by_content[m.group()]
        if tok.get("single_word") and (start and _WORD.match(text, start - 1) or
                                       stop < len(text) and _WORD.match(text, stop)):
            continue
        if tok.get("lstrip"):
            while start > offset and _SPACE.match(text, start - 1):
                start -= 1
        if tok.get("rstrip"):
            stop = _SPACES.match(text, stop).end()
        if offset < start:
            out.append((offset, start, None))
        out.append((start, stop, tok))
        offset = stop
    if offset != len(text):
        out.append((offset, len(text), None))
    return out


def _kinds(spec, key):
    """The set of "type"s in a (possibly nested Sequence) tokenizer.json component."""
    if not spec:
        return set()
    return {spec.get("type")}.union(*(_kinds(s, key) for s in spec.get(key, [])))


class HFPipeline:
    """A tokenizer.json's normalizer, pre_tokenizer, model, decoder and added tokens (see the
    module docstring). special_tokens: {content: id} of the special added tokens."""

    def __init__(self, spec, where="tokenizer.json"):
        self.where = where
        special_ids = [t["id"] for t in spec.get("added_tokens", []) if t.get("special")]
        self.model = build_model(spec.get("model"), where, special_ids)
        self.normalize = build_normalizer(spec.get("normalizer"), where)
        self.pretokenize = build_pretokenizer(spec.get("pre_tokenizer"), where)
        self.decoder = build_decoder(spec.get("decoder"), where)
        self.decoder_kinds = _kinds(spec.get("decoder"), "decoders")
        self.added = [dict(t, normalized=t.get("normalized", not t.get("special")))
                      for t in spec.get("added_tokens", [])]
        for t in self.added:
            if t["normalized"]:
                t["match"] = self.normalize(t["content"])[0]
        self.special_tokens = {t["content"]: t["id"] for t in self.added if t.get("special")}
        self.tokens = {i: tok for tok, i in self.model.vocab.items()}
        self.tokens.update({t["id"]: t.get("match") or t["content"] for t in self.added})

    def __len__(self):
        return max(self.tokens, default=-1) + 1

    def _words(self, text, allowed):
        """[int id of an added token | str pre-token] of text, in order."""
        if not isinstance(text, str):
            raise TypeError(f"encode: text must be a str, got {type(text).__name__}")
        live = [t for t in self.added if not t.get("special") or t["content"] in allowed]
        raw = [t for t in live if not t["normalized"] and t["content"]]
        normed = [dict(t, content=t["match"]) for t in live if t["normalized"] and t["match"]]
        out = []
        for a, b, tok in _find_added(text, raw):
            if tok is not None:
                out.append(tok["id"])
                continue
            piece, kept = self.normalize(text[a:b])
            for c, d, tok2 in _find_added(piece, normed):
                if tok2 is not None:
                    out.append(tok2["id"])
                elif d > c:
                    out += [w for w, _ in self.pretokenize([(piece[c:d], a == 0 and kept
                                                              and c == 0)])]
        return out

    def _ids(self, words):
        strings = [w for w in words if isinstance(w, str)]
        many = getattr(self.model, "tokenize_many", None)
        done = iter(many(strings) if many else [self.model.tokenize(w) for w in strings])
        out = []
        for w in words:
            out += next(done) if isinstance(w, str) else [w]
        return out

    def encode(self, text, *, allowed_special=(), disallowed_special="all"):
        """Ids of text; special tokens as in Tokenizer.encode (specials.py): by default a
        special-token string in the text is an error, allowed_special="all" encodes them as
        their ids."""
        allowed, disallowed_re, _ = special_plan(self.special_tokens, allowed_special,
                                                 disallowed_special, "encode")
        check_disallowed(text, disallowed_re, 0, "encode")
        return self._ids(self._words(text, set(allowed)))

    def encode_ordinary(self, text):
        """Ids of text with special-token strings as ordinary text (`tokenizers`'
        encode_special_tokens=True)."""
        return self._ids(self._words(text, set()))

    def token_bytes(self):
        """{id: bytes} of every ordinary token, for token healing: what the token adds to the
        text. Known when the decoder is byte-level (GPT-2's printable bytes) or SentencePiece-
        like (Metaspace / Replace("▁", " ") with <0xNN> byte fallback); None otherwise
        (WordPiece's "##" joins depend on the neighbour)."""
        kinds = self.decoder_kinds
        special = set(self.special_tokens.values())
        if "ByteLevel" in kinds:
            return {i: bytes(_CHAR_BYTE[c] for c in t) for i, t in self.tokens.items()
                    if i not in special and all(c in _CHAR_BYTE for c in t)}
        if kinds & {"Metaspace", "Replace"} and not kinds & {"WordPiece", "CTC", "BPEDecoder"}:
            return {i: bytes([int(t[3:5], 16)]) if _BYTE_PIECE.fullmatch(t)
                    else t.replace("\u2581", " ").encode("utf-8")
                    for i, t in self.tokens.items() if i not in special}
        return None

    def decode(self, ids, *, skip_special_tokens=False):
        """The text of ids: their token strings through the decoder."""
        specials = set(self.special_tokens.values()) if skip_special_tokens else set()
        toks = []
        for i in ids:
            if isinstance(i, bool) or not hasattr(i, "__index__") or int(i) not in self.tokens:
                raise ValueError(f"decode: id {i!r} is not in the vocab (ids run "
                                 f"0..{len(self) - 1})")
            if int(i) not in specials:
                toks.append(self.tokens[int(i)])
        return "".join(self.decoder(toks)) if toks else ""
