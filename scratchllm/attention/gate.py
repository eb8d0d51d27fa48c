"""The output gate of gated attention (Qiu et al. 2025, "Gated Attention for Large Language
Models", arXiv 2505.06708; Qwen3-Next's full-attention layers), as one pair:

    y = o ⊙ sigmoid(x Wg + bg)

x is the layer's input (B, T, D), o the attention's heads merged (B, T, H*Dh) before the
output projection: one gate per head and channel, computed from the token itself. Qwen3-Next
projects the gate with the query (its q_proj yields both, head by head); here Wg is its own
array (AttentionWeights.wg, AttentionSpec.output_gate), and the hub splits q_proj's rows.

Glossary: B batch, T time, D model width, H query heads, Dh head dim.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.ops import linear_backward, linear_forward, sigmoid_backward, sigmoid_forward
from scratchllm.core.validate import common_float, expect_dout, expect_float, expect_shape


class GateCache(NamedTuple):
    lin: tuple  # the gate's linear cache
    sig: tuple  # the sigmoid's cache
    o: np.ndarray  # (B, T, H*Dh) the gated values
    s: np.ndarray  # (B, T, H*Dh) sigmoid(x Wg + bg)


def output_gate_forward(x, o, wg, bg=None):
    """y = o ⊙ sigmoid(x Wg + bg).

    Inputs:  x (B, T, D) the attention layer's input; o (B, T, H*Dh) the attention's merged
             heads; wg (D, H*Dh); bg (H*Dh,) or None.
    Returns: y (B, T, H*Dh).  Cache: GateCache (the linear and sigmoid caches, o, the gate).
    """
    x, o, wg, bg = common_float(x, o, wg, bg)
    for name, a in (("x", x), ("o", o), ("wg", wg)):
        expect_float("output_gate", name, a)
    expect_shape("output_gate", "x", x, (None, None, None), "(B, T, D)")
    expect_shape("output_gate", "o", o, x.shape[:2] + (None,), "(B, T, H*Dh), x's B and T")
    expect_shape("output_gate", "wg", wg, (x.shape[2], o.shape[2]), "(D, H*Dh)")
    if bg is not None:
        expect_shape("output_gate", "bg", bg, (o.shape[2],), "(H*Dh,)")
    z, lin = linear_forward(x, wg, bg)  # (B, T, H*Dh)
    s, sig = sigmoid_forward(z)  # (B, T, H*Dh)
    return o * s, GateCache(lin, sig, o, s)


def output_gate_backward(dy, cache):
    """Math: y = o ⊙ s, s = sigmoid(z), z = x Wg + bg  ->  do = dy ⊙ s, ds = dy ⊙ o,
    dz = ds ⊙ s (1 − s) (sigmoid's pair), then the linear's pair: dx = dz Wg^T,
    dWg = x^T dz, dbg = Σ dz.
    Returns {"x": dx, "o": do, "wg": dWg, "bg": dbg (only when bg was given)}.
    Reference: Qiu et al. 2025, arXiv 2505.06708 (the gate after SDPA, G1);
    huggingface/transformers src/transformers/models/qwen3_next/modeling_qwen3_next.py
    Qwen3NextAttention (attn_output * sigmoid(gate))."""
    lin, sig, o, s = cache
    expect_dout("output_gate_backward", dy, o.shape, np.result_type(o, s), name="dy")
    dz = sigmoid_backward(dy * o, sig)["x"]  # fwd: y = o s, s = sigmoid(z)
    g = linear_backward(dz, lin)  # fwd: z = x Wg + bg
    out = {"x": g["x"], "o": dy * s, "wg": g["W"]}
    if "b" in g:
        out["bg"] = g["b"]
    return out
