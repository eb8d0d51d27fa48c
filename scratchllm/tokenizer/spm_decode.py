"""Decoding ids as SentencePiece does (google/sentencepiece src/sentencepiece_processor.cc,
SentencePieceProcessor::Decode), for models read from .model files:

    control piece (<s>, </s>)   -> ""            (invisible)
    the unknown piece           -> unk_surface   (" ⁇ ", U+2047 between spaces, unless the
                                                  trainer_spec sets another)
    a run of <0xNN> byte pieces -> its UTF-8 characters; a byte that starts no valid
                                   character -> U+FFFD, one per byte
    any other piece             -> ▁ as " "; while nothing has been written yet, a leading ▁
                                   is dropped (the dummy prefix) when add_dummy_prefix or
                                   remove_extra_whitespaces (then every leading ▁ piece
                                   until some text appears)
"""
from .charsmap import SPACE

UNK_SURFACE = " \u2047 "   # SentencePiece's kDefaultUnknownSymbol


def _char_length(data, i):
    """Bytes of the valid UTF-8 character at data[i], or 0 (SentencePiece's
    IsValidDecodeUTF8)."""
    b = data[i]
    n = 1 if b < 0x80 else 2 if 0xC2 <= b < 0xE0 else 3 if 0xE0 <= b < 0xF0 else \
        4 if 0xF0 <= b < 0xF5 else 0
    try:
        return n if n and len(data[i:i + n]) == n and data[i:i + n].decode("utf-8") else 0
    except UnicodeDecodeError:
        return 0


def byte_text(data):
    """SentencePiece's text of a run of byte pieces: U+FFFD per byte of no valid character."""
    out, i = [], 0
    while i < len(data):
        n = _char_length(data, i)
        out.append(data[i:i + n].decode("utf-8") if n else "\ufffd")
        i += n or 1
    return "".join(out)


def sentencepiece_decode(pieces, ids, *, kinds, normalizer, unk_surface=UNK_SURFACE):
    """The text SentencePiece decodes ids to. pieces: [(piece, score)]; kinds: {id: "control"
    | "unknown" | "byte"} for the pieces that are not normal; normalizer: the model's
    Normalizer (its add_dummy_prefix and remove_extra_whitespaces)."""
    strip_all = normalizer.remove_extra_whitespaces
    consume = bool(normalizer.add_dummy_prefix) or strip_all
    text, run, bos_ws, seen = "", bytearray(), True, False
    for i in ids:
        kind = kinds.get(i)
        if kind == "byte":
            run.append(int(pieces[i][0][3:5], 16))
            continue
        text, run = text + byte_text(bytes(run)), bytearray()
        if seen or text:
            bos_ws = False
        piece, seen = pieces[i][0], False
        if kind == "control":
            continue
        if kind == "unknown":
            text += unk_surface
            continue
        if bos_ws and consume and piece.startswith(SPACE):
            piece, seen = piece[1:], not strip_all
        text += piece.replace(SPACE, " ")
    return text + byte_text(bytes(run))
