"""Unigram model files: HF `tokenizer.json` (model type "Unigram") and SentencePiece `.model`.

tokenizer.json (huggingface/tokenizers tokenizers/src/models/unigram/serialization.rs):
    {"model": {"type": "Unigram", "unk_id": 0, "vocab": [[piece, score], ...],
               "byte_fallback": false},
     "normalizer": null | {"type": "NFKC"} | {"type": "Precompiled", "precompiled_charsmap":
     base64 of SentencePiece's blob (charsmap.py)}, "pre_tokenizer": {"type": "Metaspace",
     "replacement": "▁", "prepend_scheme": "always" | "first" | "never"}, "added_tokens": [...]}
HF's Metaspace does not collapse repeated spaces (SentencePiece's remove_extra_whitespaces),
and HF's Unigram fuses a run of unknown characters into one unknown id.

.model: a ModelProto protobuf (google/sentencepiece src/sentencepiece_model.proto), read with
the schema module the `sentencepiece` package ships (sentencepiece_model_pb2; needs protobuf):
pieces with score and type (1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte),
trainer_spec.model_type (1 unigram, 2 BPE), normalizer_spec (name, add_dummy_prefix,
remove_extra_whitespaces, precompiled_charsmap: the rules of "nmt_nfkc", "nfkc", ... applied
by charsmap.py; "identity" has none). Like
HF's, SentencePiece's encoder fuses a run of unknown characters into one unknown id; it adds
path scores in float32.
"""
import base64
import json

from scratchllm.core.atomic import write_text

from .charsmap import SPACE, CharsMap
from .normalizer import Normalizer
from .spm_bpe import SentencePieceBPE
from .unigram import Unigram

_NORMAL, _UNKNOWN, _CONTROL, _USER, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


def _hf_normalizer(spec, where):
    """The Normalizer of a tokenizer.json Unigram: the rules of its normalizer, the dummy
    prefix of its Metaspace pre-tokenizer, repeated spaces kept (HF's Metaspace)."""
    nfkc, charsmap = _rules(spec.get("normalizer"), where)
    return Normalizer(add_dummy_prefix=_prefix(spec.get("pre_tokenizer"), where), nfkc=nfkc,
                      remove_extra_whitespaces=False, charsmap=charsmap)


def _rules(spec, where):
    """(nfkc flag, CharsMap or None) of a tokenizer.json normalizer: null, NFKC, Precompiled
    or a Sequence of one of them."""
    if spec is None:
        return False, None
    kind = spec.get("type")
    if kind == "NFKC":
        return True, None
    if kind == "Precompiled":
        return False, CharsMap(base64.b64decode(spec["precompiled_charsmap"]), hf=True)
    if kind == "Sequence" and len(spec["normalizers"]) <= 1:
        return _rules((spec["normalizers"] or [None])[0], where)
    raise ValueError(f"{where}: normalizer {kind!r} is not supported (expected null, NFKC or "
                     f"Precompiled)")


def _prefix(spec, where):
    """add_dummy_prefix of a tokenizer.json Metaspace pre-tokenizer (True, "first", False)."""
    if spec is None or spec.get("type") != "Metaspace" or spec.get("replacement") != SPACE:
        raise ValueError(f"{where}: expected a Metaspace pre_tokenizer with replacement "
                         f"{SPACE!r}, got {spec!r}")
    scheme = spec.get("prepend_scheme", "always" if spec.get("add_prefix_space", True)
                      else "never")
    if scheme not in ("always", "first", "never"):
        raise ValueError(f"{where}: unknown prepend_scheme {scheme!r}")
    return {"always": True, "first": "first", "never": False}[scheme]


def load_unigram_json(path):
    """A Unigram from an HF tokenizer.json with a Unigram model."""
    with open(path, encoding="utf-8") as fh:
        return unigram_from_json(json.load(fh), f"load_unigram_json({str(path)!r})")


def unigram_from_json(spec, where):
    """load_unigram_json of a parsed tokenizer.json (dict); `where` names it in errors."""
    model = spec.get("model") or {}
    if model.get("type") != "Unigram":
        raise ValueError(f"{where}: model type is {model.get('type')!r}, expected 'Unigram'")
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t.get("special")
                and t["id"] != model.get("unk_id")}
    tok = Unigram([tuple(v) for v in model["vocab"]], unk_id=model.get("unk_id") or 0,
                  special_tokens=specials, normalizer=_hf_normalizer(spec, where),
                  byte_fallback=bool(model.get("byte_fallback")), fuse_unk=True)
    tok.split_pieces = bool(spec["pre_tokenizer"].get("split", True))
    return tok


def save_unigram_json(tok, path):
    """Write tok (a Unigram) as an HF tokenizer.json that HF `tokenizers` loads. The file
    carries HF's rules (no collapsing of repeated spaces, unknown runs fused), as
    load_unigram_json reads it back."""
    prefix = tok.normalizer.add_dummy_prefix
    scheme = "first" if prefix == "first" else "always" if prefix else "never"
    meta = {"type": "Metaspace", "replacement": SPACE, "prepend_scheme": scheme, "split": True}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}
             for t, i in sorted({tok.pieces[tok.unk_id][0]: tok.unk_id,
                                 **tok.special_tokens}.items(), key=lambda e: e[1])]
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": _rules_json(tok.normalizer), "pre_tokenizer": meta,
            "post_processor": None, "decoder": meta,
            "model": {"type": "Unigram", "unk_id": tok.unk_id,
                      "vocab": [[p, s] for p, s in tok.pieces],
                      "byte_fallback": tok.byte_fallback}}
    write_text(path, json.dumps(spec, ensure_ascii=False))


