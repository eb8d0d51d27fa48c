"""Write tests/fixtures/hf/pipelines.json.gz: every normalizer, pre-tokenizer, model and decoder
kind of HF `tokenizers`, each in a tokenizer.json, with the ids `tokenizers` gives.

    pip install tokenizers      # the ref extra
    PYTHONPATH=$PWD python tools/make_hf_pipeline_fixtures.py

Six small models are trained once with `tokenizers`' own trainers on the fixture corpora
(a character BPE with [UNK], the same with "##" / "</w>" affixes, a byte-level BPE, a
character BPE with <0xNN> byte-fallback pieces, a Unigram, a WordPiece, a WordLevel), and each
case puts one of them behind the normalizer / pre-tokenizer / decoder / added tokens /
post-processor the case names. The file holds the models once ("models"), the texts once
("texts": multilingual, emoji, digits, punctuation, controls, special-token strings and a
corpus slice), and per case its tokenizer.json without the model ("spec", "model": the key)
and, per text, the ids of encode(text, add_special_tokens=False) ("encode"), of encode(text)
("encode_special"), with encode_special_tokens=True ("encode_ordinary"), and the text of
decode(encode ids, skip_special_tokens=False) ("decode"). The Precompiled normalizer's blob
(SentencePiece's nmt_nfkc rules) is not repeated: a spec holds "@precompiled_charsmap" where
tests/fixtures/unigram/hf_unigram_precompiled.json's blob goes.
"""
import base64
import gzip
import json
from pathlib import Path

from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures"
OUT = FIX / "hf" / "pipelines.json.gz"
CORPUS = (FIX / "python-docs-slice.txt").read_text(encoding="utf-8")[:20000] + \
    (FIX / "linux-howto-multilingual.txt").read_text(encoding="utf-8")[:12000]
TEXTS = ["Hello world, héllo wörld! 你好，世界。 Привет мир. こんにちは 🙂🚀👍🏽 — naïve café",
         "decomposed: cafe\u0301 n\u0303 A\u030a, composed: café ñ Å; 한국어 ﬁ ① ² ½ Ⅻ",
         "def f(x):\n    return x  # 3.14 1234567 don't I'm we'll\n\n\n  spaces   here\t tab ",
         "नमस्ते दुनिया मराठी مرحبا بالعالم ٣٤٥ abcДЕЖ中文カタカナーひらがな한국어",
         "Hello!!! (yes) -- 'quoted' ¿qué? «x» a-b_c e.g. U.S.A. ...",
         "ÀÉÎÕÜ ǅ ﬃ İstanbul ΣΑΣ Straße ǈ",
         "ctl\x00a\x07b\u200bc\ufeffd\u00ad e\ufffdf\u2028g \u3000wide\u00a0nbsp",
         "[CLS] hi [SEP] [MASK] <mask>x <s>y</s> <unk> ▁meta ▁ space",
         "  lead and trail  ", "1+1=2, 2024-06-01 12:30; ¹²³ ০১২", " ", "",
         "newer characters: ab\U0001f972cd \U0001fae0x \u0560\u0588 a\u061cb \u0953\u0915 "
         "\u08be\u0628 \U0001e900z",
         CORPUS[500:1300]]
CHARSMAP = "@precompiled_charsmap"  # where a case's spec holds the one shared blob
SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]", "<s>", "</s>", "<unk>", "<mask>"]


def train(model, trainer, normalizer=None, pre=None):
    tok = Tokenizer(model)
    tok.normalizer, tok.pre_tokenizer = normalizer, pre
    tok.train_from_iterator([CORPUS] + TEXTS, trainer)
    return json.loads(tok.to_str())["model"]


def build_models():
    bpe = trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIALS, show_progress=False)
    out = {"bpe": train(models.BPE(unk_token="[UNK]"), bpe, pre=pre_tokenizers.Whitespace()),
           "bpe_affix": train(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##",
                                         end_of_word_suffix="</w>"),
                              trainers.BpeTrainer(vocab_size=500, special_tokens=SPECIALS,
                                                  continuing_subword_prefix="##",
                                                  end_of_word_suffix="</w>",
                                                  show_progress=False),
                              pre=pre_tokenizers.Whitespace()),
           "bytelevel": train(models.BPE(), trainers.BpeTrainer(
               vocab_size=600, special_tokens=SPECIALS, show_progress=False,
               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
               pre=pre_tokenizers.ByteLevel(add_prefix_space=False)),
           "unigram": train(models.Unigram(), trainers.UnigramTrainer(
               vocab_size=1000, special_tokens=["<unk>"] + SPECIALS, unk_token="<unk>",
               show_progress=False), pre=pre_tokenizers.Metaspace()),
           "wordpiece": train(models.WordPiece(unk_token="[UNK]"), trainers.WordPieceTrainer(
               vocab_size=500, special_tokens=SPECIALS, show_progress=False),
               normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer()),
           "wordlevel": train(models.WordLevel(unk_token="[UNK]"), trainers.WordLevelTrainer(
               vocab_size=400, special_tokens=SPECIALS, show_progress=False),
               pre=pre_tokenizers.Whitespace())}
    fallback = dict(out["bpe"], byte_fallback=True, fuse_unk=True)
    fallback["vocab"] = dict(fallback["vocab"])
    for b in range(256):
        fallback["vocab"][f"<0x{b:02X}>"] = len(fallback["vocab"])
    out["bpe_bytes"] = fallback
    out["bpe_fuse"] = dict(out["bpe"], fuse_unk=True)
    out["bytelevel_ignore"] = dict(out["bytelevel"], ignore_merges=True)
    return out


