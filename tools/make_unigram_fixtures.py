"""Writes tests/fixtures/unigram/: Unigram models trained by HF `tokenizers` and by
`sentencepiece` on the bundled slice, and the ids each library's own encoder gives for the
slice's lines and for a multilingual + emoji sample (the tests compare our encoder to them).

    pip install tokenizers sentencepiece      # the bench extra
    python tools/make_unigram_fixtures.py
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


def spm(byte_fallback):
    import sentencepiece as sp
    name = "spm_unigram_bytes" if byte_fallback else "spm_unigram"
    sp.SentencePieceTrainer.train(input=str(SLICE), model_prefix=str(OUT / name),
                                  vocab_size=800 + 256 * byte_fallback, model_type="unigram",
                                  normalization_rule_name="identity", byte_fallback=byte_fallback,
                                  character_coverage=1.0, num_threads=1, minloglevel=2)
    proc = sp.SentencePieceProcessor(model_file=str(OUT / f"{name}.model"))
    texts = lines() + MULTI
    ids = [proc.encode(t) for t in texts]
    (OUT / f"{name}_ids.json").write_text(json.dumps({"texts": texts, "ids": ids},
                                                     ensure_ascii=False))
    (OUT / f"{name}.vocab").unlink()


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    hf()
    spm(False)
    spm(True)
