"""Qwen2-VL's vision attention is the library's gqa pair: the fused qkv weight split into wq,
wk, wv, the 2-D RoPE (vision_rope) and each image attending only itself
(image_attention_mask). Against transformers' VisionAttention in float64 on two images
(tests/fixtures/hf/qwen2_vl_vision_attention.npz, tools/make_qwen2_vl_fixtures.py): output
and every gradient within 1e-12."""
from pathlib import Path

import numpy as np

from scratchllm.attention.gqa import gqa_backward, gqa_forward
from scratchllm.attention.qkv import AttentionWeights
from scratchllm.specs import AttentionSpec, Mask, RopeSpec
from scratchllm.vision.mrope import image_attention_mask, vision_rope

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2_vl_vision_attention.npz"


def test_equal_to_transformers():
    f = np.load(FIXTURE)
    D = f["x"].shape[1]
    wq, wk, wv = np.split(f["qkv.weight"].T, 3, axis=1)  # (D, D) each
    bq, bk, bv = np.split(f["qkv.bias"], 3)
    w = AttentionWeights(wq, wk, wv, f["proj.weight"].T, bq, bk, bv, f["proj.bias"])
    spec = AttentionSpec(2, 2, qkv_bias=True, o_bias=True, mask=Mask(causal=False),
                         rope=RopeSpec(mrope_section=(2, 2)))
    y, cache = gqa_forward(f["x"][None], w, spec=spec, rope=vision_rope(f["grid"], D // 2),
                           mask=image_attention_mask(f["grid"]))
    np.testing.assert_allclose(y[0], f["y"], rtol=0, atol=1e-12)
    g = gqa_backward(f["G"][None], cache)
    np.testing.assert_allclose(g["x"][0], f["grad/x"], rtol=0, atol=1e-12)
    gw = g["w"]
    np.testing.assert_allclose(np.concatenate([gw.wq, gw.wk, gw.wv], axis=1).T,
                               f["grad/qkv.weight"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([gw.bq, gw.bk, gw.bv]), f["grad/qkv.bias"],
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(gw.wo.T, f["grad/proj.weight"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(gw.bo, f["grad/proj.bias"], rtol=0, atol=1e-12)


def test_the_mask_keeps_each_image_to_itself():
    m = image_attention_mask([[1, 2, 2], [1, 2, 4]]).array[0, 0]
    assert m.shape == (12, 12) and m[:4, :4].all() and m[4:, 4:].all()
    assert not m[:4, 4:].any() and not m[4:, :4].any()


def test_each_frame_attends_itself():
    """A grid of t = 2 frames is two segments (transformers' cu_seqlens repeats h w over t)."""
    from scratchllm.vision.mrope import frame_ids
    from scratchllm.vision.qwen2_tower import image_packing
    assert frame_ids([[2, 2, 2], [1, 2, 4]]).tolist() == [0] * 4 + [1] * 4 + [2] * 8
    m = image_attention_mask([[2, 2, 2]]).array[0, 0]
    assert m[:4, :4].all() and m[4:, 4:].all() and not m[:4, 4:].any()
    packing = image_packing([[2, 2, 2]], 2)
    assert packing.doc_ids.tolist() == [[0] * 4 + [1] * 4] and packing.positions.shape == (3, 1, 8)
