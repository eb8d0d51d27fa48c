"""qwen2_vl against transformers: tests/fixtures/hf/qwen2_vl (the tower with its axial 2-D
RoPE, each frame attending itself, the patch merger, and a qwen2 LM with M-RoPE;
tools/make_hf_fixtures_vlm.py) was computed by transformers in float64: the logits
(1e-9) and every parameter's gradient (1e-8) agree, greedy decoding with M-RoPE's offsets
gives generate's ids with cached == full, save/load is bit-identical and transformers loads
the saved directory. No torch here."""
import json

import numpy as np
import pytest

from scratchllm.hub import family_named, load_pretrained
from scratchllm.hub.registry import module_family_for
from scratchllm.vision.qwen2_vl import Qwen2VL
from hub_fixtures import (HF, assert_greedy_and_cached, assert_logits_and_gradients,
                          assert_names_round_trip, assert_saves_bit_identical, expected,
                          rel_err)

DIR = HF / "qwen2_vl"


@pytest.fixture(scope="module")
def ref():
    return expected("qwen2_vl")


@pytest.fixture(scope="module")
def model():
    return load_pretrained(DIR, dtype=np.float64)


def inputs(ref):
    return dict(input_ids=ref["input_ids"], pixel_values=ref["pixel_values"],
                image_grid_thw=ref["image_grid_thw"])


def test_logits_and_every_gradient_match_transformers(ref, model):
    assert isinstance(model, Qwen2VL)  # RoPE turns the key bias too: every gradient nonzero
    assert_logits_and_gradients(model, ref, key_bias_zero=False, **inputs(ref))

def test_greedy_ids_and_cached_decoding(ref, model):
    """Greedy decoding after sequence 0 and its image: transformers' ids (the decoded tokens
    turn at slot + rope delta), cached == full."""
    image = dict(pixel_values=ref["pixel_values"][:24], image_grid_thw=ref["image_grid_thw"][:1])
    state = assert_greedy_and_cached(model, ref["input_ids"][:1], ref["greedy"], **image)
    assert state.deltas[0, 0] == -3  # 6 image tokens spanning 3 x 2 positions: 6 - 3
    with pytest.raises(ValueError, match="give one int position"):
        model.decode(np.array([1]), state, np.array([22]))


def test_save_load_is_bit_identical_and_transformers_loads_it(ref, tmp_path):
    assert_saves_bit_identical(DIR, tmp_path)
    assert ref["saved_by_scratchllm_rel_err"] < 1e-5  # the generator's from_pretrained


def test_config_and_names_round_trip():
    family = family_named("qwen2_vl")
    cfg = family.from_hf(json.loads((DIR / "config.json").read_text()))
    assert family.from_hf(family.to_hf(cfg, "float32")) == cfg
    assert module_family_for(cfg) is family
    assert_names_round_trip(family, Qwen2VL(cfg, rng=np.random.default_rng(0)))


def test_text_alone_and_bad_inputs_are_named(ref, model):
    text = np.where(ref["input_ids"] == model.cfg.image_token_id, 5, ref["input_ids"])
    assert model.forward(input_ids=text)[0].shape == ref["logits"].shape
    with pytest.raises(ValueError, match="image tokens .* but no pixel_values"):
        model.forward(input_ids=ref["input_ids"])
    with pytest.raises(ValueError, match="pixel_values and image_grid_thw go together"):
        model.forward(input_ids=ref["input_ids"], pixel_values=ref["pixel_values"])
    with pytest.raises(ValueError, match=r"pixel_values has shape \(24, 96\), expected \(32, 96\)"):
        model.forward(**dict(inputs(ref), pixel_values=ref["pixel_values"][:24]))
    with pytest.raises(ValueError, match="attention_mask with padding"):
        model.forward(**inputs(ref), attention_mask=np.zeros(ref["input_ids"].shape, int))
    ok = (ref["input_ids"] == model.cfg.image_token_id).astype(int)
    assert model.forward(**inputs(ref), mm_token_type_ids=ok,
                         attention_mask=np.ones_like(ok))[0].shape == ref["logits"].shape


def test_two_rows_decode_at_their_own_rope_deltas(ref, model):
    """Both sequences (each with its image, different deltas) decode together: every step
    equals the full forward of each row."""
    ids, images = ref["input_ids"], dict(pixel_values=ref["pixel_values"],
                                         image_grid_thw=ref["image_grid_thw"])
    state = model.init_state(2, ids.shape[1] + 3)
    logits = model.prefill(ids, state, **images)[:, -1]  # (2, V)
    assert state.deltas[:, 0].tolist() == [-3, 0]  # image 1: 2 tokens spanning 2 positions
    seq = ids
    for _ in range(3):
        full, _ = model.forward(input_ids=seq, **images)
        assert rel_err(logits, full[:, -1]) < 1e-10
        seq = np.concatenate([seq, np.argmax(logits, axis=1)[:, None]], axis=1)
        logits = model.decode(seq[:, -1], state, seq.shape[1] - 1)


def test_a_grid_of_two_frames_attends_frame_by_frame(model):
    """image_grid_thw (2, 2, 4) beside (1, 4, 2): each frame its own segment in the tower, as
    transformers' cu_seqlens (expected_frames.npz)."""
    f = np.load(DIR / "expected_frames.npz")
    logits, _ = model.forward(input_ids=f["input_ids"], pixel_values=f["pixel_values"],
                              image_grid_thw=f["image_grid_thw"])
    assert rel_err(logits, f["logits"]) < 1e-9
