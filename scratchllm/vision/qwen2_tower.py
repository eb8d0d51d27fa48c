"""Qwen2-VL's vision tower (Wang et al. 2024, arXiv 2409.12191, section 2.1) on the library's
one Block, with its patch merger: the patch rows of any number of images of any sizes, in one
packed sequence, each image attending only itself.

    x_0 = pixel_values W_patch                      (N, Dv)   Conv3d (T, P, P), no bias:
                                                              a linear map of each patch row
    x_l = block_l(x_{l-1})                          l = 1..L  bidirectional attention with the
                                                              axial 2-D RoPE at (h, w), the
                                                              images packed (Packing: each
                                                              frame its own document), LayerNorm,
                                                              a GELU MLP (quick_gelu)
    y = merger(x_L)                                 (N / m^2, Dt) patch_merger (merger.py)
The rows come in merge-group order (dynamic.py), image by image as image_grid_thw lists them;
the positions (vision_positions) are the patch's (h, w, h) rows of M-RoPE with sections
(Dh/4, Dh/4) and RopeSpec.axial. Backward: the same chain in reverse.
Reference: huggingface/transformers src/transformers/models/qwen2_vl/modeling_qwen2_vl.py
(PatchEmbed, Qwen2VLVisionBlock, Qwen2VisionTransformerPretrainedModel, PatchMerger).

Glossary: N patches, C channels, T temporal patch size, P patch side, m merge size, Dv the
tower's width, Dt the language model's, L blocks.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Linear, Module, Param, normal_init
from scratchllm.core.validate import expect_float, expect_ndim
from scratchllm.lm import Block
from scratchllm.lm.block import Packing
from scratchllm.specs.vision_lm import Qwen2VLConfig
from scratchllm.vision.merger import MergerWeights, patch_merger_backward, patch_merger_forward
from scratchllm.vision.mrope import frame_ids, vision_positions


class PatchMerger(Module):
    """The Params of patch_merger (g, b the LayerNorm; W1, b1, W2, b2 the MLP) and the calls
    of its pair; the gains start at 1, matrices ~ N(0, 1/d_in), biases at 0."""

    def __init__(self, d_in, d_out, spec, *, rng, dtype=np.float32):
        G = spec.merge_size ** 2 * d_in
        self.g, self.b = Param(np.ones(d_in, dtype)), Param(np.zeros(d_in, dtype))
        self.W1 = Param(normal_init(rng, (G, G), G ** -0.5, dtype))
        self.b1 = Param(np.zeros(G, dtype))
        self.W2 = Param(normal_init(rng, (G, d_out), G ** -0.5, dtype))
        self.b2 = Param(np.zeros(d_out, dtype))
        self.spec = spec

    def forward(self, x):
        """x (N, Dv) -> (y (N / m^2, Dt), cache)."""
        w = MergerWeights(*(getattr(self, n).data for n in MergerWeights._fields))
        return patch_merger_forward(x, w, spec=self.spec)

    def backward(self, dy, cache):
        """Adds the Params' gradients; returns dx (N, Dv)."""
        g = patch_merger_backward(dy, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))


class TowerCache(NamedTuple):
    patch: tuple
    blocks: list
    merger: tuple


def image_packing(image_grid_thw, merge_size):
    """The Packing of the tower's one row of N patches: doc_ids (1, N) the frame of each
    (frame_ids: a still image is one frame), positions (3, 1, N) (vision_positions)."""
    return Packing(frame_ids(image_grid_thw)[None],  # (1, N)
                   vision_positions(image_grid_thw, merge_size)[:, None])  # (3, 1, N)


class Qwen2VisionTower(Module):
    """The tower of a Qwen2VLConfig (Params: patch, layers, merger)."""

    def __init__(self, cfg, *, rng, dtype=np.float32):
        if not isinstance(cfg, Qwen2VLConfig):
            raise TypeError(f"Qwen2VisionTower: cfg must be a Qwen2VLConfig, got "
                            f"{type(cfg).__name__}")
        self.cfg = cfg
        Dv = cfg.d_vision
        self.patch = Linear(cfg.patch_dim, Dv, rng=rng, dtype=dtype)
        self.layers = [Block(Dv, spec, rng=rng, dtype=dtype) for spec in cfg.layers]
        self.merger = PatchMerger(Dv, cfg.text.d_model, cfg.merger, rng=rng, dtype=dtype)

    def forward(self, pixel_values, image_grid_thw):
        """pixel_values (N, C*T*P*P) (preprocess_patches'), image_grid_thw (n_images, 3) rows
        (t, h, w) with N = sum(t h w) -> (merged tokens (N / m^2, Dt), TowerCache)."""
        fn = "Qwen2VisionTower"
        expect_ndim(fn, "pixel_values", pixel_values, 2, "(N, C*T*P*P)")
        expect_float(fn, "pixel_values", pixel_values)
        grids = np.asarray(image_grid_thw)
        if grids.ndim != 2 or grids.shape[1] != 3 or grids.dtype.kind not in "iu":
            raise ValueError(f"{fn}: image_grid_thw must be (n_images, 3) ints (t, h, w), got "
                             f"{grids.dtype} {grids.shape}")
        N, K = pixel_values.shape
        if N != grids.prod(axis=1).sum() or K != self.cfg.patch_dim:
            raise ValueError(f"{fn}: pixel_values has shape {pixel_values.shape}, expected "
                             f"({grids.prod(axis=1).sum()}, {self.cfg.patch_dim}): one row "
                             f"of C*T*P*P per patch of image_grid_thw {grids.tolist()}")
        packing = image_packing(grids, self.cfg.merger.merge_size)
        x, c_patch = self.patch.forward(pixel_values.astype(self.patch.W.data.dtype))  # (N, Dv)
        x, blocks = x[None], []  # (1, N, Dv)
        for layer in self.layers:
            x, c = layer.forward(x, packing=packing)  # (1, N, Dv)
            blocks.append(c)
        y, c_merge = self.merger.forward(x[0])  # (N / m^2, Dt)
        return y, TowerCache(c_patch, blocks, c_merge)

    def backward(self, dy, cache, blocks=True):
        """dy (N / m^2, Dt) -> Param grads (+=); returns d pixel_values (N, C*T*P*P), or with
        blocks=False None: the merger's backward alone (the blocks and patch map frozen)."""
        dx = self.merger.backward(dy, cache.merger)[None]  # fwd: y = merger(x_L)  (1, N, Dv)
        if not blocks:
            return None
        for layer, c in zip(reversed(self.layers), reversed(cache.blocks)):
            dx = layer.backward(dx, c)  # fwd: x_l = block_l(x_{l-1})
        return self.patch.backward(dx[0], cache.patch)  # fwd: x_0 = pixel_values W
