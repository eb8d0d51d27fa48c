"""train_sentencepiece_bpe gives the pieces, scores and ids of sentencepiece's BPE trainer
(model_type=bpe, identity normalisation) on English and multilingual corpora, with byte
fallback, a special piece and character_coverage below 1."""
import os

import pytest

from scratchllm.tokenizer import train_sentencepiece_bpe

spm = pytest.importorskip("sentencepiece")
FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures")
EXTRA = ("\nこんにちは世界 カタカナー ひらがな 中文字符 한국어 텍스트 नमस्ते दुनिया e\u0301 🙂🚀 "
         "12345 3.14 <sep> x<sep>y x<s>y\ta\t\tb\n") * 3
CASES = [("python-docs-slice.txt", 12000, 400, {}),
         ("linux-howto-multilingual.txt", 12000, 1700,
          {"byte_fallback": True, "special_tokens": ("<sep>",), "character_coverage": 0.9995})]


@pytest.mark.parametrize("name,chars,vocab,options", CASES)
def test_pieces_and_ids_equal_sentencepiece(tmp_path, name, chars, vocab, options):
    with open(os.path.join(FIX, name), encoding="utf-8") as fh:
        text = fh.read()[:chars] + EXTRA
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(path), model_prefix=str(tmp_path / "m"), model_type="bpe", vocab_size=vocab,
        normalization_rule_name="identity", minloglevel=2,
        character_coverage=options.get("character_coverage", 1.0),
        byte_fallback=options.get("byte_fallback", False),
        user_defined_symbols=list(options.get("special_tokens", ())))
    ref = spm.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    tok = train_sentencepiece_bpe(path, vocab, options.get("special_tokens", ()),
                                  byte_fallback=options.get("byte_fallback", False),
                                  character_coverage=options.get("character_coverage", 1.0))
    assert tok.pieces == [(ref.id_to_piece(i), ref.get_score(i))
                          for i in range(ref.get_piece_size())]
    lines = [line for line in text.split("\n") if "<sep>" not in line]
    assert [tok.encode_ordinary(line) for line in lines] == [ref.encode(line) for line in lines]
    ids = ref.encode(EXTRA) + [0, 1]
    assert tok.decode(ids) == ref.decode(ids)


def test_errors_name_the_argument(tmp_path):
    path = tmp_path / "tiny.txt"
    path.write_text("ab ab ab\n", encoding="utf-8")
    with pytest.raises(ValueError, match="vocab_size 3 is smaller"):
        train_sentencepiece_bpe(path, 3)
    with pytest.raises(ValueError, match="gives only"):
        train_sentencepiece_bpe(path, 40)
    with pytest.raises(ValueError, match="character_coverage"):
        train_sentencepiece_bpe(path, 10, character_coverage=0.5)
