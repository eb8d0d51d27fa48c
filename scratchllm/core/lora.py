"""LoRA: a frozen Linear plus a trainable low-rank update (Hu et al. 2021, "LoRA: Low-Rank
Adaptation of Large Language Models", arXiv 2106.09685, §4.1):

    y = x W (+ b) + s (x A) B,     A (Din, R), B (R, Dout), s = alpha / R

B starts at zero, so an adapter that has not trained yet leaves the layer exactly as it was;
A starts ~ N(0, 1/Din). Only A and B train (R (Din + Dout) numbers instead of Din Dout).
Merging folds the update into the weight, W' = W + s A B, for inference at no extra cost;
unmerging subtracts it again (to rounding). peft names the same scale `lora_alpha / r`
(huggingface/peft src/peft/tuners/lora/layer.py, `self.scaling[adapter_name]`).

Backward, through the linear pair three times:
    dx = dy W^T + s (dy B^T) A^T,  dW = x^T dy,  db = sum dy,
    dB = s (x A)^T dy,             dA = x^T (s dy B^T)

The merged form, W' = W + s A B as a pair of its own (lora_merge_forward/_backward): a model
whose projections are plain Params (attention's wq, an FFN's W1) runs on W' unchanged, its
backward gives dW', and the adapter's gradients follow from it,
    dA = s dW' B^T,   dB = s A^T dW'      (dW' = x^T dy: the same dA, dB as above)
which is how `finetune --lora` trains any projection of any model.

Glossary: Din, Dout the Linear's input and output widths, R the adapter's rank.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import LinearCache, linear_backward, linear_forward, linear_out
from scratchllm.core.validate import (expect_dout, expect_finite, expect_float, expect_integer,
                                      expect_linear, expect_shape)


class LoRAWeights(NamedTuple):
    W: np.ndarray         # (Din, Dout) the base weight (frozen when fine-tuning)
    A: np.ndarray         # (Din, R)
    B: np.ndarray         # (R, Dout)
    b: np.ndarray = None  # (Dout,) the base bias, or None


class LoRACache(NamedTuple):
    base: LinearCache  # y0 = x W + b
    down: LinearCache  # u = x A
    up: LinearCache    # v = u B
    scale: float


def lora_forward(x, w, *, scale):
    """y = x W (+ b) + scale (x A) B.

    Inputs:  x (..., Din); w a LoRAWeights: W (Din, Dout), A (Din, R), B (R, Dout), b (Dout,)
             or None; scale the adapter's multiplier s = alpha / R.
    Returns: y (..., Dout).  Cache: LoRACache (the three linears' caches and the scale).
    """
    expect_float("lora", "x", x, 1)
    expect_linear("lora", x.shape[-1], w.W, w.b)
    expect_shape("lora", "A", w.A, (w.W.shape[0], None), "(Din, R)")
    expect_shape("lora", "B", w.B, (w.A.shape[1], w.W.shape[1]), "(R, Dout)")
    scale = expect_finite("lora", "scale", scale)
    y0, c_base = linear_forward(x, w.W, w.b)  # (..., Dout)
    u, c_down = linear_forward(x, w.A)  # (..., R)
    v, c_up = linear_forward(u, w.B)  # (..., Dout)
    return y0 + np.asarray(scale, y0.dtype) * v, LoRACache(c_base, c_down, c_up, scale)


def lora_backward(dy, cache):
    """Math (module docstring): the base linear's backward on dy, the up projection's on
    s dy, the down projection's on what that gives u. Returns {"x": dx, "w": LoRAWeights of
    gradients (b None when the forward had none)}."""
    c_base, c_down, c_up, scale = cache
    expect_dout("lora_backward", dy, *linear_out(c_base), name="dy")
    g0 = linear_backward(dy, c_base)  # fwd: y0 = x W + b
    gu = linear_backward(dy * np.asarray(scale, dy.dtype), c_up)  # fwd: y = y0 + s u B
    gd = linear_backward(gu["x"], c_down)  # fwd: u = x A
    return {"x": g0["x"] + gd["x"], "w": LoRAWeights(g0["W"], gd["W"], gu["W"], g0.get("b"))}


class LoRAFactors(NamedTuple):
    A: np.ndarray  # (Din, R)
    B: np.ndarray  # (R, Dout)


class LoRAMergeCache(NamedTuple):
    A: np.ndarray
    B: np.ndarray
    scale: float
    dtype: np.dtype  # W' (the output)


def lora_merge_forward(x, w, *, scale):
    """W' = W + scale A B: the adapter folded into its weight (x is the base weight W).

    Inputs:  x = W (Din, Dout) the base weight; w a LoRAFactors: A (Din, R), B (R, Dout);
             scale s = alpha / R.
    Returns: W' (Din, Dout).  Cache: A, B, scale, the dtype of W'.
    """
    expect_shape("lora_merge", "A", w.A, (x.shape[0], None), "(Din, R)")
    expect_shape("lora_merge", "B", w.B, (w.A.shape[1], x.shape[1]), "(R, Dout)")
    scale = expect_finite("lora_merge", "scale", scale)
    out = x + np.asarray(scale, x.dtype) * (w.A @ w.B)  # (Din, Dout)
    return out, LoRAMergeCache(w.A, w.B, scale, out.dtype)


def lora_merge_backward(dW, cache):
    """dW' (Din, Dout) -> {"x": dW (the skip), "w": LoRAFactors(s dW' B^T, s A^T dW')}."""
    A, B, scale, dtype = cache
    expect_dout("lora_merge_backward", dW, (A.shape[0], B.shape[1]), dtype, name="dW")
    s = np.asarray(scale, dW.dtype)
    return {"x": dW, "w": LoRAFactors(s * (dW @ B.T), s * (A.T @ dW))}  # fwd: W' = W + s A B


