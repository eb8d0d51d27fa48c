"""One model, three ways in: a preset, the same model written by hand as LayerSpecs, and the
Hugging Face directory save_pretrained wrote for it give the same logits, to the bit (float64:
the saved weights are the same numbers and every path builds the same Blocks)."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.hub import load_pretrained, save_pretrained
from scratchllm.lm import LM
from scratchllm.specs import AttentionSpec, FFNSpec, LayerSpec, ModelConfig, NormSpec, RopeSpec


def _logits(model, ids):
    return model.forward(ids)[0]  # (B, T, V)


def _ids():
    return np.random.default_rng(1).integers(0, LM_TINY["vocab_size"], (2, 7))


def test_preset_hand_written_specs_and_a_saved_directory_agree(tmp_path):
    norm = NormSpec(eps=1e-5)
    layer = LayerSpec(AttentionSpec(4, 2, norm_eps=1e-5, rope=RopeSpec()), FFNSpec("swiglu", 12),
                      norm)
    by_hand = ModelConfig(name="dense", vocab_size=LM_TINY["vocab_size"],
                          d_model=LM_TINY["d_model"], layers=(layer,) * 2, norm=norm)
    preset = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    written = LM(by_hand, rng=np.random.default_rng(0), dtype=np.float64)
    save_pretrained(preset, tmp_path, dtype="float64")
    loaded = load_pretrained(tmp_path, dtype=np.float64)
    ids = _ids()
    assert np.array_equal(_logits(written, ids), _logits(preset, ids))
    assert np.array_equal(_logits(loaded, ids), _logits(preset, ids))
    assert loaded.cfg.layers == preset.cfg.layers  # the same specs, read back from config.json


@pytest.mark.parametrize("name, overrides", [  # what the family needs beside the preset
    ("moe", {}), ("mla", {}),
    ("hybrid", dict(positions="nope", mamba_inner_norms=True, norm_topk_prob=False))])
def test_a_preset_and_its_saved_directory_agree(name, overrides, tmp_path):
    preset = LM(lm_tiny(name, **overrides), rng=np.random.default_rng(0), dtype=np.float64)
    save_pretrained(preset, tmp_path, dtype="float64")
    loaded = load_pretrained(tmp_path, dtype=np.float64)
    ids = _ids()
    assert np.array_equal(_logits(loaded, ids), _logits(preset, ids))
