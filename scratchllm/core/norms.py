"""LayerNorm as a forward/backward pair (Ba, Kiros & Hinton 2016, arXiv 1607.06450), the norm
of GPT-2 and BERT; RMSNorm (ops.py) is the same without the mean and the bias.

Math, over the last axis of D features:
    mu = mean(x),  xc = x - mu,  r = (mean(xc^2) + eps)^-1/2,  xhat = xc r
    y = xhat * g + b                      (b optional: LayerNorm without bias)
Backward (derived below in layernorm_backward): with dxhat = dy * g,
    dx = r (dxhat - mean(dxhat) - xhat mean(dxhat * xhat)),  dg = sum dy xhat,  db = sum dy

Letters (README glossary): D features; leading axes are any batch of rows.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import expect_dout, expect_finite, expect_float, expect_shape


class LayerNormCache(NamedTuple):
    xhat: np.ndarray
    g: np.ndarray
    rstd: np.ndarray
    has_bias: bool


def layernorm_forward(x, g, b=None, eps=1e-5):
    """y = (x - mean(x)) / sqrt(var(x) + eps) * g + b over the last axis (var: biased, 1/D).

    Inputs:  x (..., D), g (D,), b (D,) or None.
    Returns: y (..., D).  Cache: (xhat, g, rstd, has_bias).
    """
    expect_float("layernorm", "x", x, 1)
    expect_shape("layernorm", "g", g, (x.shape[-1],), "the last axis of x")
    eps = expect_finite("layernorm", "eps", eps, 0, open_low=True)
    xc = x - np.mean(x, axis=-1, keepdims=True)  # (..., D)
    rstd = 1.0 / np.sqrt(np.mean(xc * xc, axis=-1, keepdims=True) + eps)  # (..., 1)
    xhat = xc * rstd  # (..., D)
    y = xhat * g  # (..., D)
    if b is not None:
        expect_shape("layernorm", "b", b, (x.shape[-1],), "the last axis of x")
        y = y + b  # (..., D)
    return y, LayerNormCache(xhat, g, rstd, b is not None)


def layernorm_backward(dy, cache):
    """Math: y = xhat g + b -> dg = sum_rows dy xhat, db = sum_rows dy, dxhat = dy g.
    xhat = (x - mu) r depends on x directly, through mu (d mu/dx_j = 1/D) and through
    r (dr/dx_j = -r^3 xc_j / D, using sum(xc) = 0), so
        dx_j = r dxhat_j - r mean(dxhat) - xhat_j r mean(dxhat * xhat).
    Reference: Ba et al. 2016 (arXiv 1607.06450); karpathy/llm.c train_gpt2.c
    layernorm_backward.
    """
    expect_dout("layernorm_backward", dy, cache.xhat.shape, np.result_type(cache.xhat, cache.g),
                name="dy")
    xhat, g, rstd, has_bias = cache
    D = xhat.shape[-1]
    dxhat = dy * g  # (..., D)
    dx = rstd * (dxhat - np.mean(dxhat, axis=-1, keepdims=True)
                 - xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True))  # (..., D)
    grads = {"x": dx, "g": (dy * xhat).reshape(-1, D).sum(axis=0)}  # (D,)
    if has_bias:
        grads["b"] = dy.reshape(-1, D).sum(axis=0)  # (D,)
    return grads
