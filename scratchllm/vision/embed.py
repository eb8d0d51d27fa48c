"""A Vision Transformer's input tokens: the patch embedding, the [CLS] vector and the learned
position table (Dosovitskiy et al. 2020, arXiv 2010.11929, eq. 1):

    z_0 = [x_cls ; patches(x) W + b] + E_pos        (ViT: N + 1 tokens)
    z_0 =          patches(x) W + b  + E_pos        (SigLIP, no [CLS]: N tokens)
Backward: E_pos gets the sum over the batch of dz, x_cls the sum of its row, and the patch
rows go through patch_embed_backward.

Glossary: B batch, C channels, H, W image size, N patches, N' = N (+ 1 with [CLS]) tokens,
D model width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.validate import expect_dout, expect_shape
from scratchllm.vision.patch import (PatchWeights, check_patch_inputs, patch_embed_backward,
                                     patch_embed_forward)


class VisionEmbedWeights(NamedTuple):
    """W (C P P, D), b (D,) (None without spec.patch_bias): the patch map; cls (D,) the
    [CLS] vector (None without spec.cls_token); pos (N', D) the position table."""
    W: np.ndarray
    b: np.ndarray
    cls: np.ndarray
    pos: np.ndarray


class VisionEmbedCache(NamedTuple):
    patch: tuple
    out_shape: tuple
    dtype: object
    cls_token: bool


def vision_embed_forward(x, w, *, spec):
    """z = [cls ; patch_embed(x)] + pos.

    Inputs:  x (B, C, H, W) pixel values; w VisionEmbedWeights; spec a PatchSpec (its
             cls_token says whether w.cls is given).
    Returns: z (B, N', D).  Cache: the patch embedding's cache and z's shape.
    """
    fn = "vision_embed"
    for name, on in (("cls", spec.cls_token), ("b", spec.patch_bias)):
        if (getattr(w, name) is None) == on:
            raise ValueError(f"{fn}: the spec {'asks for' if on else 'has no'} {name}, but "
                             f"w.{name} is {'None' if on else 'given'}")
    check_patch_inputs(fn, x, PatchWeights(w.W, w.b), spec)
    p, c_patch = patch_embed_forward(x, PatchWeights(w.W, w.b), spec=spec)  # (B, N, D)
    B, N, D = p.shape
    expect_shape(fn, "pos", w.pos, (spec.n_positions, D), "(N', D): N (+ 1 with [CLS]) rows")
    if spec.cls_token:
        expect_shape(fn, "cls", w.cls, (D,), "(D,)")
        p = np.concatenate([np.broadcast_to(w.cls, (B, 1, D)), p], axis=1)  # (B, N + 1, D)
    z = p + w.pos  # (B, N', D)
    return z, VisionEmbedCache(c_patch, z.shape, z.dtype, spec.cls_token)


def vision_embed_backward(dz, cache):
    """Math: dpos = sum_b dz; dcls = sum_b dz[:, 0] (with [CLS]); the patch rows dz[:, 1:]
    (all rows without [CLS]) into patch_embed_backward.
    Returns {"x": dx, "w": VisionEmbedWeights(dW, db, dcls or None, dpos)}.
    Reference: Dosovitskiy et al. 2020 (arXiv 2010.11929) eq. 1."""
    c_patch, shape, dtype, cls_token = cache
    expect_dout("vision_embed_backward", dz, shape, dtype, name="dz")
    dpos = dz.sum(axis=0)  # fwd: z = p + pos (broadcast over B)   (N', D)
    dcls = dz[:, 0].sum(axis=0) if cls_token else None  # fwd: p = [cls ; ...]   (D,)
    g = patch_embed_backward(np.ascontiguousarray(dz[:, 1:] if cls_token else dz), c_patch)
    return {"x": g["x"], "w": VisionEmbedWeights(g["w"].W, g["w"].b, dcls, dpos)}


class VisionEmbedding(Module):
    """The Params of vision_embed (W, b, cls, pos) and the calls of its pair; W ~ N(0, 1/CPP),
    cls and pos ~ N(0, 0.02^2)."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        D = d_model
        self.W = Param(normal_init(rng, (spec.patch_dim, D), spec.patch_dim ** -0.5, dtype))
        self.b = Param(np.zeros(D, dtype)) if spec.patch_bias else None
        self.cls = Param(normal_init(rng, (D,), 0.02, dtype)) if spec.cls_token else None
        self.pos = Param(normal_init(rng, (spec.n_positions, D), 0.02, dtype))
        self.spec = spec

    def _weights(self):
        return VisionEmbedWeights(*(None if p is None else p.data
                                    for p in (self.W, self.b, self.cls, self.pos)))

    def forward(self, x):
        """x (B, C, H, W) -> (z (B, N', D), cache)."""
        return vision_embed_forward(x, self._weights(), spec=self.spec)

    def backward(self, dz, cache):
        """Adds the Params' gradients; returns dx (B, C, H, W)."""
        g = vision_embed_backward(dz, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))
