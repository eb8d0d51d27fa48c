"""Qwen3-Next's gated DeltaNet layer (Yang et al. 2024, "Gated Delta Networks", arXiv
2412.06464; the layer of transformers' Qwen3NextGatedDeltaNet) as a forward/backward pair, a
decoding step and a Module, around delta.py's gated delta rule:

    q, k, v = split(silu(conv([x Wq | x Wk | x Wv])))   a causal depthwise conv of width K
    q = l2(q) / √dk,  k = l2(k)          per head; l2(u) = u / √(Σ u² + 1e-6) (FLA's)
    β = sigmoid(x Wb),  g = −exp(A_log) softplus(x Wa + dt_bias)          (Hv per token)
    o = gated_delta_rule(q, k, v, β, g)  query/key head j serves value heads j r .. j r + r − 1
    out = (rmsnorm(o) norm ⊙ silu(x Wz)) Wout                  per value head (RMSNormGated)

with r = Hv / Hk. The l2 norm is the rmsnorm pair with gain 1 and eps 1e-6 / dk, divided by
√dk: u / √(Σ u² + ε) = rmsnorm(u, ε / dk) / √dk. The output norm normalises before it gates
(Mamba-2's gates first). transformers holds q, k, v, z in one in_proj_qkvz and β, a in one
in_proj_ba, head group by head group; the hub splits them into Wq, Wk, Wv, Wz, Wb, Wa.
The decoding state (GatedDeltaState) is the last K − 1 conv inputs and the delta rule's S per
value head. Sizes come from one GatedDeltaNetSpec (scratchllm.specs), the arrays of a layer
travel as one GatedDeltaWeights.

Glossary: B batch, T time, D model width, Hk query/key heads of dk, Hv value heads of dv,
r = Hv / Hk, C = 2 Hk dk + Hv dv conv channels, K conv width.
"""
import math
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import (linear_backward, linear_forward, linear_out, rmsnorm_backward,
                                 rmsnorm_forward, sigmoid_backward, sigmoid_forward,
                                 silu_backward, silu_forward, softplus_backward,
                                 softplus_forward)
from scratchllm.core.validate import (common_float, expect_dout, expect_instance, expect_ndim,
                                      expect_shape)
from scratchllm.linear_attention.delta import (delta_rule_backward, delta_rule_final_state,
                                               delta_rule_forward, delta_rule_step)
from scratchllm.specs import GatedDeltaNetSpec
from scratchllm.ssm.mamba import causal_conv1d_backward, causal_conv1d_forward

L2_EPS = 1e-6  # transformers' l2norm (FLA's use_qk_l2norm_in_kernel)


class GatedDeltaWeights(NamedTuple):
    """The arrays of one gated DeltaNet layer (the GatedDeltaNet Module's Param names)."""
    Wq: np.ndarray  # (D, Hk dk)
    Wk: np.ndarray  # (D, Hk dk)
    Wv: np.ndarray  # (D, Hv dv)
    Wz: np.ndarray  # (D, Hv dv) the output gate
    Wb: np.ndarray  # (D, Hv) β = sigmoid(x Wb)
    Wa: np.ndarray  # (D, Hv) the decay's input
    conv_w: np.ndarray  # (C, K) over [q | k | v], no bias
    dt_bias: np.ndarray  # (Hv,)
    A_log: np.ndarray  # (Hv,)
    norm: np.ndarray  # (dv,) the gated RMSNorm's gain
    Wout: np.ndarray  # (Hv dv, D)


class GatedDeltaState(NamedTuple):
    """Per-layer decoding state; GatedDeltaNet.decode overwrites the arrays in place."""
    conv: np.ndarray  # (B, K − 1, C) the last conv inputs
    S: np.ndarray  # (B, Hv, dk, dv)


