"""FFN key-value memories (Geva et al. 2021, "Transformer Feed-Forward Layers Are Key-Value
Memories", arXiv 2012.14913; Geva et al. 2022, arXiv 2203.14680): a dense FFN is
    y = sum_i h_i(x) W2[i]          h = act(x W1) (* x W3 for a gated FFN), F hidden units
so hidden unit i is a key (the inputs that make h_i large) paired with a value, W2[i] (D,),
written into the stream in proportion to h_i. Read both ends:
    keys    the tokens (positions of a forward) where h_i is largest
    values  the tokens the value promotes: W2[i] read through the final norm's gain (and
            LayerNorm's centring; the per-position 1/rms is left out: it scales every
            token's logit alike) and the unembedding, u_i = (g * W2[i]) @ W_U (V,)
Forward only; for dense FFNs (SwiGLU, GeGLU, GELU and ReLU MLPs).

Glossary: B batch, T time, D model width, F hidden units, V vocabulary.
"""
import numpy as np

from scratchllm.core import RMSNorm
from scratchllm.core.gelu import gelu_forward
from scratchllm.core.ops import linear_forward, silu_forward
from scratchllm.core.validate import expect_integer
from scratchllm.experiments.patching import site_activations
from scratchllm.lm.ffn import GeGLUFFN, GeluMLPFFN, ReluMLPFFN, SwiGLUFFN


def ffn_hidden(ffn, a):
    """The hidden units h (..., F) of a dense FFN on its input a (..., D): ffn's output is
    h @ W2 (+ b2)."""
    if not isinstance(ffn, (SwiGLUFFN, GeGLUFFN, GeluMLPFFN, ReluMLPFFN)):
        raise ValueError(f"ffn_hidden: {type(ffn).__name__} is not a dense FFN (SwiGLU, "
                         f"GeGLU, GELU or ReLU MLP); an MoE's experts are FFNs of their own")
    gate = linear_forward(a, ffn.W1.data, getattr(getattr(ffn, "b1", None), "data", None))[0]
    if isinstance(ffn, SwiGLUFFN):
        return silu_forward(gate)[0] * linear_forward(a, ffn.W3.data)[0]
    if isinstance(ffn, GeGLUFFN):
        return gelu_forward(gate, ffn.approximate)[0] * linear_forward(a, ffn.W3.data)[0]
    if isinstance(ffn, GeluMLPFFN):
        return gelu_forward(gate, ffn.approximate)[0]
    return np.maximum(gate, 0)  # ReLU MLP


def value_logits(model, layer):
    """u (F, V): each hidden unit's value W2[i] of layer `layer` read into the vocabulary
    (module docstring)."""
    w2 = model.layers[layer].ffn.W2.data  # (F, D)
    norm = model.norm
    if isinstance(norm, RMSNorm):
        w2 = w2 * (norm.g.data + norm.offset)
    elif norm is not None:  # LayerNorm: centring, then the gain
        w2 = (w2 - w2.mean(axis=-1, keepdims=True)) * norm.g.data
    head = model.embed.E.data.T if model.head is None else model.head.W.data  # (D, V)
    return w2 @ head  # (F, V)


def ffn_memories(model, ids, layer, top=10):
    """Keys and values of every hidden unit of one dense FFN layer.

    Inputs:  model an LM (pre-norm or sandwich blocks); ids (B, T) ints; layer the block
             index; top how many tokens per unit.
    Returns: {"activations": h (B, T, F), "key_positions": (F, top, 2) (b, t) of the
             largest h_i, largest first; "key_tokens": (F, top) ids there; "key_values":
             (F, top) h_i there; "value_tokens": (F, top) the ids u_i ranks highest;
             "value_logits": (F, top) u_i there}.
    """
    L = len(model.layers)
    expect_integer("ffn_memories", "layer", layer, 0, L - 1)
    expect_integer("ffn_memories", "top", top, 1)
    acts, _ = site_activations(model, ids)
    block = model.layers[layer]
    if block.ffn is None:
        raise ValueError(f"ffn_memories: layer {layer} has no FFN")
    x = acts["embed"] if layer == 0 else acts[f"L{layer - 1}.resid"]
    a = block.norm2.forward(x + acts[f"L{layer}.mixer"])[0]  # (B, T, D) the FFN's input
    h = ffn_hidden(block.ffn, a)  # (B, T, F)
    B, T, F = h.shape
    k = min(top, B * T)
    flat = h.reshape(B * T, F)  # (BT, F)
    order = np.argsort(-flat, axis=0, kind="stable")[:k].T  # (F, k)
    u = value_logits(model, layer)  # (F, V)
    v_order = np.argsort(-u, axis=1, kind="stable")[:, :top]  # (F, top)
    return {"activations": h,
            "key_positions": np.stack(np.unravel_index(order, (B, T)), axis=-1),
            "key_tokens": ids.reshape(-1)[order],
            "key_values": np.take_along_axis(flat.T, order, axis=1),
            "value_tokens": v_order, "value_logits": np.take_along_axis(u, v_order, axis=1)}