def _rules_json(normalizer):
    """The tokenizer.json normalizer of a Normalizer's rules (the inverse of _rules)."""
    if normalizer.charsmap is not None:
        blob = base64.b64encode(normalizer.charsmap.blob).decode("ascii")
        return {"type": "Precompiled", "precompiled_charsmap": blob}
    return {"type": "NFKC"} if normalizer.nfkc else None


def load_bpe_json(path):
    """A SentencePieceBPE from an HF tokenizer.json of the Llama-2 / Mistral form: a BPE model
    over characters with byte_fallback, and either the normaliser Prepend("▁") + Replace(" ",
    "▁") or a Metaspace pre-tokenizer without splitting."""
    with open(path, encoding="utf-8") as fh:
        return bpe_from_json(json.load(fh), f"load_bpe_json({str(path)!r})")


def bpe_from_json(spec, where):
    """load_bpe_json of a parsed tokenizer.json (dict); `where` names it in errors."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("continuing_subword_prefix") or \
            model.get("end_of_word_suffix"):
        raise ValueError(f"{where}: expected a plain BPE model, got {model.get('type')!r}")
    norm, pre = spec.get("normalizer"), spec.get("pre_tokenizer")
    steps = [n.get("type") for n in (norm or {}).get("normalizers", [])]
    if steps == ["Prepend", "Replace"] and pre is None:
        prefix = "always"
    elif norm is None and pre is not None and not pre.get("split", True):
        prefix = _prefix(pre, where)
    else:
        raise ValueError(f"{where}: expected normalizer Prepend + Replace, or a Metaspace "
                         f"pre_tokenizer with split false; got {norm!r}, {pre!r}")
    vocab = model["vocab"]
    pieces = [(p, 0.0) for p, _ in sorted(vocab.items(), key=lambda e: e[1])]
    if [i for _, i in sorted(vocab.items(), key=lambda e: e[1])] != list(range(len(vocab))):
        raise ValueError(f"{where}: vocab ids are not 0..{len(vocab) - 1}")
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    specials = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t.get("special")
                and t["content"] != model.get("unk_token")}
    return SentencePieceBPE(pieces, merges, unk_id=vocab.get(model.get("unk_token"), 0),
                            special_tokens=specials,
                            normalizer=Normalizer(add_dummy_prefix=prefix,
                                                  remove_extra_whitespaces=False),
                            byte_fallback=bool(model.get("byte_fallback")),
                            fuse_unk=bool(model.get("fuse_unk")))


def read_model_proto(path):
    """The ModelProto of a SentencePiece .model file."""
    try:
        from sentencepiece import sentencepiece_model_pb2 as pb  # optional: the spm extra
    except ImportError as err:
        raise ImportError(f"load_sentencepiece: reading .model files needs the `sentencepiece` "
                          f"and `protobuf` packages (pip install 'scratchllm[spm]'): "
                          f"{err}") from None
    proto = pb.ModelProto()
    with open(path, "rb") as fh:
        proto.ParseFromString(fh.read())
    return proto


def load_sentencepiece(path):
    """A Unigram (model_type 1) or SentencePieceBPE (model_type 2) tokenizer from a
    SentencePiece .model file."""
    proto = read_model_proto(path)
    where = f"load_sentencepiece({str(path)!r})"
    model_type = proto.trainer_spec.model_type
    if model_type not in (1, 2):
        raise ValueError(f"{where}: model_type {model_type} is neither unigram (1) nor BPE (2)")
    kinds = [p.type for p in proto.pieces]
    if _USER in kinds:
        raise ValueError(f"{where}: user-defined pieces are not supported")
    unk = [i for i, k in enumerate(kinds) if k == _UNKNOWN]
    specials = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == _CONTROL}
    cls = Unigram if model_type == 1 else SentencePieceBPE
    tok = cls([(p.piece, p.score) for p in proto.pieces], unk_id=unk[0] if unk else 0,
              special_tokens=specials, normalizer=_spm_normalizer(proto.normalizer_spec, where),
              byte_fallback=proto.trainer_spec.byte_fallback,
              unused=[i for i, k in enumerate(kinds) if k == _UNUSED], fuse_unk=True,
              score_dtype="float32")
    names = {_CONTROL: "control", _UNKNOWN: "unknown", _BYTE: "byte"}
    tok.sentencepiece_kinds = {i: names[k] for i, k in enumerate(kinds) if k in names}
    return tok


def _spm_normalizer(norm, where):
    """The Normalizer of a .model's NormalizerSpec: "identity" (no rules) or precompiled
    rules."""
    if norm.name != "identity" and not norm.precompiled_charsmap:
        raise ValueError(f"{where}: normalizer {norm.name!r} has no precompiled_charsmap "
                         f"(expected 'identity' or a precompiled rule set such as 'nmt_nfkc')")
    charsmap = CharsMap(norm.precompiled_charsmap) if norm.name != "identity" else None
    return Normalizer(add_dummy_prefix=norm.add_dummy_prefix,
                      remove_extra_whitespaces=norm.remove_extra_whitespaces, charsmap=charsmap)