class GatedDeltaCache(NamedTuple):
    lin: tuple  # linear caches of q, k, v, z, b, a, out
    conv: tuple  # the causal conv's cache
    silu: tuple  # the silu after it
    l2: tuple  # the rmsnorm caches of q and k (the l2 norms)
    beta: tuple  # sigmoid cache
    sp: tuple  # softplus cache of x Wa + dt_bias
    A: np.ndarray  # (Hv,) exp(A_log)
    g: np.ndarray  # (B, Hv, T) the log decays
    core: tuple  # the delta rule's cache
    norm: tuple  # the output rmsnorm's cache
    z: tuple  # silu cache of the gate
    n: np.ndarray  # (B, T, Hv, dv) rmsnorm(o) norm
    zs: np.ndarray  # (B, T, Hv, dv) silu(x Wz)
    r: int  # value heads per query/key head


def _check(fn, x, w, spec):
    """x (..., D) float, w a GatedDeltaWeights of the spec's sizes."""
    expect_instance(fn, "spec", spec, GatedDeltaNetSpec)
    expect_instance(fn, "w", w, GatedDeltaWeights)
    D, (kd, vd, C), Hv = x.shape[-1], spec.widths(), spec.n_v_heads
    shapes = dict(Wq=(D, kd), Wk=(D, kd), Wv=(D, vd), Wz=(D, vd), Wb=(D, Hv), Wa=(D, Hv),
                  conv_w=(C, spec.d_conv), dt_bias=(Hv,), A_log=(Hv,),
                  norm=(spec.v_head_dim,), Wout=(vd, D))
    for name, shape in shapes.items():
        expect_shape(fn, name, getattr(w, name), shape, f"spec {spec}")


