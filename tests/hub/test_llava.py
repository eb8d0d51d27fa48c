"""llava against transformers: tests/fixtures/hf/llava (a SigLIP tower, the GELU projector and
a llama LM; tools/make_hf_fixtures_vision.py --llava) was computed by transformers in
float64: the logits (1e-9) and every parameter's gradient (1e-8) agree, save/load is
bit-identical, transformers loads the saved directory, and what the library cannot honour is
named. No torch here."""
import json
import shutil

import numpy as np
import pytest

from scratchllm.hub import family_named, load_pretrained
from scratchllm.hub.registry import module_family_for
from scratchllm.vision.llava import Llava
from hub_fixtures import (HF, assert_greedy_and_cached, assert_logits_and_gradients,
                          assert_names_round_trip, assert_saves_bit_identical, expected)

DIR = HF / "llava"


@pytest.fixture(scope="module")
def ref():
    return dict(np.load(DIR / "expected.npz"))


@pytest.mark.parametrize("name", ["llava", "llava_clip"])
def test_logits_and_every_gradient_match_transformers(name):
    """The key bias of the tower has gradient 0 in exact arithmetic (round-off on both
    sides); the tower's last block and post-norm come after its feature layer: zero.
    llava_clip is LLaVA-1.5's shape: a CLIP tower whose [CLS] the features leave out."""
    model = load_pretrained(HF / name, dtype=np.float64)
    assert isinstance(model, Llava)
    ref = expected(name)
    assert_logits_and_gradients(model, ref, key_bias_zero=True, input_ids=ref["input_ids"],
                                pixel_values=ref["pixel_values"])

@pytest.mark.parametrize("name", ["llava", "llava_clip"])
def test_save_load_is_bit_identical_and_transformers_loads_it(name, tmp_path):
    assert_saves_bit_identical(HF / name, tmp_path)
    assert expected(name)["saved_by_scratchllm_rel_err"] < 1e-5  # the generator's


def test_config_and_names_round_trip():
    family = family_named("llava")
    cfg = family.from_hf(json.loads((DIR / "config.json").read_text()))
    assert family.from_hf(family.to_hf(cfg, "float32")) == cfg
    assert module_family_for(cfg) is family
    assert_names_round_trip(family, Llava(cfg, rng=np.random.default_rng(0)))


def test_text_alone_and_what_cannot_be_honoured(ref, tmp_path):
    model = load_pretrained(DIR, dtype=np.float64)
    text = np.where(ref["input_ids"] == model.cfg.image_token_id, 5, ref["input_ids"])
    assert model.forward(input_ids=text)[0].shape == ref["logits"].shape
    with pytest.raises(ValueError, match="hold 18 image tokens .* 1 image\\(s\\) give 9"):
        model.forward(input_ids=ref["input_ids"], pixel_values=ref["pixel_values"][:1])
    with pytest.raises(ValueError, match="image tokens but no pixel_values"):
        model.forward(input_ids=ref["input_ids"])
    with pytest.raises(ValueError, match="Llava.forward: attention_mask with padding"):
        model.forward(input_ids=text, attention_mask=np.zeros_like(text))
    assert model.forward(input_ids=text, attention_mask=np.ones_like(text))[0].shape == \
        ref["logits"].shape
    hf = json.loads((DIR / "config.json").read_text())
    hf["vision_config"]["model_type"] = "eva_vision_model"
    (tmp_path / "config.json").write_text(json.dumps(hf))
    shutil.copy(DIR / "model.safetensors", tmp_path)
    with pytest.raises(ValueError, match="'eva_vision_model' is not implemented"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize("name", ["llava", "llava_clip"])
def test_greedy_ids_and_cached_decoding(name):
    """Greedy decoding after sequence 0 and its image: transformers' ids; the prefill's last
    row and every decoded step equal a full forward over the sequence so far."""
    ref = expected(name)
    assert_greedy_and_cached(load_pretrained(HF / name, dtype=np.float64), ref["input_ids"][:1],
                             ref["greedy"], pixel_values=ref["pixel_values"][:1])
