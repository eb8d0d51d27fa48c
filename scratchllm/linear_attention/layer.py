"""The family as token mixers for a language model: projections around one recurrence, as a
forward/backward pair and a Module with a constant-size decoding state.

    q = x Wq, k = x Wk, v = x Wv (split into H heads of Dh);   out = merge(o) Wo
    kind "linear":  o = linear_attention(q, k, v)                    (φ = elu + 1, normalised)
    kind "retnet":  o = retnet_attention(q / √Dh, k, v, γ)           (γ fixed: retnet_gammas)
    kind "gla":     o = gla_attention(q, k, v, g),  g = logsigmoid(x Wa) / 16   (GLA's τ = 16)
    kind "delta":   o = delta_rule(q, k / |k|, v, β),  β = σ(x Wa)    (DeltaNet, Wa (D, H))
The decoding state is the recurrence's S per head: H·Dh·Dh numbers (linear: H·Dh·(Dh + 1)),
whatever the context length. The kind, H and the chunk length come from one RecurrentSpec
(scratchllm.specs); the arrays of one layer travel as one RecurrentWeights.
Simplified against the papers' layers (the recurrences themselves are complete): "gla" has
no output gate (GLA's o ⊙ swish(x Wr)), no group norm on o and a full-rank Wa (the paper's is
low-rank); "delta" runs DeltaNet ungated (delta_rule's gated option, Gated DeltaNet's decay,
is not wired into a layer) and without its short convolutions on q, k, v or its output norm.

Glossary: B batch, T time, D model width, H heads, Dh = D / H head dim.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import (linear_backward, linear_forward, linear_out, sigmoid_backward,
                                 sigmoid_forward, softplus_backward, softplus_forward)
from scratchllm.core.validate import (expect_dout, expect_float, expect_instance, expect_ndim,
                                      expect_shape)
from scratchllm.linear_attention.delta import (delta_rule_backward, delta_rule_forward,
                                               delta_rule_step)
from scratchllm.linear_attention.gla import (gla_attention_backward, gla_attention_forward,
                                             gla_attention_step)
from scratchllm.linear_attention.linear import (linear_attention_backward,
                                                linear_attention_forward, linear_attention_step)
from scratchllm.linear_attention.retnet import (retnet_attention_backward,
                                                retnet_attention_forward, retnet_attention_step,
                                                retnet_gammas)
from scratchllm.specs import RecurrentSpec

GLA_TAU = 16.0  # GLA's gate temperature: α = sigmoid(.)^(1/τ)


class RecurrentWeights(NamedTuple):
    """The arrays of one recurrent mixer (the RecurrentMixer Module's Param names)."""
    Wq: np.ndarray  # (D, H·Dh)
    Wk: np.ndarray  # (D, H·Dh)
    Wv: np.ndarray  # (D, H·Dh)
    Wo: np.ndarray  # (H·Dh, D)
    Wa: np.ndarray = None  # the gate: (D, H·Dh) for "gla", (D, H) for "delta"; else None


def _heads(a, H):
    """(B, T, H·Dh) -> (B, H, T, Dh)."""
    B, T, HD = a.shape
    return a.reshape(B, T, H, HD // H).transpose(0, 2, 1, 3)  # (B, H, T, Dh)


def _merge(a):
    """(B, H, T, Dh) -> (B, T, H·Dh)."""
    B, H, T, Dh = a.shape
    return a.transpose(0, 2, 1, 3).reshape(B, T, H * Dh)  # (B, T, H·Dh)


def _unit(k):
    """k / |k| over the last axis, and |k|."""
    n = np.sqrt((k * k).sum(-1, keepdims=True))  # (..., 1)
    return k / n, n


def _unit_backward(du, k, n):
    """fwd: u = k / |k|  ->  dk = (du − u (u·du)) / |k|."""
    u = k / n
    return (du - u * (u * du).sum(-1, keepdims=True)) / n


class MixerCache(NamedTuple):
    kind: str
    n_heads: int
    lin: tuple  # the linear caches of q, k, v, a (None without Wa), out
    k_raw: np.ndarray  # the keys before the unit norm (delta), else None
    k_norm: np.ndarray
    gate: tuple  # the softplus or sigmoid cache of the gate/β, or None
    core: tuple  # the recurrence's cache


def _gate_forward(kind, a_lin, H):
    """The data-dependent input of the recurrence: GLA's log gates or DeltaNet's β."""
    if kind == "gla":  # g = logsigmoid(a) / tau = -softplus(-a) / tau
        sp, c = softplus_forward(-a_lin)
        return -_heads(sp, H) / GLA_TAU, c  # (B, H, T, Dh)
    s, c = sigmoid_forward(a_lin)  # delta: beta (B, T, H)
    return s.transpose(0, 2, 1), c  # (B, H, T)


def _check(fn, x, w, spec):
    """x float (B, T, D) or (B, D), w and spec consistent; Wa given exactly for the gated
    kinds. Returns H."""
    expect_instance(fn, "spec", spec, RecurrentSpec)
    expect_instance(fn, "w", w, RecurrentWeights)
    expect_float(fn, "x", x)
    kind, H, D = spec.kind, spec.n_heads, x.shape[-1]
    if (w.Wa is None) != (kind in ("linear", "retnet")):
        raise ValueError(f"{fn}: Wa is needed for kind 'gla' and 'delta' only, got kind {kind!r}"
                         f" with Wa {'None' if w.Wa is None else 'given'}")
    expect_shape(fn, "Wq", w.Wq, (D, None), "(D, H·Dh)")
    if w.Wq.shape[1] % H:
        raise ValueError(f"{fn}: Wq has shape {w.Wq.shape}, expected (D, H·Dh) with "
                         f"H = spec.n_heads = {H}")
    for name in ("Wk", "Wv") + (("Wa",) if kind == "gla" else ()):
        expect_shape(fn, name, getattr(w, name), w.Wq.shape, "(D, H·Dh), like Wq")
    if kind == "delta":
        expect_shape(fn, "Wa", w.Wa, (D, H), "(D, H): one β per head")
    expect_shape(fn, "Wo", w.Wo, w.Wq.shape[::-1], "(H·Dh, D)")
    return H


def recurrent_mixer_forward(x, w, *, spec):
    """Inputs: x (B, T, D); w RecurrentWeights: Wq, Wk, Wv (D, H·Dh); Wo (H·Dh, D); Wa
    (D, H·Dh) for "gla", (D, H) for "delta", None otherwise; spec RecurrentSpec (kind,
    H = n_heads, the chunk length of the chunked form). Returns out (B, T, D)."""
    expect_ndim("recurrent_mixer", "x", x, 3, "(B, T, D)")
    H = _check("recurrent_mixer", x, w, spec)
    kind, chunk = spec.kind, spec.chunk
    (q, cq), (k, ck), (v, cv) = (linear_forward(x, W)
                                 for W in (w.Wq, w.Wk, w.Wv))  # (B, T, H·Dh)
    q, k, v = _heads(q, H), _heads(k, H), _heads(v, H)  # (B, H, T, Dh)
    ca, k_raw, k_norm, gate = None, None, None, None
    if kind == "linear":
        o, core = linear_attention_forward(q, k, v, chunk=chunk)
    elif kind == "retnet":
        o, core = retnet_attention_forward(q * q.shape[-1] ** -0.5, k, v,
                                           retnet_gammas(H, x.dtype), chunk=chunk)
    else:
        a_lin, ca = linear_forward(x, w.Wa)  # (B, T, H·Dh) or (B, T, H)
        g, gate = _gate_forward(kind, a_lin, H)
        if kind == "gla":
            o, core = gla_attention_forward(q, k, v, g, chunk=chunk)
        else:
            k_raw, (k, k_norm) = k, _unit(k)
            o, core = delta_rule_forward(q, k, v, g, chunk=chunk)
    out, co = linear_forward(_merge(o), w.Wo)  # (B, T, D)
    return out, MixerCache(kind, H, (cq, ck, cv, ca, co), k_raw, k_norm, gate, core)


def recurrent_mixer_backward(dout, cache):
    """Math: the pairs in reverse: Wo, the recurrence's backward, the gate (GLA:
    dg -> da = dg·(−1/τ)·(−1) through softplus(−a); DeltaNet: dβ through σ, dk through the unit
    norm), the head split, and the three input projections, whose dx add up.
    Returns: {"x": dx (B, T, D), "w": RecurrentWeights of the gradients (Wa None when absent)}.
    Reference: Yang et al. 2023, arXiv 2312.06635 (GLA's gate, τ = 16); Yang et al. 2024,
    arXiv 2406.06484 (DeltaNet's L2-normalised keys and sigmoid β)"""
    expect_dout("recurrent_mixer_backward", dout, *linear_out(cache.lin[4]))
    kind, H, (cq, ck, cv, ca, co), k_raw, k_norm, gate, core = cache
    g_o = linear_backward(dout, co)  # fwd: out = merge(o) Wo
    do = _heads(g_o["x"], H)  # (B, H, T, Dh)
    back = {"linear": linear_attention_backward, "retnet": retnet_attention_backward,
            "gla": gla_attention_backward, "delta": delta_rule_backward}[kind]
    g = back(do, core)
    dq, dk, dv = g["q"], g["k"], g["v"]
    if kind == "retnet":
        dq = dq * dq.shape[-1] ** -0.5  # fwd: q / sqrt(Dh)
    grads, dx = {"Wa": None}, 0
    if kind == "gla":  # fwd: g = -softplus(-a) / tau
        da = -softplus_backward(-_merge(g["g"]) / GLA_TAU, gate)["x"]  # (B, T, H·Dh)
    elif kind == "delta":  # fwd: beta = sigmoid(a), k = k_raw / |k_raw|
        da = sigmoid_backward(g["beta"].transpose(0, 2, 1), gate)["x"]  # (B, T, H)
        dk = _unit_backward(dk, k_raw, k_norm)
    if ca is not None:
        g_a = linear_backward(da, ca)
        grads["Wa"], dx = g_a["W"], g_a["x"]
    for name, d, c in (("Wq", dq, cq), ("Wk", dk, ck), ("Wv", dv, cv)):
        g_l = linear_backward(_merge(d), c)  # fwd: q = x Wq, ...
        grads[name], dx = g_l["W"], dx + g_l["x"]
    return {"x": dx, "w": RecurrentWeights(grads["Wq"], grads["Wk"], grads["Wv"], g_o["W"],
                                           grads["Wa"])}


def recurrent_mixer_step(x_t, state, w, *, spec):
    """One decoding token: x_t (B, D), state (B, H, Dh, Dh [+1]), w and spec as in
    recurrent_mixer_forward -> (out_t (B, D), the new state); the inputs are not modified."""
    expect_ndim("recurrent_mixer_step", "x_t", x_t, 2, "(B, D)")
    H = _check("recurrent_mixer_step", x_t, w, spec)
    B, kind = x_t.shape[0], spec.kind
    Dh = w.Wq.shape[1] // H
    expect_shape("recurrent_mixer_step", "state", state, (B, H, Dh, Dh + (kind == "linear")),
                 "(B, H, Dh, Dh) (Dh + 1 columns for 'linear'): the state of every row")
    q, k, v = (linear_forward(x_t, W)[0].reshape(B, H, -1)
               for W in (w.Wq, w.Wk, w.Wv))  # (B, H, Dh)
    if kind == "linear":
        o, state = linear_attention_step(q, k, v, state)
    elif kind == "retnet":
        o, state = retnet_attention_step(q * q.shape[-1] ** -0.5, k, v,
                                         retnet_gammas(H, x_t.dtype), state)
    elif kind == "gla":
        g = -softplus_forward(-linear_forward(x_t, w.Wa)[0])[0].reshape(B, H, -1) / GLA_TAU
        o, state = gla_attention_step(q, k, v, g, state)
    else:
        beta = sigmoid_forward(linear_forward(x_t, w.Wa)[0])[0]  # (B, H)
        o, state = delta_rule_step(q, _unit(k)[0], v, beta, None, state)
    return linear_forward(o.reshape(B, -1), w.Wo)[0], state  # (B, D)


class RecurrentMixer(Module):
    """A linear-attention-family token mixer of a RecurrentSpec ("linear", "retnet", "gla",
    "delta") owning Wq, Wk, Wv, Wo ~ N(0, 1/D) and, for gla/delta, Wa (the names of
    RecurrentWeights' fields); calls recurrent_mixer_forward/backward with its spec."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        expect_instance("RecurrentMixer", "spec", spec, RecurrentSpec)
        self.spec = spec
        std = d_model ** -0.5
        for name in ("Wq", "Wk", "Wv", "Wo"):
            setattr(self, name, Param(normal_init(rng, (d_model, d_model), std, dtype)))
        width = {"gla": d_model, "delta": spec.n_heads}.get(spec.kind)
        self.Wa = None if width is None else Param(normal_init(rng, (d_model, width), std, dtype))

    def weights(self):
        """The Params' arrays as one RecurrentWeights (Wa None for linear and retnet)."""
        return RecurrentWeights(self.Wq.data, self.Wk.data, self.Wv.data, self.Wo.data,
                                None if self.Wa is None else self.Wa.data)

    def forward(self, x):
        return recurrent_mixer_forward(x, self.weights(), spec=self.spec)

    def backward(self, dout, cache):
        g = recurrent_mixer_backward(dout, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))

    def init_state(self, batch, max_len=None):
        """The zero state (B, H, Dh, Dh) ([S | z], Dh + 1 columns, for "linear"); its size does
        not depend on max_len."""
        H = self.spec.n_heads
        Dh = self.Wq.data.shape[1] // H
        cols = Dh + (self.spec.kind == "linear")
        return np.zeros((batch, H, Dh, cols), self.Wq.data.dtype)

    def decode(self, x_t, state, position=None):
        """One token (B, D) -> (B, D); updates `state` in place (position is not needed)."""
        out, new = recurrent_mixer_step(x_t, state, self.weights(), spec=self.spec)
        state[...] = new
        return out
