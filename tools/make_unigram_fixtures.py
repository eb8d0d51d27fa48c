"""Writes tests/fixtures/unigram/: Unigram models trained by HF `tokenizers` and by
`sentencepiece` (and sentencepiece BPE models, with and without byte fallback) on the bundled
slice, and the ids each library's own encoder gives for the
slice's lines and for a multilingual + emoji sample (the tests compare our encoder to them).

    pip install tokenizers sentencepiece      # the bench extra
    python tools/make_unigram_fixtures.py [nmt_nfkc]
"""
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SLICE = ROOT / "tests" / "fixtures" / "python-docs-slice.txt"
OUT = ROOT / "tests" / "fixtures" / "unigram"
MULTI = ["Καλημέρα κόσμε — Привет, мир!", "你好，世界。こんにちは世界 안녕하세요",
         "مرحبا بالعالم שָׁלוֹם नमस्ते दुनिया สวัสดีชาวโลก", "emoji 🙃👍🏽 café naïve",
         "  two  spaces and\ttab ", "unknown ☃☃ runs ⚙"]


def lines():
    text = SLICE.read_bytes().decode("utf-8").replace("<|endoftext|>", "")
    return [t for t in text.split("\n") if t.strip()][:400]


def hf():
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=800, special_tokens=["<unk>"],
                                      unk_token="<unk>", show_progress=False)
    tok.train([str(SLICE)], trainer)
    tok.save(str(OUT / "hf_unigram.json"))
    texts = lines() + MULTI
    ids = [tok.encode(t).ids for t in texts]
    (OUT / "hf_unigram_ids.json").write_text(json.dumps({"texts": texts, "ids": ids},
                                                        ensure_ascii=False))


def spm(byte_fallback, model_type="unigram"):
    import sentencepiece as sp
    name = f"spm_{model_type}" + ("_bytes" if byte_fallback else "")
    sp.SentencePieceTrainer.train(input=str(SLICE), model_prefix=str(OUT / name),
                                  vocab_size=800 + 256 * byte_fallback, model_type=model_type,
                                  normalization_rule_name="identity", byte_fallback=byte_fallback,
                                  character_coverage=1.0, num_threads=1, minloglevel=2)
    proc = sp.SentencePieceProcessor(model_file=str(OUT / f"{name}.model"))
    texts = lines() + MULTI
    ids = [proc.encode(t) for t in texts]
    (OUT / f"{name}_ids.json").write_text(json.dumps({"texts": texts, "ids": ids},
                                                     ensure_ascii=False))
    (OUT / f"{name}.vocab").unlink()


def hf_llama_form():
    """The spm BPE byte-fallback model as a Llama-2-style tokenizer.json (merges extracted as
    transformers' SentencePieceExtractor does: every split of a piece into two pieces, ordered
    by the piece's score), and the ids HF tokenizers gives with it."""
    import sentencepiece as sp
    from tokenizers import Tokenizer
    proc = sp.SentencePieceProcessor(model_file=str(OUT / "spm_bpe_bytes.model"))
    vocab = {proc.id_to_piece(i): i for i in range(proc.get_piece_size())}
    scores = {p: proc.get_score(i) for p, i in vocab.items()}
    merges = []
    for piece in sorted(vocab, key=lambda p: -scores[p]):
        local = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [
        {"id": i, "content": proc.id_to_piece(i), "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True} for i in range(3)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None, "post_processor": None, "decoder": None,
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>",
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [list(m) for m in merges]}}
    path = OUT / "hf_bpe_bytes.json"
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    tok = Tokenizer.from_file(str(path))
    texts = lines() + MULTI
    ids = [tok.encode(t).ids for t in texts]
    (OUT / "hf_bpe_bytes_ids.json").write_text(json.dumps({"texts": texts, "ids": ids},
                                                          ensure_ascii=False))


NORMALISE = ["ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３ ｶﾀｶﾅ", "ligatures ﬁ ﬂ ﬃ, circled ① ⑳, roman Ⅻ, ㎏ ㍻",
             "e\u0301 combining, Å\u030a, ḱ, ﬀ; nbsp\u00a0here\u2003em\u3000ideographic",
             "tab\there\x0bvt\x0cff\u200bzwsp\u200d\ufeffbom", "ﻻ ﷺ ﹰ Arabic forms ٠١٢",
             "👨\u200d👩\u200d👧 ❤\ufe0f 🏳\ufe0f\u200d🌈 한글 \u1100\u1161", "  ▁ already ▁▁ here  ",
             "\u00ad soft\u00adhyphen, µ Ω K Å, ½ ¼ ², ™ ℡ …"]


def spm_nmt_nfkc():
    """A unigram model with sentencepiece's default normaliser (nmt_nfkc, a precompiled
    charsmap), the normal form sentencepiece gives each text, and its ids."""
    import sentencepiece as sp
    name = "spm_unigram_nmt_nfkc"
    sp.SentencePieceTrainer.train(input=str(SLICE), model_prefix=str(OUT / name),
                                  vocab_size=800, model_type="unigram",
                                  character_coverage=1.0, num_threads=1, minloglevel=2)
    proc = sp.SentencePieceProcessor(model_file=str(OUT / f"{name}.model"))
    texts = lines()[:100] + MULTI + NORMALISE
    (OUT / f"{name}_ids.json").write_text(json.dumps(
        {"texts": texts, "normalized": [proc.normalize(t) for t in texts],
         "ids": [proc.encode(t) for t in texts]}, ensure_ascii=False))
    (OUT / f"{name}.vocab").unlink()


def hf_precompiled():
    """The nmt_nfkc model as an HF tokenizer.json (Unigram, the Precompiled normaliser with
    the model's charsmap, Metaspace), and the normal form and ids HF tokenizers gives."""
    import base64
    import sentencepiece as sp
    from sentencepiece import sentencepiece_model_pb2 as pb
    from tokenizers import Tokenizer
    proto = pb.ModelProto()
    proto.ParseFromString((OUT / "spm_unigram_nmt_nfkc.model").read_bytes())
    proc = sp.SentencePieceProcessor(model_file=str(OUT / "spm_unigram_nmt_nfkc.model"))
    charsmap = base64.b64encode(proto.normalizer_spec.precompiled_charsmap).decode("ascii")
    meta = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
            "split": True}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [
        {"id": i, "content": proc.id_to_piece(i), "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True} for i in range(3)],
        "normalizer": {"type": "Precompiled", "precompiled_charsmap": charsmap},
        "pre_tokenizer": meta, "post_processor": None, "decoder": meta,
        "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": False, "vocab": [
            [p.piece, p.score] for p in proto.pieces]}}
    path = OUT / "hf_unigram_precompiled.json"
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    tok = Tokenizer.from_file(str(path))
    texts = lines()[:100] + MULTI + NORMALISE
    (OUT / "hf_unigram_precompiled_ids.json").write_text(json.dumps(
        {"texts": texts, "normalized": [tok.normalizer.normalize_str(t) for t in texts],
         "ids": [tok.encode(t).ids for t in texts]}, ensure_ascii=False))


if __name__ == "__main__":
    import sys
    OUT.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:] == ["nmt_nfkc"]:          # only these fixtures (the others stay as they are)
        spm_nmt_nfkc()
        sys.exit(hf_precompiled())
    hf()
    spm(False)
    spm(True)
    spm(True, "bpe")
    spm(False, "bpe")
    hf_llama_form()
    spm_nmt_nfkc()
    hf_precompiled()
