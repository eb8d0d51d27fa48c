"""Multihead attention pooling (MAP): a learned probe vector attends over all the tokens of an
image and becomes its one summary vector; SigLIP's vision head (Zhai et al. 2023, arXiv
2303.15343; the MAP head of Zhai et al. 2022, arXiv 2106.04560, section 3.2).

    q = probe Wq + bq,  k = h Wk + bk,  v = h Wv + bv       (heads split; one query row)
    z = concat_heads(softmax(q k^T / sqrt(Dh)) v) Wo + bo   probe_attention  (B, 1, D)
    y = z + mlp(layernorm(z));   pooled = y[:, 0]           AttentionPool    (B, D)
Backward: the linear and sdpa backwards; the probe's gradient sums over the batch (one probe
serves every image), h's is the sum of its k and v paths.

Glossary: B batch, T tokens, D model width, H heads, Dh head dim, F MLP width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.sdpa import merge_heads, sdpa_backward, sdpa_forward, split_heads
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import linear_backward, linear_forward, linear_out
from scratchllm.core.validate import expect_dout, expect_ndim, expect_shape
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


class ProbeCache(NamedTuple):
    lin_q: tuple
    lin_k: tuple
    lin_v: tuple
    sdpa: tuple
    lin_o: tuple
    n_heads: int


def probe_attention_forward(h, w, *, spec):
    """z = MHA(query = probe, keys = values = h), with biases on every projection.

    Inputs:  h (B, T, D) the tokens; w ProbeWeights; spec an AttentionSpec (n_heads = n_kv_heads,
             head_dim, scale; rope=None, Mask(causal=False)).
    Returns: z (B, 1, D).  Cache: ProbeCache.
    """
    fn = "probe_attention"
    expect_ndim(fn, "h", h, 3, "(B, T, D)")
    B, T, D = h.shape
    H, Dh = spec.n_heads, spec.dh(D)
    expect_shape(fn, "probe", w.probe, (D,), "(D,)")
    expect_shape(fn, "wq", w.wq, (D, H * Dh), "(D, H*Dh)")
    q, lin_q = linear_forward(w.probe[None], w.wq, w.bq)  # (1, H*Dh): one probe for all
    k, lin_k = linear_forward(h, w.wk, w.bk)  # (B, T, H*Dh)
    v, lin_v = linear_forward(h, w.wv, w.bv)  # (B, T, H*Dh)
    qb = np.broadcast_to(q, (B, 1, H * Dh))  # (B, 1, H*Dh)
    o, sd = sdpa_forward(np.ascontiguousarray(split_heads(qb, H)), split_heads(k, H),
                         split_heads(v, H), spec.mask, spec.scale)  # (B, H, 1, Dh)
    z, lin_o = linear_forward(merge_heads(o), w.wo, w.bo)  # (B, 1, D)
    return z, ProbeCache(lin_q, lin_k, lin_v, sd, lin_o, H)


def probe_attention_backward(dz, cache):
    """Math: the linear and sdpa backwards in reverse; dq sums over the batch (the probe's
    query is shared: fwd qb = broadcast(q)); dh = dk Wk^T + dv Wv^T.
    Returns {"h": dh, "w": ProbeWeights of gradients}.
    Reference: Zhai et al. 2022 (arXiv 2106.04560) section 3.2."""
    lin_q, lin_k, lin_v, sd, lin_o, H = cache
    expect_dout("probe_attention_backward", dz, *linear_out(lin_o), name="dz")
    g_o = linear_backward(dz, lin_o)  # fwd: z = merge(o) Wo + bo
    g_att = sdpa_backward(split_heads(g_o["x"], H), sd)  # fwd: o = sdpa(q, k, v)
    dq = merge_heads(g_att["q"]).sum(axis=0)  # fwd: qb = broadcast(q) over B   (1, H*Dh)
    g_q = linear_backward(dq, lin_q)  # fwd: q = probe Wq + bq
    g_k = linear_backward(merge_heads(g_att["k"]), lin_k)  # fwd: k = h Wk + bk
    g_v = linear_backward(merge_heads(g_att["v"]), lin_v)  # fwd: v = h Wv + bv
    dw = ProbeWeights(g_q["x"][0], g_q["W"], g_k["W"], g_v["W"], g_o["W"], g_q["b"], g_k["b"],
                      g_v["b"], g_o["b"])
    return {"h": g_k["x"] + g_v["x"], "w": dw}


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
