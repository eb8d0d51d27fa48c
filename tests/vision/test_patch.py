"""The patch embedding two ways: a stride-P convolution (conv2d, summed over kernel offsets)
and one matmul of flattened patches (patch_embed) are the same map, forward and backward;
patchify and unpatchify are inverse permutations; the specs refuse what a ViT cannot be."""
import numpy as np
import pytest

from scratchllm.specs import AttentionSpec, LayerSpec, Mask
from scratchllm.specs.vision import PatchSpec, VisionConfig
from scratchllm.vision import (ConvWeights, PatchWeights, conv2d_backward, conv2d_forward,
                               patch_embed_backward, patch_embed_forward, patchify, unpatchify)


def test_stride_p_convolution_equals_the_linear_map_of_flattened_patches():
    rng = np.random.default_rng(0)
    spec = PatchSpec(image_size=(10, 15), patch_size=5, n_channels=3)
    x = rng.standard_normal((2, 3, 10, 15))  # (B, C, H, W)
    W, b = rng.standard_normal((spec.patch_dim, 7)), rng.standard_normal(7)  # (C P P, D)
    y, c_lin = patch_embed_forward(x, PatchWeights(W, b), spec=spec)  # (B, N, D)
    kernel = W.reshape(3, 5, 5, 7)  # (C, P, P, D): torch's Conv2d weight (D, C, P, P), permuted
    z, c_conv = conv2d_forward(x, ConvWeights(kernel, b), stride=5)  # (B, 2, 3, D)
    assert y.shape == (2, spec.n_patches, 7)
    np.testing.assert_allclose(y, z.reshape(2, 6, 7), rtol=0, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    g_lin = patch_embed_backward(dy, c_lin)
    g_conv = conv2d_backward(dy.reshape(z.shape), c_conv)
    np.testing.assert_allclose(g_lin["x"], g_conv["x"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(g_lin["w"].W, g_conv["w"].kernel.reshape(W.shape), atol=1e-11)
    np.testing.assert_allclose(g_lin["w"].b, g_conv["w"].b, atol=1e-12)


def test_patchify_is_a_permutation_and_unpatchify_its_inverse():
    x = np.arange(2 * 3 * 4 * 6, dtype=np.float64).reshape(2, 3, 4, 6)
    p = patchify(x, 2)  # (2, 6, 12)
    assert p.shape == (2, 6, 12)
    assert sorted(p.ravel()) == sorted(x.ravel())
    assert np.array_equal(p[1, 4], x[1, :, 2:4, 2:4].ravel())  # row 1, column 2: channel-major
    assert np.array_equal(unpatchify(p, 3, 4, 6, 2), x)


def test_conv2d_with_overlap_matches_a_direct_sum():
    rng = np.random.default_rng(1)
    x, kernel = rng.standard_normal((1, 2, 6, 7)), rng.standard_normal((2, 3, 3, 4))
    y, _ = conv2d_forward(x, ConvWeights(kernel), stride=2)  # (1, 2, 3, 4)
    direct = np.array([[[np.einsum("cij,cijd->d", x[0, :, 2 * a:2 * a + 3, 2 * c:2 * c + 3],
                                   kernel) for c in range(3)] for a in range(2)]])
    np.testing.assert_allclose(y, direct, atol=1e-12)


def test_specs_refuse_what_a_vision_transformer_cannot_be():
    with pytest.raises(ValueError, match="multiple of patch_size"):
        PatchSpec(image_size=(10, 12), patch_size=5)
    with pytest.raises(ValueError, match="Mask\\(causal=False\\)"):
        VisionConfig(d_model=8, patch=PatchSpec((8, 8), 4), layers=(LayerSpec(),))
    layer = LayerSpec(AttentionSpec(2, 2, rope=None, mask=Mask(causal=False)))
    with pytest.raises(ValueError, match="reads the \\[CLS\\] vector"):
        VisionConfig(d_model=8, patch=PatchSpec((8, 8), 4, cls_token=False), layers=(layer,),
                     n_labels=3)


def test_n_params_counts_the_model():
    from grads.cases.vision import vision_tiny
    from scratchllm.vision import VisionTransformer
    for cfg in (vision_tiny(5, True, "none"), vision_tiny(0, False, "tanh"),
                vision_tiny(0, False, "tanh", pool=True), vision_tiny(0, True, "quick",
                                                                      clip=True)):
        model = VisionTransformer(cfg, rng=np.random.default_rng(0))
        assert model.n_params() == cfg.n_params()
