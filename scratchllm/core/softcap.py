"""Logit soft-capping (Gemma 2: attention scores and final logits), a forward/backward pair.

Math:
    y = c tanh(x / c)            smooth, |y| < c, y ~ x for |x| << c
Backward:
    dy/dx = 1 - tanh(x / c)^2 = 1 - (y / c)^2,   so dx = dy (1 - t^2) with t = tanh(x / c)
Reference: Gemma Team 2024 (arXiv 2408.00118) §2; huggingface/transformers
src/transformers/models/gemma2/modeling_gemma2.py (eager_attention_forward's softcap,
Gemma2ForCausalLM's final_logit_softcapping).
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import expect_dout, expect_finite, expect_float


class SoftcapCache(NamedTuple):
    t: np.ndarray  # tanh(x / c), the shape and dtype of x


def softcap_forward(x, *, cap):
    """y = cap * tanh(x / cap). Inputs: x float (...), cap > 0. Returns: y (...), cache."""
    expect_float("softcap", "x", x)
    cap = expect_finite("softcap", "cap", cap, 0, open_low=True)
    c = np.asarray(cap, dtype=x.dtype)
    t = np.divide(x, c, out=np.empty_like(x))  # (...) x / c (an array even when x is 0-d)
    np.tanh(t, out=t)  # (...) in place: one temporary fewer (the final logits are (B, T, V))
    return t * c, SoftcapCache(t)  # (...)


def softcap_backward(dy, cache):
    """dx = dy (1 - t^2), t = tanh(x / cap) (the cap cancels: d(c tanh(x/c))/dx)."""
    t = cache.t
    expect_dout("softcap_backward", dy, t.shape, t.dtype, name="dy")
    dx = np.multiply(t, t, out=np.empty_like(t))  # (...) t^2
    np.subtract(1, dx, out=dx)  # 1 - t^2, in place
    return {"x": np.multiply(dx, dy, out=dx)}  # fwd: y = c tanh(x / c)