class _Frozen:
    """Holds the wrapped Linear out of Module's parameter walk (its weight does not train)."""

    def __init__(self, linear):
        self.linear = linear


class LoRALinear(Module):
    """A Linear (core.nn) with a LoRA adapter of rank R: Params A (Din, R) and B (R, Dout)
    only; the Linear's W (and b) stay frozen and shared with it (merge writes into them).
    alpha None means alpha = R (scale 1)."""

    def __init__(self, linear, rank, *, alpha=None, rng):
        expect_integer("LoRALinear", "rank", rank, 1)
        d_in, d_out = linear.W.data.shape
        dtype = linear.W.data.dtype
        self.A = Param(normal_init(rng, (d_in, rank), d_in ** -0.5, dtype))
        self.B = Param(np.zeros((rank, d_out), dtype))
        self.scale = (rank if alpha is None else alpha) / rank
        self.merged = False
        self._frozen = _Frozen(linear)

    @property
    def linear(self):
        return self._frozen.linear

    def _weights(self):
        b = None if self.linear.b is None else self.linear.b.data
        return LoRAWeights(self.linear.W.data, self.A.data, self.B.data, b)

    def forward(self, x):
        """x (..., Din) -> (y (..., Dout), cache); merged, the Linear alone (cache None: no
        backward)."""
        if self.merged:
            return self.linear.forward(x)[0], None
        return lora_forward(x, self._weights(), scale=self.scale)

    def backward(self, dy, cache):
        """Adds dA, dB into the Params (W and b are frozen); returns dx."""
        if cache is None:
            raise ValueError("LoRALinear.backward: the adapter is merged; unmerge() to train")
        g = lora_backward(dy, cache)
        self.A.grad += g["w"].A
        self.B.grad += g["w"].B
        return g["x"]

    def delta(self):
        """The update s A B (Din, Dout) the adapter adds to W."""
        return np.asarray(self.scale, self.A.data.dtype) * (self.A.data @ self.B.data)

    def merge(self):
        """W += s A B in place (inference at the Linear's cost)."""
        if self.merged:
            raise ValueError("LoRALinear.merge: already merged")
        self.linear.W.data += self.delta()
        self.merged = True

    def unmerge(self):
        """W -= s A B: the base weight back (to rounding)."""
        if not self.merged:
            raise ValueError("LoRALinear.unmerge: not merged")
        self.linear.W.data -= self.delta()
        self.merged = False
