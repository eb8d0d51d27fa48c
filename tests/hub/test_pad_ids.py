"""Pad ids against transformers: where a family's transformers model embeds with
nn.Embedding(vocab, D, padding_idx=config.pad_token_id) (gemma3, gemma2, olmo2, jamba by their
config classes' defaults; llama and mixtral with a pad_token_id set in config.json), the
loaded ModelConfig.pad_id is that id and the pad row's lookups pass no gradient; mamba's
embedding has no padding_idx, so its pad_token_id stays a token id (pad_id None). The
fixtures (tests/fixtures/hf/<name>/expected_pad.npz, tools/make_hf_fixtures_pad.py) hold
transformers' float64 logits and embedding gradient for inputs with the pad id in them.
No torch here."""
import json
import shutil

import numpy as np
import pytest

from scratchllm.hub import load_pretrained, save_pretrained
from hub_fixtures import HF, rel_err

PADDED = ["gemma3", "gemma2", "olmo2", "jamba", "llama", "mixtral"]
SET_PAD = {"llama": 3, "mixtral": 3}  # config.json's pad_token_id set, as the generator does


def with_pad(name, tmp_path):
    """The checkpoint's directory, or for SET_PAD's a copy with that pad_token_id."""
    if name not in SET_PAD:
        return HF / name
    d = shutil.copytree(HF / name, tmp_path / name)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "pad_token_id": SET_PAD[name]}))
    return d


def embedding_gradient(name, tmp_path):
    """(reference, the model, its logits, its embedding gradient of sum(logits * G))."""
    ref = dict(np.load(HF / name / "expected_pad.npz"))
    model = load_pretrained(with_pad(name, tmp_path), dtype=np.float64)
    logits, cache = model.forward(ref["ids"])  # (B, T, V)
    model.zero_grad()
    model.backward(np.random.default_rng(int(ref["G_seed"])).standard_normal(logits.shape),
                   cache)
    return ref, model, logits, model.embed.E.grad


@pytest.mark.parametrize("name", PADDED)
def test_the_pad_rows_lookups_pass_no_gradient_as_transformers_padding_idx(name, tmp_path):
    ref, model, logits, grad = embedding_gradient(name, tmp_path)
    assert model.cfg.pad_id == int(ref["pad_id"])
    assert rel_err(logits, ref["logits"]) < 1e-9
    assert rel_err(grad, ref["embed_grad"]) < 1e-8  # the pad row: the tied head's part only


def test_mambas_pad_token_is_an_ordinary_token(tmp_path):
    ref, model, logits, grad = embedding_gradient("mamba", tmp_path)
    assert model.cfg.pad_id is None and np.abs(ref["embed_grad"][int(ref["pad_id"])]).max() > 0
    assert rel_err(logits, ref["logits"]) < 1e-9
    assert rel_err(grad, ref["embed_grad"]) < 1e-8


@pytest.mark.parametrize("name, pad", [("gemma3", 0), ("olmo2", 1), ("llama", 3),
                                       ("mixtral", 3), ("qwen3_moe", None)])
def test_a_save_writes_the_pad_id_back(name, pad, tmp_path):
    model = load_pretrained(with_pad(name, tmp_path))
    assert model.cfg.pad_id == pad
    save_pretrained(model, tmp_path / "saved")
    written = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert written.get("pad_token_id") == pad
    assert load_pretrained(tmp_path / "saved").cfg.pad_id == pad
