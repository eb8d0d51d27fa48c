"""Multihead attention pooling (MAP): a learned probe vector attends over all the tokens of an
image and becomes its one summary vector; SigLIP's vision head (Zhai et al. 2023, arXiv
2303.15343; the MAP head of Zhai et al. 2022, arXiv 2106.04560, section 3.2).

    q = probe Wq + bq,  k = h Wk + bk,  v = h Wv + bv       (heads split; one query row)
    z = concat_heads(softmax(q k^T / sqrt(Dh)) v) Wo + bo   probe_attention  (B, 1, D)
    y = z + mlp(layernorm(z));   pooled = y[:, 0]           AttentionPool    (B, D)
probe_attention is the cross-attention pair (attention/cross.py) with the probe, broadcast over
the batch, as its query stream. Backward: that pair's backward; the probe's gradient sums over
the batch (one probe serves every image), h's is the context's.

Glossary: B batch, T tokens, D model width, H heads, Dh head dim, F MLP width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.cross import (check_cross_inputs, cross_attention_backward,
                                        cross_attention_forward)
from scratchllm.attention.qkv import AttentionWeights
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import linear_out
from scratchllm.core.validate import expect_dout, expect_float, expect_ndim, expect_shape
from scratchllm.lm.ffn import make_ffn
from scratchllm.lm.mixers import make_norm


class ProbeWeights(NamedTuple):
    """probe (D,), the projections wq, wk, wv (D, H Dh), wo (H Dh, D) and their biases."""
    probe: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    bq: np.ndarray
    bk: np.ndarray
    bv: np.ndarray
    bo: np.ndarray


def probe_attention_forward(h, w, *, spec):
    """z = MHA(query = probe, keys = values = h), with biases on every projection: the
    cross-attention pair with the probe, broadcast over the batch, as the query stream.

    Inputs:  h (B, T, D) the tokens; w ProbeWeights; spec an AttentionSpec (head_dim, scale,
             qkv_bias, o_bias; rope=None, Mask(causal=False)).
    Returns: z (B, 1, D).  Cache: cross_attention_forward's.
    """
    expect_ndim("probe_attention", "h", h, 3, "(B, T, D)")
    expect_float("probe_attention", "probe", w.probe)
    expect_shape("probe_attention", "probe", w.probe, (h.shape[2],), "(D,)")
    x = np.broadcast_to(w.probe, (h.shape[0], 1, h.shape[2]))  # (B, 1, D) one probe for all
    check_cross_inputs("probe_attention", x, h, AttentionWeights(*w[1:]), spec, ("probe", "h"))
    return cross_attention_forward(x, h, AttentionWeights(*w[1:]), spec=spec)  # (B, 1, D)


def probe_attention_backward(dz, cache):
    """Math: the cross-attention backward; the probe's gradient sums over the batch (fwd:
    x = broadcast(probe)), h's is the context's (its k and v paths).
    Returns {"h": dh, "w": ProbeWeights of gradients}.
    Reference: Zhai et al. 2022 (arXiv 2106.04560) section 3.2."""
    expect_dout("probe_attention_backward", dz, *linear_out(cache.lin_o), name="dz")
    g = cross_attention_backward(dz, cache)
    return {"h": g["ctx"], "w": ProbeWeights(g["x"].sum(axis=(0, 1)), *g["w"][:8])}


class PoolCache(NamedTuple):
    attn: tuple
    norm: tuple
    mlp: tuple


class AttentionPool(Module):
    """The MAP head of a LayerSpec (mixer: the AttentionSpec of probe_attention; ffn: the
    MLP; norm: the LayerNorm before it): h (B, T, D) -> pooled (B, D)."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        D, a = d_model, spec.mixer
        HD = a.n_heads * a.dh(D)
        self.probe = Param(normal_init(rng, (D,), 1.0, dtype))
        for name, shape in (("wq", (D, HD)), ("wk", (D, HD)), ("wv", (D, HD)), ("wo", (HD, D))):
            setattr(self, name, Param(normal_init(rng, shape, shape[0] ** -0.5, dtype)))
        for name, n in (("bq", HD), ("bk", HD), ("bv", HD), ("bo", D)):
            setattr(self, name, Param(np.zeros(n, dtype)))
        self.norm = make_norm(D, spec.norm, dtype)
        self.mlp = make_ffn(D, spec.ffn, rng=rng, dtype=dtype)
        self.spec = spec

    def forward(self, h):
        w = ProbeWeights(*(getattr(self, f).data for f in ProbeWeights._fields))
        z, c_attn = probe_attention_forward(h, w, spec=self.spec.mixer)  # (B, 1, D)
        a, c_norm = self.norm.forward(z)  # (B, 1, D)
        m, c_mlp = self.mlp.forward(a)  # (B, 1, D)
        return (z + m)[:, 0], PoolCache(c_attn, c_norm, c_mlp)  # (B, D)

    def backward(self, dy, cache):
        """dy (B, D) -> dh (B, T, D); the Params' gradients added."""
        dz = dy[:, None]  # fwd: pooled = y[:, 0]   (B, 1, D)
        dz = dz + self.norm.backward(self.mlp.backward(dz, cache.mlp), cache.norm)
        g = probe_attention_backward(np.ascontiguousarray(dz), cache.attn)  # fwd: z = MHA
        self.add_grads(dict(g["w"]._asdict(), x=None))
        return g["h"]
