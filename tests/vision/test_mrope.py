"""Qwen2-VL's M-RoPE: tests/fixtures/hf/qwen2_vl_mrope.npz holds, from a tiny Qwen2VLModel in
float64 (tools/make_qwen2_vl_fixtures.py), get_rope_index's three position rows for two
sequences of text and images (grids (1, 4, 6), (1, 2, 2), (1, 6, 2), merge 2) and a query
rotated by Qwen2VLRotaryEmbedding (head_dim 16, mrope_section (2, 3, 3), theta 100). The
library's positions are equal and its rotation within 1e-12; the rotation's backward is
gradient-checked in grads/cases/attention.py (rope)."""
from pathlib import Path

import numpy as np
import pytest

from scratchllm.attention.rope import Rope, make_rope, rope_backward, rope_forward
from scratchllm.specs import RopeSpec
from scratchllm.vision.mrope import mrope_positions, vision_rope

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2_vl_mrope.npz"


def test_positions_and_rotation_equal_transformers():
    f = np.load(FIXTURE)
    pos, deltas = mrope_positions(f["input_ids"], f["image_grid_thw"], image_token_id=7)
    np.testing.assert_array_equal(pos, f["position_ids"])
    np.testing.assert_array_equal(deltas, f["rope_deltas"])
    rope = make_rope(RopeSpec(base=100.0, mrope_section=(2, 3, 3)), 16, pos)
    y, cache = rope_forward(f["q"], rope)
    np.testing.assert_allclose(y, f["q_embed"], rtol=0, atol=1e-12)
    dx = rope_backward(y, cache)["x"]  # a rotation: R^T R q = q
    np.testing.assert_allclose(dx, f["q"], rtol=0, atol=1e-12)


def test_text_only_is_ordinary_rope():
    """Three equal rows turn every pair by the same position: plain RoPE."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2, 5, 8))
    pos, deltas = mrope_positions(np.ones((2, 5), int), None, image_token_id=7)
    assert (deltas == 0).all()
    m = rope_forward(x, make_rope(RopeSpec(mrope_section=(1, 1, 2)), 8, pos))[0]
    np.testing.assert_allclose(m, rope_forward(x, make_rope(RopeSpec(), 8, pos[0]))[0],
                               rtol=0, atol=1e-15)


def test_errors_name_the_problem():
    ids = np.array([[1, 7, 7, 2]])
    with pytest.raises(ValueError, match="needs 4 image tokens from row 0, position 1"):
        mrope_positions(ids, [[1, 4, 4]], image_token_id=7)
    with pytest.raises(ValueError, match="has 2 images, input_ids holds the tokens of 1"):
        mrope_positions(ids[:, :3], [[1, 2, 4], [1, 2, 2]], image_token_id=7)
    with pytest.raises(ValueError, match="beyond the 0 images"):
        mrope_positions(ids, None, image_token_id=7)
    with pytest.raises(ValueError, match=r"sum to 3, expected 4 pairs"):
        rope_forward(np.zeros((3, 8)), make_rope(RopeSpec(mrope_section=(1, 1, 1)), 8,
                                                 np.zeros((3, 3), int)))
    with pytest.raises(ValueError, match=r"expected \(3, 3\) or \(3, B, 3\)"):
        rope_forward(np.zeros((3, 8)), Rope(np.ones(4), "half", 1.0, np.zeros(3, int),
                                            sections=(1, 1, 2)))
    with pytest.raises(ValueError, match="mrope_section must be a tuple of positive ints"):
        RopeSpec(mrope_section=[1, 1, 2])
    with pytest.raises(ValueError, match="axial needs it"):
        RopeSpec(axial=True)
    with pytest.raises(ValueError, match="axial frequencies take no scaling"):
        RopeSpec(mrope_section=(2, 2), axial=True, scaling={"rope_type": "linear",
                                                            "factor": 2.0})


def test_the_sections_survive_a_json_round_trip():
    import json

    from scratchllm.specs.serialize import spec_from_dict, spec_to_dict
    spec = RopeSpec(base=100.0, mrope_section=(2, 3, 3))
    assert spec_from_dict(json.loads(json.dumps(spec_to_dict(spec)))) == spec


def test_text_positions_become_three_equal_rows():
    rope = make_rope(RopeSpec(mrope_section=(1, 1, 2)), 8, np.arange(4))
    assert rope.positions.shape == (3, 4) and (rope.positions == np.arange(4)).all()


def test_vision_rope_equals_transformers():
    """The tower's 2-D RoPE on two images (grids (1, 4, 6), (1, 2, 2)): positions as
    get_vision_position_ids lays them, rotation as apply_rotary_pos_emb_vision."""
    f = np.load(FIXTURE)
    rope = vision_rope(f["vision_grid_thw"], 8)
    np.testing.assert_array_equal(rope.positions[:2].T, f["vision_position_ids"])
    q = f["vision_q"].transpose(1, 0, 2)  # (H, N, Dh)
    y = rope_forward(q, rope)[0].transpose(1, 0, 2)  # (N, H, Dh)
    np.testing.assert_allclose(y, f["vision_q_embed"], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="head_dim must be a multiple of 4"):
        vision_rope([[1, 2, 2]], 6)
