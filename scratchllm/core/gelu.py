"""GELU (Hendrycks & Gimpel 2016, arXiv 1606.08415), the GPT-2 MLP and the GeGLU FFN built
on it (Shazeer 2020, arXiv 2002.05202; Gemma's MLP), as forward/backward pairs.

Math:
    erf:   gelu(x) = x Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
    tanh:  gelu(x) ~ 0.5 x (1 + tanh(u)),  u = c (x + 0.044715 x^3),  c = sqrt(2 / pi)
           (GPT-2's "gelu_new", torch's approximate="tanh", Gemma's gelu_pytorch_tanh)
    quick: gelu(x) ~ x sigmoid(1.702 x)  (the paper's sigmoid form: CLIP's quick_gelu)
    MLP:   y = gelu(x W1 + b1) W2 + b2      (GPT-2's c_fc, c_proj; Radford et al. 2019)
    GeGLU: y = (gelu(x W1) * (x W3)) W2     (Gemma's gate_proj, up_proj, down_proj)
Backward:
    erf:   gelu'(x) = Phi(x) + x phi(x),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
    tanh:  with t = tanh(u): gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 * 0.044715 x^2)
    quick: with s = sigmoid(1.702 x): gelu'(x) = s + 1.702 x s (1 - s)

Letters (README glossary): D model width, F MLP hidden width.
"""
import math
from typing import NamedTuple

import numpy as np
from scipy.special import erf, expit

from scratchllm.core.ops import LinearCache, linear_backward, linear_forward, linear_out
from scratchllm.core.validate import expect_dout, expect_float, expect_gated_ffn, expect_linear

_C = math.sqrt(2.0 / math.pi)
_K = 0.044715
_Q = 1.702  # the quick form's slope


class GeluCache(NamedTuple):
    x: np.ndarray
    approximate: str


def gelu_forward(x, approximate="tanh"):
    """y = gelu(x), approximate "tanh" (GPT-2, Gemma), "none" (the exact erf form) or
    "quick" (x sigmoid(1.702 x): CLIP).

    Inputs: x (...) float.  Returns: y, same shape.  Cache: (x, approximate).
    """
    expect_float("gelu", "x", x)
    if approximate == "tanh":
        y = 0.5 * x * (1 + np.tanh(_C * (x + _K * (x * x * x))))  # (...); x*x*x, not x**3:
        # NumPy's float32 power is ~300x slower than two multiplies
    elif approximate == "none":
        y = 0.5 * x * (1 + erf(x / math.sqrt(2.0)))  # (...)
    elif approximate == "quick":
        y = x * expit(_Q * x)  # (...)
    else:
        raise ValueError(f"gelu: approximate must be 'tanh', 'none' or 'quick', got "
                         f"{approximate!r}")
    return y.astype(x.dtype, copy=False), GeluCache(x, approximate)


