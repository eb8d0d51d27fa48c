"""gemma3 (the multimodal Gemma 3) against transformers: tests/fixtures/hf/gemma3_vl (a
SigLIP tower, the pooled and normed projector, a Gemma 3 LM with a sliding and a full layer, each
image's tokens attending each other both ways; tools/make_hf_fixtures_vlm.py) was computed
by transformers in float64: the logits (1e-9) and every parameter's gradient (1e-8) agree,
greedy decoding gives generate's ids with cached == full, save/load is bit-identical and
transformers loads the saved directory. No torch here."""
import json

import numpy as np
import pytest

from scratchllm.hub import family_named, load_pretrained
from scratchllm.hub.registry import module_family_for
from scratchllm.vision.gemma3 import Gemma3VL, image_runs
from hub_fixtures import (HF, assert_greedy_and_cached, assert_logits_and_gradients,
                          assert_names_round_trip, assert_saves_bit_identical, expected,
                          rel_err)

DIR = HF / "gemma3_vl"


@pytest.fixture(scope="module")
def ref():
    return expected("gemma3_vl")


@pytest.fixture(scope="module")
def model():
    return load_pretrained(DIR, dtype=np.float64)


def test_logits_and_every_gradient_match_transformers(ref, model):
    assert isinstance(model, Gemma3VL)  # the tower's key bias: 0 in exact arithmetic
    assert_logits_and_gradients(model, ref, key_bias_zero=True, input_ids=ref["input_ids"],
                                pixel_values=ref["pixel_values"])

def test_the_image_tokens_attend_each_other_both_ways(ref, model):
    """Without the bidirectional runs (a causal mask over the image tokens too) the logits
    move: the fixture exercises them."""
    ids = ref["input_ids"]
    assert image_runs(ids == model.cfg.image_token_id)[0].tolist() == \
        [-1, -1, -1, 0, 0, 0, 0, -1, -1, -1, -1, -1]
    x, _, _, _, _ = model._inputs(ids, ref["pixel_values"])
    for layer in model.lm.layers:
        x = layer.forward(x)[0]
    causal = model.lm.head_forward(x)[0]
    assert rel_err(causal, ref["logits"]) > 1e-3


def test_greedy_ids_and_cached_decoding(ref, model):
    assert_greedy_and_cached(model, ref["input_ids"][:1], ref["greedy"],
                             pixel_values=ref["pixel_values"][:1])


def test_save_load_is_bit_identical_and_the_config_round_trips(ref, tmp_path):
    assert_saves_bit_identical(DIR, tmp_path)
    family = family_named("gemma3")
    cfg = family.from_hf(json.loads((DIR / "config.json").read_text()))
    assert family.from_hf(family.to_hf(cfg, "float32")) == cfg
    assert module_family_for(cfg) is family
    assert_names_round_trip(family, Gemma3VL(cfg, rng=np.random.default_rng(0)))
    assert ref["saved_by_scratchllm_rel_err"] < 1e-5  # the generator's from_pretrained


def test_bad_inputs_are_named(ref, model):
    with pytest.raises(ValueError, match="image tokens but no pixel_values"):
        model.forward(input_ids=ref["input_ids"])
    with pytest.raises(ValueError, match="hold 8 image tokens .* 1 image\\(s\\) give 4"):
        model.forward(input_ids=ref["input_ids"], pixel_values=ref["pixel_values"][:1])
    with pytest.raises(ValueError, match="token_type_ids must be nonzero at exactly"):
        model.forward(input_ids=ref["input_ids"], pixel_values=ref["pixel_values"],
                      token_type_ids=np.zeros_like(ref["input_ids"]))


def test_the_image_processor_equals_transformers(model):
    """Gemma3ImageProcessor (16 x 16, bilinear, RGB, mean = std = 0.5) on the five PNGs of
    tests/fixtures/images/, bit for bit; each image stands for 4 tokens between <boi> and
    <eoi>, and prefill reads them as forward does."""
    from scratchllm.vision import load_image_processor
    from scratchllm.vision.vlm import image_block
    pngs = [HF.parent / "images" / f"{n}.png" for n in
            ("rgb", "rgb_large", "rgba", "gray", "palette")]
    images, counts = model.image_inputs(pngs, load_image_processor(DIR))
    np.testing.assert_array_equal(images["pixel_values"],
                                  np.load(DIR / "processed.npz")["pixel_values"])
    assert counts == [4] * 5
    ids = np.array([[2] + image_block(60, 4, (61, 62)) * 2 + [7]])
    first_two = dict(pixel_values=images["pixel_values"][:2])
    logits = model.prefill(ids, model.init_state(1, ids.shape[1]), **first_two)
    full, _ = model.forward(input_ids=ids, **first_two)
    assert rel_err(logits, full) < 1e-12
