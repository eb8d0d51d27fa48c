"""The ReLU MLP without biases: T5's DenseReluDense (Raffel et al. 2019, arXiv 1910.10683;
feed_forward_proj "relu"), the original Transformer's FFN (Vaswani et al. 2017, 3.3) minus
its biases.

Math:  h = x W1,  a = max(h, 0),  y = a W2.
Backward: dW2 = a^T dy, da = dy W2^T, dh = da [h > 0], dW1 = x^T dh, dx = dh W1^T (the
linear pair twice; ReLU's derivative is the indicator of h > 0, 0 at the kink h = 0 as
torch's).

Reference: huggingface/transformers src/transformers/models/t5/modeling_t5.py
(T5DenseActDense: wi, act, wo). Glossary: D model width, F hidden width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.ops import LinearCache, linear_backward, linear_forward, linear_out
from scratchllm.core.validate import expect_dout, expect_float, expect_linear


class ReluMLPCache(NamedTuple):
    up: LinearCache
    on: np.ndarray  # (..., F) h > 0
    down: LinearCache


def relu_mlp_forward(x, W1, W2):
    """y = max(x @ W1, 0) @ W2.

    Inputs:  x (..., D), W1 (D, F), W2 (F, D).
    Returns: y (..., D).  Cache: the two linear caches and where h > 0.
    """
    expect_float("relu_mlp", "x", x, 1)
    expect_linear("relu_mlp", x.shape[-1], W1, names=("W1",))
    expect_linear("relu_mlp", W1.shape[1], W2, names=("W2",), d_out=x.shape[-1])
    h, up = linear_forward(x, W1)  # (..., F)
    on = h > 0  # (..., F)
    y, down = linear_forward(np.where(on, h, 0).astype(h.dtype, copy=False), W2)  # (..., D)
    return y, ReluMLPCache(up, on, down)


def relu_mlp_backward(dy, cache):
    """Reverse of the forward through the smaller pairs (linear, relu, linear)."""
    expect_dout("relu_mlp_backward", dy, *linear_out(cache.down), name="dy")
    g_down = linear_backward(dy, cache.down)  # fwd: y = a @ W2
    dh = np.where(cache.on, g_down["x"], 0).astype(dy.dtype, copy=False)  # fwd: a = relu(h)
    g_up = linear_backward(dh, cache.up)  # fwd: h = x @ W1
    return {"x": g_up["x"], "W1": g_up["W"], "W2": g_down["W"]}