def charsmap_blob():
    """The base64 nmt_nfkc blob of the Unigram fixture's Precompiled normalizer."""
    spec = json.loads((FIX / "unigram" / "hf_unigram_precompiled.json").read_text("utf-8"))
    steps = spec["normalizer"].get("normalizers", [spec["normalizer"]])
    return next(s for s in steps if s["type"] == "Precompiled")["precompiled_charsmap"]


def precompiled():
    return normalizers.Precompiled(base64.b64decode(charsmap_blob()))


def cases():
    """{name: (model key, normalizer, pre_tokenizer, decoder, extra)}."""
    N, P, D = normalizers, pre_tokenizers, decoders
    meta = D.Metaspace()
    byte = (P.ByteLevel(add_prefix_space=False), D.ByteLevel())
    ws = (P.Whitespace(), D.BPEDecoder())
    out = {
        # pre-tokenizers
        "digits_individual": ("bytelevel", None, P.Sequence([P.Digits(individual_digits=True),
                                                            byte[0]]), byte[1]),
        "digits_contiguous": ("bytelevel", None, P.Sequence([P.Digits(individual_digits=False),
                                                            byte[0]]), byte[1]),
        "whitespace": ("bpe", None, P.Whitespace(), None),
        "whitespace_split": ("bpe", None, P.WhitespaceSplit(), None),
        "bert_pre": ("bpe", None, P.BertPreTokenizer(), None),
        "char_delimiter": ("bpe", None, P.CharDelimiterSplit("e"), None),
        "unicode_scripts": ("bpe", None, P.Sequence([P.WhitespaceSplit(), P.UnicodeScripts()]),
                            None),
        "unicode_scripts_alone": ("bytelevel", None, P.Sequence([P.UnicodeScripts(), byte[0]]),
                                  byte[1]),
        "fixed_length": ("bpe", None, P.FixedLength(length=3), None),
        "bytelevel_prefix_noregex": ("bytelevel", None,
                                     P.ByteLevel(add_prefix_space=True, use_regex=False),
                                     byte[1]),
        "bytelevel_ignore_merges": ("bytelevel_ignore", None, byte[0], byte[1]),
        "sequence_pre": ("bytelevel", None, P.Sequence([P.Punctuation(), P.Digits(True),
                                                       P.ByteLevel(add_prefix_space=True)]),
                         byte[1]),
        "metaspace_gemma_replace": ("bpe_bytes", N.Replace(" ", "▁"), None,
                                    D.Sequence([D.Replace("▁", " "), D.ByteFallback(),
                                                D.Fuse()])),
    }
    for behavior in ("removed", "isolated", "merged_with_previous", "merged_with_next",
                     "contiguous"):
        out[f"punctuation_{behavior}"] = ("bpe", None, P.Sequence([
            P.WhitespaceSplit(), P.Punctuation(behavior)]), None)
        for invert in (False, True):
            out[f"split_regex_{behavior}{'_invert' * invert}"] = (
                "bytelevel", None, P.Sequence([P.Split(Regex(r"\p{N}+|[^\s\p{L}\p{N}]+"),
                                                       behavior, invert=invert),
                                               P.ByteLevel(add_prefix_space=False,
                                                           use_regex=False)]), byte[1])
        out[f"split_string_{behavior}"] = ("bpe", None, P.Split(" ", behavior), None)
    for scheme in ("always", "first", "never"):
        for split in (True, False):
            out[f"metaspace_{scheme}_{'split' if split else 'nosplit'}"] = (
                "unigram", None, P.Metaspace(prepend_scheme=scheme, split=split),
                D.Metaspace(prepend_scheme=scheme, split=split))
    # normalizers (behind a Metaspace + Unigram, or a Whitespace + BPE)
    for name, norm in [("nfc", N.NFC()), ("nfd", N.NFD()), ("nfkc", N.NFKC()),
                       ("nfkd", N.NFKD()), ("lowercase", N.Lowercase()),
                       ("strip_both", N.Strip()), ("strip_left", N.Strip(right=False)),
                       ("strip_right", N.Strip(left=False)),
                       ("strip_accents", N.Sequence([N.NFD(), N.StripAccents()])),
                       ("strip_accents_alone", N.StripAccents()),
                       ("replace_string", N.Replace("e", "E")),
                       ("replace_regex", N.Replace(Regex(r"\s+"), " ")),
                       ("replace_delete", N.Replace(Regex(r"[^\p{L} ]"), "")),
                       ("prepend", N.Prepend("▁")), ("nmt", N.Nmt()),
                       ("precompiled", precompiled()),
                       ("sequence_norm", N.Sequence([N.NFKD(), N.Lowercase(), N.Strip()]))]:
        out[f"norm_{name}"] = ("unigram", norm, P.Metaspace(prepend_scheme="first"), meta)
    for name, kw in [("default", {}), ("no_chinese", {"handle_chinese_chars": False}),
                     ("accents_kept", {"strip_accents": False}),
                     ("cased", {"lowercase": False}), ("no_clean", {"clean_text": False})]:
        out[f"bert_normalizer_{name}"] = ("wordpiece", N.BertNormalizer(**kw),
                                          P.BertPreTokenizer(), D.WordPiece())
    out["norm_bytelevel"] = ("bytelevel", N.ByteLevel(), P.Split(Regex("Ġ"), "merged_with_next"),
                             byte[1])
    out["t5"] = ("unigram", N.Sequence([precompiled(), N.Replace(Regex(" {2,}"), " ")]),
                 P.Sequence([P.WhitespaceSplit(), P.Metaspace()]), meta)
    # models with their options
    out["bpe_affix"] = ("bpe_affix", N.Lowercase(), ws[0], ws[1])
    out["bpe_fuse_unk"] = ("bpe_fuse", None, ws[0], None)
    out["wordlevel"] = ("wordlevel", N.Lowercase(), P.Whitespace(), None)
    out["wordpiece_no_cleanup"] = ("wordpiece", N.BertNormalizer(), P.BertPreTokenizer(),
                                   D.WordPiece(cleanup=False))
    out["strip_decoder"] = ("unigram", None, P.Metaspace(), D.Sequence([
        D.Replace("▁", " "), D.Strip(" ", 1, 0)]))
    out["ctc_decoder"] = ("wordlevel", None, P.Whitespace(), D.CTC(pad_token="[PAD]"))
    return out


