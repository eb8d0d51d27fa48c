"""Qwen2-VL's patch merger (Wang et al. 2024, arXiv 2409.12191, section 2.1): the vision
tower's patch vectors, m x m neighbours at a time, become one token of the language model.

    h = layernorm(x)                   x (N, C), rows in merge-group order (dynamic.py)
    z = h.reshape(N / m^2, m^2 C)      the m^2 neighbours of a group side by side
    y = gelu(z W1 + b1) W2 + b2        (N / m^2, D)
The preprocessing already put each group's m^2 patches in consecutive rows, so gathering the
neighbours is a reshape. Backward: gelu_mlp's, the reshape undone, layernorm's.
Reference: huggingface/transformers src/transformers/models/qwen2_vl/modeling_qwen2_vl.py
(PatchMerger).

Glossary: N patches, C tower width, m merge size, D language model width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.gelu import gelu_mlp_backward, gelu_mlp_forward
from scratchllm.core.norms import layernorm_backward, layernorm_forward
from scratchllm.core.ops import linear_out
from scratchllm.core.validate import (expect_dout, expect_float, expect_linear, expect_ndim,
                                      expect_shape)
from scratchllm.specs.vision import MergerSpec


class MergerWeights(NamedTuple):
    """g, b (C,) the LayerNorm; W1 (m^2 C, m^2 C), b1 (m^2 C,), W2 (m^2 C, D), b2 (D,)."""
    g: np.ndarray
    b: np.ndarray
    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray


class MergerCache(NamedTuple):
    norm: tuple
    mlp: tuple
    shape: tuple  # x's


def patch_merger_forward(x, w, *, spec):
    """Inputs:  x (N, C) float, N a multiple of m^2 (spec.merge_size = m); w MergerWeights;
             spec a MergerSpec.
    Returns: y (N / m^2, D).  Cache: MergerCache (layernorm's, gelu_mlp's, x's shape)."""
    if not isinstance(spec, MergerSpec):
        raise TypeError(f"patch_merger: spec must be a MergerSpec, got {type(spec).__name__}")
    expect_ndim("patch_merger", "x", x, 2, "(N, C)")
    expect_float("patch_merger", "x", x)
    N, C = x.shape
    g = spec.merge_size ** 2
    if N % g:
        raise ValueError(f"patch_merger: x has {N} patch rows, expected a multiple of "
                         f"merge_size^2 = {g}")
    if not isinstance(w, MergerWeights):
        raise TypeError(f"patch_merger: w must be a MergerWeights, got {type(w).__name__}")
    for name in ("g", "b"):
        expect_float("patch_merger", name, getattr(w, name))
        expect_shape("patch_merger", name, getattr(w, name), (C,), "(C,), C = x.shape[1]")
    for name in ("W1", "b1", "W2", "b2"):
        expect_float("patch_merger", name, getattr(w, name))
    expect_linear("patch_merger", g * C, w.W1, w.b1, ("W1", "b1"), d_out=g * C)
    expect_linear("patch_merger", g * C, w.W2, w.b2, ("W2", "b2"))
    h, norm = layernorm_forward(x, w.g, w.b, spec.eps)  # (N, C)
    y, mlp = gelu_mlp_forward(h.reshape(N // g, g * C), w.W1, w.b1, w.W2, w.b2,
                              approximate=spec.gelu_approx)  # (N/m^2, D)
    return y, MergerCache(norm, mlp, x.shape)


def patch_merger_backward(dy, cache):
    """Math: the chain of the forward: gelu_mlp's backward gives dz (N/m^2, m^2 C), the
    reshape undone gives dh (N, C), layernorm's backward gives dx, dg, db.
    Returns {"x": dx (N, C), "w": MergerWeights of gradients}."""
    norm, mlp, shape = cache
    expect_dout("patch_merger_backward", dy, *linear_out(mlp.down), name="dy")
    g_mlp = gelu_mlp_backward(dy, mlp)  # fwd: y = mlp(z)
    g_norm = layernorm_backward(g_mlp["x"].reshape(shape), norm)  # fwd: z = layernorm(x) viewed
    return {"x": g_norm["x"], "w": MergerWeights(g_norm["g"], g_norm["b"], g_mlp["W1"],
                                                 g_mlp["b1"], g_mlp["W2"], g_mlp["b2"])}