def _heads(a, H):
    """(..., T, H d) -> (..., H, T, d): (B, T, H d) to (B, H, T, d)."""
    B, T, Hd = a.shape
    return a.reshape(B, T, H, Hd // H).transpose(0, 2, 1, 3)


def _l2_forward(u, scale):
    """u / √(Σ u² + 1e-6) · scale over the last axis, by the rmsnorm pair (module docstring)."""
    d = u.shape[-1]
    n, c = rmsnorm_forward(u, np.ones(d, u.dtype), L2_EPS / d)
    return n * (scale / math.sqrt(d)), c  # a Python float: keeps float32 float32


def _l2_backward(dn, cache, scale):
    return rmsnorm_backward(dn * (scale / math.sqrt(dn.shape[-1])), cache)["x"]


def _mix(x, w, spec):
    """The projections, the conv and the gates of x (B, T, D): (q, k (B, Hv, T, dk), v
    (B, Hv, T, dv), β, g (B, Hv, T), z (B, T, Hv dv), the caches)."""
    Hk, Hv = spec.n_k_heads, spec.n_v_heads
    kd, vd, C = spec.widths()
    (q, cq), (k, ck), (v, cv), (z, cz), (b, cb), (a, ca) = (
        linear_forward(x, W) for W in (w.Wq, w.Wk, w.Wv, w.Wz, w.Wb, w.Wa))
    c, cc = causal_conv1d_forward(np.concatenate([q, k, v], -1), w.conv_w,
                                  np.zeros(C, x.dtype))  # (B, T, C)
    s, cs = silu_forward(c)  # (B, T, C)
    q, k, v = s[..., :kd], s[..., kd:2 * kd], s[..., 2 * kd:]
    q, cl_q = _l2_forward(_heads(q, Hk), spec.k_head_dim ** -0.5)  # (B, Hk, T, dk)
    k, cl_k = _l2_forward(_heads(k, Hk), 1.0)  # (B, Hk, T, dk)
    r = Hv // Hk  # query/key head j serves value heads j r .. j r + r - 1
    q, k, v = np.repeat(q, r, axis=1), np.repeat(k, r, axis=1), _heads(v, Hv)
    beta, c_beta = sigmoid_forward(b)  # (B, T, Hv)
    sp, c_sp = softplus_forward(a + w.dt_bias)  # (B, T, Hv)
    A = np.exp(w.A_log)  # (Hv,)
    g = -(A * sp).transpose(0, 2, 1)  # (B, Hv, T)
    caches = ((cq, ck, cv, cz, cb, ca), cc, cs, (cl_q, cl_k), c_beta, c_sp, A)
    return q, k, v, beta.transpose(0, 2, 1), g, z, caches


def _gated_norm(o, z, w, spec):
    """rmsnorm(o) norm ⊙ silu(z) per value head: o (B, T, Hv, dv), z (B, T, Hv dv)."""
    n, cn = rmsnorm_forward(o, w.norm, spec.norm_eps)  # (B, T, Hv, dv)
    zs, c_z = silu_forward(z.reshape(o.shape))  # (B, T, Hv, dv)
    return n * zs, (cn, c_z, n, zs)


def gated_deltanet_forward(x, w, *, spec):
    """Inputs: x (B, T, D); w GatedDeltaWeights (Wq, Wk (D, Hk dk); Wv, Wz (D, Hv dv); Wb,
    Wa (D, Hv); conv_w (C, K); dt_bias, A_log (Hv,); norm (dv,); Wout (Hv dv, D)); spec
    GatedDeltaNetSpec (heads, head dims, K, the output norm's eps, the chunk length).
    Returns out (B, T, D).  Cache: GatedDeltaCache of the pairs' caches."""
    x, w = common_float(x, w)
    expect_ndim("gated_deltanet", "x", x, 3, "(B, T, D)")
    _check("gated_deltanet", x, w, spec)
    q, k, v, beta, g, z, (lin, conv, c_s, l2, c_beta, c_sp, A) = _mix(x, w, spec)
    o, core = delta_rule_forward(q, k, v, beta, g, chunk=spec.chunk)  # (B, Hv, T, dv)
    y, (cn, c_z, n, zs) = _gated_norm(o.transpose(0, 2, 1, 3), z, w, spec)  # (B, T, Hv, dv)
    out, co = linear_forward(y.reshape(x.shape[:2] + (-1,)), w.Wout)  # (B, T, D)
    return out, GatedDeltaCache(lin + (co,), conv, c_s, l2, c_beta, c_sp, A, g, core,
                                cn, c_z, n, zs, spec.n_v_heads // spec.n_k_heads)


def gated_deltanet_backward(dout, cache):
    """Math: the pairs in reverse: Wout; the gated norm (y = n ⊙ zs: dn = dy ⊙ zs, dzs = dy ⊙ n,
    then rmsnorm's and silu's pairs); the gated delta rule (dq, dk, dv, dβ, dg); the decay
    g = −A softplus(a + dt_bias), A = exp(A_log): dsp = −A dg, dA_log = Σ dg g (dg/dA_log =
    g), da = softplus' dsp, ddt_bias = Σ da; β = sigmoid(b); the repeat of q and k over the r
    value heads they serve (a sum over each group); q = l2(q)/√dk, k = l2(k) through the
    rmsnorm pair; silu and the causal conv (dconv_w); the six projections, whose dx add up.
    Returns: {"x": dx (B, T, D), "w": GatedDeltaWeights of the gradients}.
    Reference: Yang et al. 2024, arXiv 2412.06464; huggingface/transformers
    src/transformers/models/qwen3_next/modeling_qwen3_next.py Qwen3NextGatedDeltaNet."""
    expect_dout("gated_deltanet_backward", dout, *linear_out(cache.lin[6]))
    (cq, ck, cv, cz, cb, ca, co), cc, cs, (cl_q, cl_k) = cache[:4]
    g_o = linear_backward(dout, co)  # fwd: out = y Wout
    dy = g_o["x"].reshape(cache.n.shape)  # (B, T, Hv, dv)
    g_n = rmsnorm_backward(dy * cache.zs, cache.norm)  # fwd: y = rmsnorm(o) norm ⊙ zs
    dz = silu_backward(dy * cache.n, cache.z)["x"]  # (B, T, Hv, dv)
    B, T, Hv, dv = dy.shape
    g = delta_rule_backward(g_n["x"].transpose(0, 2, 1, 3), cache.core)  # (B, Hv, T, *)
    # fwd: g = -A softplus(a + dt_bias), A = exp(A_log)
    dsp = (-cache.A[:, None] * g["g"]).transpose(0, 2, 1)  # (B, T, Hv)
    dA_log = (g["g"] * cache.g).sum(axis=(0, 2))  # (Hv,)
    da = softplus_backward(dsp, cache.sp)["x"]  # (B, T, Hv)
    db = sigmoid_backward(g["beta"].transpose(0, 2, 1), cache.beta)["x"]  # fwd: β = σ(b)
    r = cache.r  # fwd: q, k repeated over the r value heads each serves -> sum the group
    dq, dk = (d.reshape(B, Hv // r, r, T, d.shape[-1]).sum(2) for d in (g["q"], g["k"]))
    dq = _l2_backward(dq, cl_q, dq.shape[-1] ** -0.5)  # fwd: q = l2(q) / sqrt(dk)
    dk = _l2_backward(dk, cl_k, 1.0)  # (B, Hk, T, dk)
    merge = lambda a: a.transpose(0, 2, 1, 3).reshape(B, T, -1)  # noqa: E731
    ds = np.concatenate([merge(dq), merge(dk), merge(g["v"])], -1)  # (B, T, C)
    g_c = causal_conv1d_backward(silu_backward(ds, cs)["x"], cc)  # fwd: s = silu(conv(.))
    kd = dq.shape[1] * dq.shape[-1]
    parts = (g_c["x"][..., :kd], g_c["x"][..., kd:2 * kd], g_c["x"][..., 2 * kd:],
             dz.reshape(B, T, -1), db, da)
    grads, dx = [], 0
    for d, c in zip(parts, (cq, ck, cv, cz, cb, ca)):
        g_l = linear_backward(d, c)  # fwd: q = x Wq, ...
        grads.append(g_l["W"])
        dx = dx + g_l["x"]
    dw = GatedDeltaWeights(*grads, g_c["w"], da.sum(axis=(0, 1)), dA_log, g_n["g"], g_o["W"])
    return {"x": dx, "w": dw}



def gated_deltanet_step(x_t, state, w, *, spec):
    """One decoding token: x_t (B, D), state a GatedDeltaState, w and spec as in
    gated_deltanet_forward -> (out_t (B, D), the new GatedDeltaState); the inputs are not
    modified."""
    x_t, w = common_float(x_t, w)
    expect_ndim("gated_deltanet_step", "x_t", x_t, 2, "(B, D)")
    _check("gated_deltanet_step", x_t, w, spec)
    Hk, Hv, dk, dv = spec.n_k_heads, spec.n_v_heads, spec.k_head_dim, spec.v_head_dim
    kd, _, C = spec.widths()
    batch = x_t.shape[0]
    expect_instance("gated_deltanet_step", "state", state, GatedDeltaState)
    expect_shape("gated_deltanet_step", "state.conv", state.conv, (batch, spec.d_conv - 1, C),
                 "(B, K-1, C): the last K-1 conv inputs of every row")
    expect_shape("gated_deltanet_step", "state.S", state.S, (batch, Hv, dk, dv),
                 "(B, Hv, dk, dv): the delta rule's state of every row")
    q, k, v, z, b, a = (linear_forward(x_t, W)[0] for W in (w.Wq, w.Wk, w.Wv, w.Wz, w.Wb, w.Wa))
    window = np.concatenate([state.conv, np.concatenate([q, k, v], -1)[:, None]], 1)  # (B,K,C)
    s = silu_forward(causal_conv1d_forward(window, w.conv_w, np.zeros(C, x_t.dtype))[0][:, -1])[0]
    r = Hv // Hk
    q = np.repeat(_l2_forward(s[:, :kd].reshape(batch, Hk, dk), dk ** -0.5)[0], r, axis=1)
    k = np.repeat(_l2_forward(s[:, kd:2 * kd].reshape(batch, Hk, dk), 1.0)[0], r, axis=1)
    g = -np.exp(w.A_log) * softplus_forward(a + w.dt_bias)[0]  # (B, Hv)
    o, S = delta_rule_step(q, k, s[:, 2 * kd:].reshape(batch, Hv, dv), sigmoid_forward(b)[0],
                           g, state.S)  # (B, Hv, dv)
    y = rmsnorm_forward(o, w.norm, spec.norm_eps)[0] * silu_forward(z.reshape(o.shape))[0]
    return linear_forward(y.reshape(batch, -1), w.Wout)[0], GatedDeltaState(window[:, 1:], S)


class GatedDeltaNet(Module):
    """A gated DeltaNet layer of a GatedDeltaNetSpec: owns the Params named as
    GatedDeltaWeights' fields (matrices ~ N(0, 1/fan_in); transformers' init: dt_bias 1,
    A_log = log U[0.01, 16], norm 1, the conv as PyTorch's Conv1d: U(±1/√K)); calls
    gated_deltanet_forward/backward with its spec."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        expect_instance("GatedDeltaNet", "spec", spec, GatedDeltaNetSpec)
        self.spec = spec
        kd, vd, C = spec.widths()
        Hv = spec.n_v_heads
        init = {"Wq": (d_model, kd), "Wk": (d_model, kd), "Wv": (d_model, vd),
                "Wz": (d_model, vd), "Wb": (d_model, Hv), "Wa": (d_model, Hv)}
        for name, shape in init.items():
            setattr(self, name, Param(normal_init(rng, shape, d_model ** -0.5, dtype)))
        bound = spec.d_conv ** -0.5  # PyTorch's Conv1d init, fan_in = K (depthwise)
        self.conv_w = Param(rng.uniform(-bound, bound, (C, spec.d_conv)).astype(dtype))
        self.dt_bias = Param(np.ones(Hv, dtype))
        self.A_log = Param(np.log(rng.uniform(0.01, 16, Hv)).astype(dtype))
        self.norm = Param(np.ones(spec.v_head_dim, dtype))
        self.Wout = Param(normal_init(rng, (vd, d_model), vd ** -0.5, dtype))

    def weights(self):
        """The Params' arrays as one GatedDeltaWeights."""
        return GatedDeltaWeights(*(getattr(self, n).data for n in GatedDeltaWeights._fields))

    def forward(self, x):
        return gated_deltanet_forward(x, self.weights(), spec=self.spec)

    def backward(self, dout, cache):
        g = gated_deltanet_backward(dout, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))

    def init_state(self, batch, max_len=None):
        """Zero states: the conv's (B, K − 1, C) and the delta rule's (B, Hv, dk, dv); their
        size does not grow with max_len."""
        s, dtype = self.spec, self.Wq.data.dtype
        return GatedDeltaState(np.zeros((batch, s.d_conv - 1, s.widths()[2]), dtype),
                               np.zeros((batch, s.n_v_heads, s.k_head_dim, s.v_head_dim), dtype))

    def prefill(self, x, state):
        """A whole prompt x (B, T, D) in one forward (the chunked form): returns y (B, T, D)
        and leaves in the fresh `state` what T decode calls would: the last K − 1 conv inputs
        and the delta rule's final S (delta_rule_final_state)."""
        if state.S.any() or state.conv.any():
            raise ValueError("GatedDeltaNet.prefill: the state is not fresh; prefill starts a "
                             "sequence from init_state")
        y, cache = self.forward(x)  # (B, T, D)
        K = self.spec.d_conv
        state.conv[...] = cache.conv.xp[:, cache.conv.xp.shape[1] - (K - 1):]  # zeros first
        state.S[...] = delta_rule_final_state(cache.core)
        return y

    def decode(self, x_t, state, position=None):
        """One token (B, D) -> (B, D); updates `state` in place."""
        out, new = gated_deltanet_step(x_t, state, self.weights(), spec=self.spec)
        state.conv[...], state.S[...] = new.conv, new.S
        return out
