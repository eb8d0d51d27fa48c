"""The patch embedding of a Vision Transformer (Dosovitskiy et al. 2020, arXiv 2010.11929,
eq. 1) as two pairs that compute the same map two ways:

    conv2d        y[b, oy, ox, :] = sum_{c, i, j} x[b, c, S oy + i, S ox + j] K[c, i, j, :] + bias
                  a valid convolution with kernel K x K and stride S, summed over the K^2
                  kernel offsets (each offset one matmul over the channels)
    patch_embed   cut x into P x P patches, flatten each (channel-major: c, i, j, as torch's
                  Conv2d weight (D, C, P, P) flattens), y = patches @ W + b: one matmul
With S = K = P and K = W.reshape(C, P, P, D) they are equal (tests/vision/test_patch.py), so a
checkpoint's Conv2d weight (D, C, P, P) is W^T reshaped. Backward of the linear map: the
linear backward, then the patch gradients put back where the patches came from (patchify is a
permutation of the pixels, its backward the inverse permutation). Backward of the
convolution: each kernel offset's matmul backward, dx scattered to the pixels it read.

Glossary: B batch, C channels, H, W image height and width, P patch side (K kernel side,
S stride), N = (H/P)(W/P) patches, D model width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.ops import linear_backward, linear_forward, linear_out
from scratchllm.core.validate import (expect_dout, expect_float, expect_integer, expect_linear,
                                      expect_ndim, expect_shape)


class PatchWeights(NamedTuple):
    """The patch embedding's arrays: W (C P P, D) the flattened-patch map, b (D,) or None."""
    W: np.ndarray
    b: np.ndarray


def _expect_image(fn, x, spec):
    expect_float(fn, "x", x, 4)
    C, (H, W) = spec.n_channels, spec.image_size
    expect_shape(fn, "x", x, (None, C, H, W), "(B, C, H, W): spec.n_channels, spec.image_size")


def check_patch_inputs(fn, x, w, spec):
    """x (B, C, H, W) of the spec's image size; w.W (C P P, D) and w.b (D,) or None, checked
    under the caller's name `fn`."""
    _expect_image(fn, x, spec)
    expect_float(fn, "W", w.W)
    expect_linear(fn, spec.patch_dim, w.W, w.b)