def build(models_, name, model_key, norm, pre, dec):
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": None, "post_processor": None,
            "decoder": None, "model": models_[model_key]}
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.normalizer, tok.pre_tokenizer, tok.decoder = norm, pre, dec
    vocab = tok.get_vocab()
    specials = [t for t in SPECIALS if t in vocab and t != "<mask>"]
    tok.add_special_tokens(specials)
    if name.startswith("bert_") or name.startswith("wordpiece"):
        tok.post_processor = processors.BertProcessing(("[SEP]", vocab["[SEP]"]),
                                                       ("[CLS]", vocab["[CLS]"]))
    elif "<s>" in vocab:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])])
    if name in ("whitespace", "metaspace_first_split", "bert_normalizer_default"):
        tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=False)])
        tok.add_tokens([AddedToken("hi", single_word=True), AddedToken("Tab", normalized=True),
                        AddedToken("x>", rstrip=True)])
    return tok


def expectations(tok):
    out = {"encode": [tok.encode(t, add_special_tokens=False).ids for t in TEXTS],
           "encode_special": [tok.encode(t).ids for t in TEXTS]}
    out["decode"] = [tok.decode(ids, skip_special_tokens=False) for ids in out["encode"]]
    tok.encode_special_tokens = True
    out["encode_ordinary"] = [tok.encode(t, add_special_tokens=False).ids for t in TEXTS]
    tok.encode_special_tokens = False
    return out


def main():
    models_ = build_models()
    blob = charsmap_blob()
    result = {"texts": TEXTS, "models": models_, "cases": {}}
    for name, (key, norm, pre, dec) in cases().items():
        tok = build(models_, name, key, norm, pre, dec)
        text = tok.to_str()
        if blob in text:
            text = text.replace(blob, CHARSMAP)
        spec = json.loads(text)
        del spec["model"]
        result["cases"][name] = {"model": key, "spec": spec, **expectations(tok)}
        print(f"{name}: {sum(map(len, result['cases'][name]['encode']))} ids")
    with gzip.open(OUT, "wt", encoding="utf-8") as fh:  # the ids compress 10x
        json.dump(result, fh, ensure_ascii=False)
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
