"""Qwen2-VL's dynamic-resolution preprocessing: tests/fixtures/images/qwen2_vl.npz holds what
transformers' Qwen2VLImageProcessor (PIL backend; patch 4, merge 2, min_pixels 128,
max_pixels 576, saved as tests/fixtures/hf/qwen2_vl_processor/preprocessor_config.json) made
of the five PNGs (tools/make_qwen2_vl_fixtures.py): the library's rows of patches and grids
are the same, bit for bit."""
from pathlib import Path

import numpy as np
import pytest

from scratchllm.specs.vision import ImageProcessorSpec, SmartResizeSpec
from scratchllm.vision.dynamic import flatten_patches, preprocess_patches, smart_resize
from scratchllm.vision.preprocess import image_processor_spec, load_image_processor, preprocess

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IMAGES = FIXTURES / "images"
NAMES = ["rgb", "rgb_large", "rgba", "gray", "palette"]


def test_pixel_values_and_grids_equal_transformers():
    spec = load_image_processor(FIXTURES / "hf" / "qwen2_vl_processor")
    assert (spec.patch_size, spec.merge_size, spec.min_pixels, spec.max_pixels) == (
        4, 2, 128, 576)
    pixel_values, grid = preprocess_patches([IMAGES / f"{n}.png" for n in NAMES], spec)
    want = np.load(IMAGES / "qwen2_vl.npz")
    assert np.array_equal(grid, want["image_grid_thw"]) and grid.dtype == np.int64
    assert pixel_values.dtype == np.float32 and np.array_equal(pixel_values,
                                                               want["pixel_values"])


def test_smart_resize_branches():
    assert smart_resize(37, 29, 8, 128, 576) == (24, 16)  # shrinks: 40 x 32 > 576
    assert smart_resize(10, 7, 8, 128, 576) == (16, 16)  # grows: 8 x 8 < 128
    assert smart_resize(224, 224) == (224, 224)
    with pytest.raises(ValueError, match="aspect ratio over 200"):
        smart_resize(1, 300)


def test_flatten_patches_layout():
    """Row r of merge group (i, j) is patch (i*m + a, j*m + b), its pixels repeated T times."""
    spec = SmartResizeSpec(patch_size=2, merge_size=2, temporal_patch_size=2)
    x = np.arange(3 * 4 * 8, dtype=np.float32).reshape(3, 4, 8)
    rows, grid = flatten_patches(x, spec)
    assert grid == (1, 2, 4) and rows.shape == (8, 3 * 2 * 2 * 2)
    r = rows.reshape(1, 2, 2, 2, 3, 2, 2, 2)  # (gh/m, gw/m, a, b, C, T, P, P)
    np.testing.assert_array_equal(r[0, 1, 1, 0, :, 1], x[:, 2:4, 4:6])
    np.testing.assert_array_equal(r[0, 1, 1, 0, :, 0], r[0, 1, 1, 0, :, 1])
    with pytest.raises(ValueError, match="multiples of patch_size . merge_size = 4"):
        flatten_patches(np.zeros((3, 6, 8)), spec)


def test_config_keys_and_errors():
    spec = image_processor_spec({"image_processor_type": "Qwen2VLImageProcessor",
                                 "min_pixels": 64, "size": {"shortest_edge": 32,
                                                            "longest_edge": 1024}})
    assert (spec.min_pixels, spec.max_pixels, spec.image.resample) == (64, 1024, 3)
    with pytest.raises(TypeError, match="call vision.dynamic.preprocess_patches"):
        preprocess([IMAGES / "rgb.png"], spec)
    with pytest.raises(TypeError, match="spec must be a SmartResizeSpec"):
        preprocess_patches([IMAGES / "rgb.png"], ImageProcessorSpec())
    with pytest.raises(ValueError, match="min_pixels=600 exceeds max_pixels=500"):
        SmartResizeSpec(min_pixels=600, max_pixels=500)
