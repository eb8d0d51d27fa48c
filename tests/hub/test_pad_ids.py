"""Pad ids against transformers: where a family's transformers model embeds with
nn.Embedding(vocab, D, padding_idx=config.pad_token_id) (gemma3, gemma2, olmo2, jamba), the
loaded ModelConfig.pad_id is that id and the pad row's lookups pass no gradient; mamba's
embedding has no padding_idx, so its pad_token_id stays a token id (pad_id None). The
fixtures (tests/fixtures/hf/<name>/expected_pad.npz, tools/make_hf_fixtures_pad.py) hold
transformers' float64 logits and embedding gradient for inputs with the pad id in them.
No torch here."""
from pathlib import Path

import numpy as np
import pytest

from scratchllm.hub import load_pretrained, save_pretrained

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
PADDED = ["gemma3", "gemma2", "olmo2", "jamba"]


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def embedding_gradient(name):
    """(reference, the loaded model's logits, its embedding gradient of sum(logits * G))."""
    ref = dict(np.load(HF / name / "expected_pad.npz"))
    model = load_pretrained(HF / name, dtype=np.float64)
    logits, cache = model.forward(ref["ids"])  # (B, T, V)
    model.zero_grad()
    model.backward(np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape),
                   cache)
    return ref, model, logits, model.embed.E.grad


@pytest.mark.parametrize("name", PADDED)
def test_the_pad_rows_lookups_pass_no_gradient_as_transformers_padding_idx(name):
    ref, model, logits, grad = embedding_gradient(name)
    assert model.cfg.pad_id == int(ref["pad_id"])
    assert rel_err(logits, ref["logits"]) < 1e-9
    assert rel_err(grad, ref["embed_grad"]) < 1e-8  # the pad row: the tied head's part only


def test_mambas_pad_token_is_an_ordinary_token():
    ref, model, logits, grad = embedding_gradient("mamba")
    assert model.cfg.pad_id is None and np.abs(ref["embed_grad"][int(ref["pad_id"])]).max() > 0
    assert rel_err(logits, ref["logits"]) < 1e-9
    assert rel_err(grad, ref["embed_grad"]) < 1e-8


@pytest.mark.parametrize("name, key, default", [("gemma3", "pad_token_id", 0),
                                                ("olmo2", "pad_token_id", 1)])
def test_a_save_writes_the_pad_id_back(name, key, default, tmp_path):
    import json
    model = load_pretrained(HF / name)
    save_pretrained(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())[key] == model.cfg.pad_id
    assert load_pretrained(tmp_path).cfg.pad_id == model.cfg.pad_id == default
