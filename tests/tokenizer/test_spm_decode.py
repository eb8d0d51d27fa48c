"""decode of a SentencePiece .model equals sentencepiece's DecodeIds on every fixture line,
with unknown pieces (" ⁇ "), control pieces and byte runs (invalid UTF-8 included) in them."""
import json
import os

import pytest

from scratchllm.tokenizer import load_sentencepiece

spm = pytest.importorskip("sentencepiece")
FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "unigram")
MODELS = ["spm_unigram", "spm_unigram_bytes", "spm_bpe", "spm_bpe_bytes", "spm_unigram_nmt_nfkc"]


@pytest.mark.parametrize("name", MODELS)
def test_decode_equals_sentencepiece(name):
    path = os.path.join(FIX, f"{name}.model")
    ours, ref = load_sentencepiece(path), spm.SentencePieceProcessor(model_file=path)
    with open(os.path.join(FIX, f"{name}_ids.json"), encoding="utf-8") as fh:
        lines = json.load(fh)["ids"]
    unk, n = ref.unk_id(), ref.get_piece_size()
    extra = [[unk], [unk, unk, 5], [ref.bos_id(), 7, unk, ref.eos_id()], [4, unk, 4],
             [i for i in range(n) if ref.is_byte(i)][:3] + [9], list(range(n))]
    for ids in lines + extra:
        ids = [i for i in ids if i >= 0]
        assert ours.decode(ids) == ref.decode(ids), ids[:12]
    assert " \u2047 " in ours.decode([unk])