def gelu_backward(dy, cache):
    """Math: tanh form, t = tanh(c (x + k x^3)):  dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c
    (1 + 3 k x^2)  (the product rule on 0.5 x (1 + t), tanh' = 1 - tanh^2);
    erf form: d/dx x Phi(x) = Phi(x) + x phi(x); quick form: d/dx x s(1.702 x) =
    s + 1.702 x s (1 - s).
    Reference: Hendrycks & Gimpel 2016 (arXiv 1606.08415) §2."""
    expect_dout("gelu_backward", dy, cache.x.shape, cache.x.dtype, name="dy")
    x, approximate = cache
    if approximate == "tanh":
        t = np.tanh(_C * (x + _K * (x * x * x)))  # (...)
        d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * _K * x * x)  # (...)
    elif approximate == "quick":
        sg = expit(_Q * x)  # (...)
        d = sg + _Q * x * sg * (1 - sg)  # fwd: y = x sigmoid(1.702 x): the product rule
    else:
        d = 0.5 * (1 + erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(
            2 * math.pi)  # (...)
    return {"x": (dy * d).astype(dy.dtype, copy=False)}


class GeluMLPCache(NamedTuple):
    up: LinearCache
    act: GeluCache
    down: LinearCache


def gelu_mlp_forward(x, W1, b1, W2, b2, *, approximate="tanh"):
    """y = gelu(x @ W1 + b1) @ W2 + b2, the GPT-2 MLP.

    Inputs:  x (..., D), W1 (D, F), b1 (F,), W2 (F, D), b2 (D,).
    Returns: y (..., D).  Cache: the two linear caches and the gelu cache.
    """
    expect_float("gelu_mlp", "x", x, 1)
    expect_linear("gelu_mlp", x.shape[-1], W1, b1, ("W1", "b1"))
    expect_linear("gelu_mlp", W1.shape[1], W2, b2, ("W2", "b2"))  # (F, Dout): D or another
    h, up = linear_forward(x, W1, b1)  # (..., F)
    a, act = gelu_forward(h, approximate)  # (..., F)
    y, down = linear_forward(a, W2, b2)  # (..., D)
    return y, GeluMLPCache(up, act, down)


def gelu_mlp_backward(dy, cache):
    """Reverse of the forward through the smaller pairs (linear, gelu, linear).
    Reference: openai/gpt-2 src/model.py mlp; karpathy/llm.c train_gpt2.c gelu_backward."""
    expect_dout("gelu_mlp_backward", dy, *linear_out(cache.down), name="dy")
    up, act, down = cache
    g_down = linear_backward(dy, down)  # fwd: y = a @ W2 + b2
    dh = gelu_backward(g_down["x"], act)["x"]  # fwd: a = gelu(h)
    g_up = linear_backward(dh, up)  # fwd: h = x @ W1 + b1
    return {"x": g_up["x"], "W1": g_up["W"], "b1": g_up["b"], "W2": g_down["W"],
            "b2": g_down["b"]}


class GeGLUCache(NamedTuple):
    up_a: LinearCache
    up_b: LinearCache
    act: GeluCache
    down: LinearCache
    gelu_a: np.ndarray
    b: np.ndarray


def geglu_forward(x, W1, W3, W2, *, approximate="tanh"):
    """y = (gelu(x @ W1) * (x @ W3)) @ W2, SwiGLU with GELU as the gate.

    Inputs:  x (..., D), W1 (D, F), W3 (D, F), W2 (F, D).
    Returns: y (..., D).  Cache: the children's caches and the two gate halves.
    """
    expect_gated_ffn("geglu", x, W1, W3, W2)
    a, up_a = linear_forward(x, W1)  # (..., F)
    b, up_b = linear_forward(x, W3)  # (..., F)
    g, act = gelu_forward(a, approximate)  # (..., F)
    y, down = linear_forward(g * b, W2)  # (..., D)
    return y, GeGLUCache(up_a, up_b, act, down, g, b)


def geglu_backward(dy, cache):
    """Math: m = gelu(a) * b -> da = gelu'(a) (dm * b), db = dm * gelu(a); then the linears.
    Reference: Shazeer 2020 (arXiv 2002.05202); huggingface/transformers
    src/transformers/models/gemma3/modeling_gemma3.py Gemma3MLP."""
    expect_dout("geglu_backward", dy, *linear_out(cache.down), name="dy")
    up_a, up_b, act, down, g, b = cache
    g_down = linear_backward(dy, down)  # fwd: y = m @ W2
    dm = g_down["x"]  # (..., F)
    da = gelu_backward(dm * b, act)["x"]  # fwd: m = gelu(a) * b
    g_a = linear_backward(da, up_a)  # fwd: a = x @ W1
    g_b = linear_backward(dm * g, up_b)  # fwd: b = x @ W3
    return {"x": g_a["x"] + g_b["x"], "W1": g_a["W"], "W3": g_b["W"], "W2": g_down["W"]}
