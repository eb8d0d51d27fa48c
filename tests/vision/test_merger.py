"""Qwen2-VL's patch merger against transformers' PatchMerger in float64
(tests/fixtures/hf/qwen2_vl_merger.npz, tools/make_qwen2_vl_fixtures.py): output within 1e-12,
the gradients of x and of every parameter within 1e-12."""
from pathlib import Path

import numpy as np
import pytest

from scratchllm.specs.vision import MergerSpec
from scratchllm.vision.merger import MergerWeights, patch_merger_backward, patch_merger_forward

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2_vl_merger.npz"
# MergerWeights field -> (PatchMerger parameter, transposed: torch's Linear keeps (out, in))
NAMES = {"g": ("ln_q.weight", False), "b": ("ln_q.bias", False),
         "W1": ("mlp.0.weight", True), "b1": ("mlp.0.bias", False),
         "W2": ("mlp.2.weight", True), "b2": ("mlp.2.bias", False)}


def test_equal_to_transformers():
    f = np.load(FIXTURE)
    w = MergerWeights(*(f[n].T if t else f[n] for n, t in NAMES.values()))
    y, cache = patch_merger_forward(f["x"], w, spec=MergerSpec())
    np.testing.assert_allclose(y, f["y"], rtol=0, atol=1e-12)
    g = patch_merger_backward(f["G"], cache)
    np.testing.assert_allclose(g["x"], f["grad/x"], rtol=0, atol=1e-12)
    for field, (name, t) in NAMES.items():
        got = getattr(g["w"], field)
        np.testing.assert_allclose(got.T if t else got, f["grad/" + name], rtol=0, atol=1e-12)


def test_rows_must_fill_the_groups():
    w = MergerWeights(np.ones(2), np.zeros(2), np.eye(8), np.zeros(8), np.ones((8, 3)),
                      np.zeros(3))
    with pytest.raises(ValueError, match="6 patch rows, expected a multiple of merge_size.2 = 4"):
        patch_merger_forward(np.zeros((6, 2)), w, spec=MergerSpec())
    with pytest.raises(TypeError, match="spec must be a MergerSpec"):
        patch_merger_forward(np.zeros((4, 2)), w, spec=None)