def patchify(x, P):
    """x (B, C, H, W) -> patches (B, N, C P P), rows in row-major patch order, each patch
    flattened channel-major (c, i, j)."""
    B, C, H, W = x.shape
    p = x.reshape(B, C, H // P, P, W // P, P)  # (B, C, H/P, P, W/P, P)
    return p.transpose(0, 2, 4, 1, 3, 5).reshape(B, (H // P) * (W // P), C * P * P)


def unpatchify(patches, C, H, W, P):
    """The inverse of patchify: patches (B, N, C P P) -> x (B, C, H, W)."""
    B = patches.shape[0]
    p = patches.reshape(B, H // P, W // P, C, P, P)  # (B, H/P, W/P, C, P, P)
    return p.transpose(0, 3, 1, 4, 2, 5).reshape(B, C, H, W)


class PatchCache(NamedTuple):
    lin: tuple
    shape: tuple   # (C, H, W, P)


def patch_embed_forward(x, w, *, spec):
    """Patch embedding as a linear map of flattened patches: y = patchify(x) @ W + b.

    Inputs:  x (B, C, H, W) pixel values; w PatchWeights (W (C P P, D), b (D,)); spec a
             PatchSpec (image_size, patch_size, n_channels).
    Returns: y (B, N, D), patches in row-major order (torch's conv(x).flatten(2).mT).
    Cache:   the linear's cache (the patches, W) and the image shape.
    """
    check_patch_inputs("patch_embed", x, w, spec)
    P = spec.patch_size
    _, C, H, W = x.shape
    y, lin = linear_forward(patchify(x, P), w.W, w.b)  # (B, N, D)
    return y, PatchCache(lin, (C, H, W, P))


def patch_embed_backward(dy, cache):
    """Math: dpatches = dy W^T, dW = patches^T dy, db = sum dy (linear_backward); dx =
    unpatchify(dpatches) (patchify permutes pixels, so its backward permutes them back).
    Returns {"x": dx (B, C, H, W), "w": PatchWeights(dW, db)}.
    Reference: Dosovitskiy et al. 2020 (arXiv 2010.11929) eq. 1."""
    lin, (C, H, W, P) = cache
    expect_dout("patch_embed_backward", dy, *linear_out(lin), name="dy")
    g = linear_backward(dy, lin)  # fwd: y = patches @ W + b
    dx = unpatchify(g["x"], C, H, W, P)  # fwd: patches = patchify(x)   (B, C, H, W)
    return {"x": dx, "w": PatchWeights(g["W"], g.get("b"))}


# ---------------------------------------------------------------------------- convolution
class ConvWeights(NamedTuple):
    """A 2-D convolution's arrays: kernel (C, K, K, D) (input channel, row, column, output
    channel: x @ W's layout per offset), b (D,) or None."""
    kernel: np.ndarray
    b: np.ndarray = None


class Conv2dCache(NamedTuple):
    x: np.ndarray
    kernel: np.ndarray
    has_bias: bool
    stride: int


def _offsets(x, K, S, Ho, Wo):
    """For each kernel offset (i, j): the pixels it reads, x[:, :, S oy + i, S ox + j] as a
    view (B, C, Ho, Wo)."""
    for i in range(K):
        for j in range(K):
            yield i, j, x[:, :, i:i + S * (Ho - 1) + 1:S, j:j + S * (Wo - 1) + 1:S]


def conv2d_forward(x, w, *, stride):
    """A valid 2-D convolution (no padding) with stride S, summed over the kernel offsets.

    Inputs:  x (B, C, H, W); w ConvWeights (kernel (C, K, K, D), b (D,) or None); stride S.
    Returns: y (B, Ho, Wo, D), Ho = (H - K) // S + 1 (Wo likewise): channels last, so
             y.reshape(B, Ho Wo, D) is a token sequence.
    Cache:   (x, kernel, has_bias, stride).
    """
    fn = "conv2d"
    expect_float(fn, "x", x, 4)
    expect_ndim(fn, "x", x, 4, "(B, C, H, W)")
    expect_ndim(fn, "kernel", w.kernel, 4, "(C, K, K, D)")
    expect_integer(fn, "stride", stride, 1)
    B, C, H, W = x.shape
    K = w.kernel.shape[1]
    expect_shape(fn, "kernel", w.kernel, (C, K, K, None), "(C, K, K, D), C = x.shape[1]")
    if K > min(H, W):
        raise ValueError(f"conv2d: kernel side {K} exceeds the image ({H} x {W})")
    Ho, Wo = (H - K) // stride + 1, (W - K) // stride + 1
    y = np.zeros((B, Ho, Wo, w.kernel.shape[3]), np.result_type(x, w.kernel))  # (B, Ho, Wo, D)
    for i, j, xs in _offsets(x, K, stride, Ho, Wo):
        y += np.einsum("bchw,cd->bhwd", xs, w.kernel[:, i, j])  # (B, Ho, Wo, D)
    if w.b is not None:
        expect_shape(fn, "b", w.b, (w.kernel.shape[3],), "(D,)")
        y += w.b
    return y, Conv2dCache(x, w.kernel, w.b is not None, stride)


def conv2d_backward(dy, cache):
    """Math: per kernel offset (i, j), fwd y += xs_ij @ kernel[:, i, j], so
    dkernel[:, i, j] = sum_{b, oy, ox} xs_ij^T dy and dx[:, :, S oy + i, S ox + j] +=
    dy kernel[:, i, j]^T (overlapping windows, S < K, add up); db = sum dy.
    Returns {"x": dx, "w": ConvWeights(dkernel, db or None)}.
    Reference: Dumoulin & Visin 2016, "A guide to convolution arithmetic" (arXiv 1603.07285)."""
    x, kernel, has_bias, S = cache
    B, C, H, W = x.shape
    K, D = kernel.shape[1], kernel.shape[3]
    Ho, Wo = (H - K) // S + 1, (W - K) // S + 1
    expect_dout("conv2d_backward", dy, (B, Ho, Wo, D), np.result_type(x, kernel), name="dy")
    dx = np.zeros_like(x)  # (B, C, H, W)
    dkernel = np.zeros_like(kernel)  # (C, K, K, D)
    for i, j, xs in _offsets(x, K, S, Ho, Wo):
        dkernel[:, i, j] = np.einsum("bchw,bhwd->cd", xs, dy)  # fwd: y += xs @ kernel[:, i, j]
        dx[:, :, i:i + S * (Ho - 1) + 1:S, j:j + S * (Wo - 1) + 1:S] += np.einsum(
            "bhwd,cd->bchw", dy, kernel[:, i, j])  # (B, C, Ho, Wo)
    db = dy.reshape(-1, D).sum(axis=0) if has_bias else None  # (D,)
    return {"x": dx, "w": ConvWeights(dkernel, db)}
