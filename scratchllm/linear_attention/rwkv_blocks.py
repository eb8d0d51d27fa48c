"""RWKV-4's time-mix and channel-mix blocks (Peng et al. 2023, arXiv 2305.13048, section 3;
upstream `BlinkDL/RWKV-LM RWKV-v4/src/model.py` RWKV_TimeMix and RWKV_ChannelMix).

Token shift: x'_t = x_{t-1} (x'_0 = 0); each branch mixes lerp(x', x, μ) = μ x + (1 − μ) x'.
Time-mix:    k = lerp_k Wk, v = lerp_v Wv, r = lerp_r Wr,
             out = (σ(r) ⊙ wkv(w = exp(time_decay), u = time_first, k, v)) Wo
Channel-mix: k = relu(lerp_k Wk)², r = lerp_r Wr,  out = σ(r) ⊙ (k Wv)
Time-mix trains through WKV's recurrent form (the stabilised scan and its reverse-time adjoint,
O(B·T·D) memory), never the (B, D, T, T) softmax of the parallel form.
Decoding keeps the previous token's x per block (and the WKV state for time-mix).
The arrays of one block travel as one TimeMixWeights or ChannelMixWeights.

Glossary: B batch, T time, D model width, F channel-mix hidden width; μ (D,) the mixes.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import (linear_backward, linear_forward, linear_out, sigmoid_backward,
                                 sigmoid_forward)
from scratchllm.core.validate import (expect_dout, expect_float, expect_instance, expect_ndim,
                                      expect_shape)
from scratchllm.linear_attention.rwkv import (WKVState, check_wkv_state, rwkv4_wkv_backward,
                                              rwkv4_wkv_forward, rwkv4_wkv_step)
from scratchllm.specs import RWKVSpec


class TimeMixWeights(NamedTuple):
    """The arrays of one time-mix block (the RWKV4TimeMix Module's Param names)."""
    mix_k: np.ndarray  # (D,) μ of the key's lerp
    mix_v: np.ndarray  # (D,)
    mix_r: np.ndarray  # (D,)
    time_decay: np.ndarray  # (D,) w = exp(time_decay)
    time_first: np.ndarray  # (D,) u, the current token's bonus
    Wk: np.ndarray  # (D, D)
    Wv: np.ndarray  # (D, D)
    Wr: np.ndarray  # (D, D)
    Wo: np.ndarray  # (D, D)


class ChannelMixWeights(NamedTuple):
    """The arrays of one channel-mix block."""
    mix_k: np.ndarray  # (D,)
    mix_r: np.ndarray  # (D,)
    Wk: np.ndarray  # (D, F)
    Wr: np.ndarray  # (D, D)
    Wv: np.ndarray  # (F, D)


def _check(fn, x, w, kind, vectors):
    """x (B, T, D) float, w a `kind` and each of its `vectors` (D,); returns D."""
    expect_ndim(fn, "x", x, 3, "(B, T, D)")
    expect_float(fn, "x", x)
    expect_instance(fn, "w", w, kind)
    for name in vectors:
        expect_float(fn, name, getattr(w, name))
        expect_shape(fn, name, getattr(w, name), (x.shape[2],), "(D,): one per channel")
    return x.shape[2]


def _shift(x):
    """x'_t = x_{t-1}, zeros at t = 0: (B, T, D)."""
    return np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)  # (B, T, D)


def _unshift(dxs):
    """The adjoint of _shift: dx_t = dx'_{t+1}."""
    return np.concatenate([dxs[:, 1:], np.zeros_like(dxs[:, :1])], axis=1)  # (B, T, D)


def _lerp_backward(d, x, xs, mu):
    """fwd: m = μ x + (1 − μ) x'  ->  (dx, dx', dμ)."""
    return d * mu, d * (1 - mu), (d * (x - xs)).sum(axis=(0, 1))


class TimeMixCache(NamedTuple):
    x: np.ndarray
    xs: np.ndarray  # the shifted x
    mus: tuple  # (mix_k, mix_v, mix_r)
    decay: np.ndarray  # exp(time_decay), WKV's w
    lin: tuple  # linear caches of k, v, r, out
    sig: tuple
    sr: np.ndarray  # sigmoid(r)
    wkv_out: np.ndarray
    wkv: tuple


def rwkv4_time_mix_forward(x, w):
    """Inputs: x (B, T, D); w TimeMixWeights: mix_k, mix_v, mix_r (D,); time_decay, time_first
    (D,) (decay exp(time_decay), u = time_first); Wk, Wv, Wr, Wo (D, D).
    Returns out (B, T, D)."""
    fn = "rwkv4_time_mix"
    D = _check(fn, x, w, TimeMixWeights, w._fields[:5])
    for name in ("Wk", "Wv", "Wr", "Wo"):
        expect_shape(fn, name, getattr(w, name), (D, D), "(D, D)")
    xs = _shift(x)  # (B, T, D)
    mus = (w.mix_k, w.mix_v, w.mix_r)
    lerp = [mu * x + (1 - mu) * xs for mu in mus]  # 3 x (B, T, D)
    (k, ck), (v, cv), (r, cr) = (linear_forward(m, W) for m, W in zip(lerp, (w.Wk, w.Wv, w.Wr)))
    decay = np.exp(w.time_decay)  # (D,)
    y, cw = rwkv4_wkv_forward(decay, w.time_first, k, v)  # (B, T, D)
    sr, cs = sigmoid_forward(r)  # (B, T, D)
    out, co = linear_forward(sr * y, w.Wo)  # (B, T, D)
    return out, TimeMixCache(x, xs, mus, decay, (ck, cv, cr, co), cs, sr, y, cw)


def rwkv4_time_mix_backward(dout, cache):
    """Math: the pairs in reverse (linear, σ, WKV, linear ×3), dtime_decay = dw · w, and each
    lerp's adjoint onto x, the shifted x (then shifted back) and μ.
    Returns: {"x": dx (B, T, D), "w": TimeMixWeights of the gradients}.
    Reference: Peng et al. 2023, arXiv 2305.13048 (the backward derived here)."""
    expect_dout("rwkv4_time_mix_backward", dout, *linear_out(cache.lin[3]))
    x, xs, mus, decay, (ck, cv, cr, co), cs, sr, y, cw = cache
    g_o = linear_backward(dout, co)  # fwd: out = (sr * y) Wo
    g_s = sigmoid_backward(g_o["x"] * y, cs)  # fwd: sr = sigmoid(r)
    g_w = rwkv4_wkv_backward(g_o["x"] * sr, cw)  # fwd: y = wkv(w, u, k, v)
    dx, dxs, grads = np.zeros_like(x), np.zeros_like(x), {}
    for name, d, c, mu in (("k", g_w["k"], ck, mus[0]), ("v", g_w["v"], cv, mus[1]),
                           ("r", g_s["x"], cr, mus[2])):
        g_l = linear_backward(d, c)  # fwd: k = lerp_k Wk, ...
        a, b, grads["mix_" + name] = _lerp_backward(g_l["x"], x, xs, mu)
        dx, dxs, grads["W" + name] = dx + a, dxs + b, g_l["W"]
    dw = TimeMixWeights(grads["mix_k"], grads["mix_v"], grads["mix_r"],
                        g_w["w"] * decay,  # fwd: decay = exp(time_decay)
                        g_w["u"], grads["Wk"], grads["Wv"], grads["Wr"], g_o["W"])
    return {"x": dx + _unshift(dxs), "w": dw}


class ChannelMixCache(NamedTuple):
    x: np.ndarray
    xs: np.ndarray
    mus: tuple  # (mix_k, mix_r)
    lin: tuple  # linear caches of k, r, value
    h: np.ndarray  # lerp_k Wk, before relu²
    sig: tuple
    sr: np.ndarray
    kv: np.ndarray


def rwkv4_channel_mix_forward(x, w):
    """Inputs: x (B, T, D); w ChannelMixWeights: mix_k, mix_r (D,); Wk (D, F), Wr (D, D),
    Wv (F, D). Returns out (B, T, D) = σ(lerp_r Wr) ⊙ (relu(lerp_k Wk)² Wv)."""
    fn = "rwkv4_channel_mix"
    D = _check(fn, x, w, ChannelMixWeights, ("mix_k", "mix_r"))
    expect_shape(fn, "Wk", w.Wk, (D, None), "(D, F)")
    expect_shape(fn, "Wr", w.Wr, (D, D), "(D, D)")
    expect_shape(fn, "Wv", w.Wv, (w.Wk.shape[1], D), "(F, D) with F = Wk.shape[1]")
    xs = _shift(x)  # (B, T, D)
    (h, ck), (r, cr) = (linear_forward(mu * x + (1 - mu) * xs, W)
                        for mu, W in ((w.mix_k, w.Wk), (w.mix_r, w.Wr)))  # (B, T, F), (B, T, D)
    kv, cv = linear_forward(np.maximum(h, 0) ** 2, w.Wv)  # (B, T, D)
    sr, cs = sigmoid_forward(r)  # (B, T, D)
    return sr * kv, ChannelMixCache(x, xs, (w.mix_k, w.mix_r), (ck, cr, cv), h, cs, sr, kv)


def rwkv4_channel_mix_backward(dout, cache):
    """Math: out = σ(r) ⊙ kv: dkv = dout σ(r), dσ = dout kv; kv = relu(h)² Wv:
    dh = 2 relu(h) ⊙ (dkv Wv^T); then the linears and the lerps (as time-mix).
    Returns: {"x": dx (B, T, D), "w": ChannelMixWeights of the gradients}.
    Reference: Peng et al. 2023, arXiv 2305.13048 (the backward derived here)."""
    expect_dout("rwkv4_channel_mix_backward", dout, cache.x.shape,
                np.result_type(cache.sr, cache.kv))
    x, xs, (mix_k, mix_r), (ck, cr, cv), h, cs, sr, kv = cache
    g_v = linear_backward(dout * sr, cv)  # fwd: kv = relu(h)^2 Wv
    g_s = sigmoid_backward(dout * kv, cs)  # fwd: sr = sigmoid(r)
    g_k = linear_backward(g_v["x"] * 2 * np.maximum(h, 0), ck)  # fwd: relu(h)^2
    g_r = linear_backward(g_s["x"], cr)
    ak, bk, dmk = _lerp_backward(g_k["x"], x, xs, mix_k)
    ar, br, dmr = _lerp_backward(g_r["x"], x, xs, mix_r)
    dw = ChannelMixWeights(dmk, dmr, g_k["W"], g_r["W"], g_v["W"])
    return {"x": ak + ar + _unshift(bk + br), "w": dw}


def _check_x_prev(fn, x_t, x_prev):
    """x_t (B, D) float; the previous token's x None or exactly (B, D), never broadcast."""
    expect_float(fn, "x_t", x_t)
    expect_ndim(fn, "x_t", x_t, 2, "(B, D)")
    if x_prev is not None:
        expect_shape(fn, "x_prev", x_prev, x_t.shape, "(B, D) of this step's rows")


def _step_state(fn, x_t, state):
    """The time-mix decoding state (previous x, WKVState), each part checked against x_t."""
    if not (isinstance(state, tuple) and len(state) == 2):
        raise TypeError(f"{fn}: state must be (previous x or None, WKVState or None), got "
                        f"{type(state).__name__}")
    _check_x_prev(fn, x_t, state[0])
    check_wkv_state(fn, "state.wkv", state[1], x_t.shape)
    return state


def rwkv4_time_mix_step(x_t, state, w):
    """One decoding step. x_t (B, D); state (previous x (B, D) or None, WKVState or None);
    w TimeMixWeights. Returns (out_t (B, D), new state)."""
    x_prev, wkv_state = _step_state("rwkv4_time_mix_step", x_t, state)
    xs = np.zeros_like(x_t) if x_prev is None else x_prev  # (B, D)
    k, v, r = (linear_forward(mu * x_t + (1 - mu) * xs, W)[0]
               for mu, W in ((w.mix_k, w.Wk), (w.mix_v, w.Wv), (w.mix_r, w.Wr)))  # (B, D) each
    y, wkv_state = rwkv4_wkv_step(np.exp(w.time_decay), w.time_first, k, v, wkv_state)
    return linear_forward(sigmoid_forward(r)[0] * y, w.Wo)[0], (x_t, wkv_state)


def rwkv4_channel_mix_step(x_t, x_prev, w):
    """One decoding step. x_t, x_prev (B, D) (x_prev None at the start); w ChannelMixWeights.
    Returns (out_t, x_t)."""
    _check_x_prev("rwkv4_channel_mix_step", x_t, x_prev)
    xs = np.zeros_like(x_t) if x_prev is None else x_prev  # (B, D)
    h = linear_forward(w.mix_k * x_t + (1 - w.mix_k) * xs, w.Wk)[0]  # (B, F)
    r = linear_forward(w.mix_r * x_t + (1 - w.mix_r) * xs, w.Wr)[0]  # (B, D)
    return sigmoid_forward(r)[0] * linear_forward(np.maximum(h, 0) ** 2, w.Wv)[0], x_t


class RWKV4TimeMix(Module):
    """RWKV-4 time-mix as a token mixer of an RWKVSpec; owns the Params named as
    TimeMixWeights' fields, with upstream's init for the first layer: time_decay_c =
    −5 + 8 (c/(D−1))^0.7, time_first = log 0.3, μ_k = μ_v = c/D, μ_r = (c/D)/2, W ~ N(0, 1/D).
    The decoding state is (previous x (B, D), WKVState): 4·D numbers per sequence."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        expect_instance("RWKV4TimeMix", "spec", spec, RWKVSpec)
        self.spec = spec
        c = np.arange(d_model) / d_model  # (D,)
        init = dict(mix_k=c, mix_v=c, mix_r=0.5 * c,
                    time_decay=-5 + 8 * (np.arange(d_model) / max(d_model - 1, 1)) ** 0.7,
                    time_first=np.full(d_model, np.log(0.3)))
        for name, value in init.items():
            setattr(self, name, Param(value.astype(dtype)))
        for name in ("Wk", "Wv", "Wr", "Wo"):
            setattr(self, name, Param(normal_init(rng, (d_model, d_model), d_model ** -0.5,
                                                  dtype)))

    def weights(self):
        """The Params' arrays as one TimeMixWeights."""
        return TimeMixWeights(*(getattr(self, n).data for n in TimeMixWeights._fields))

    def forward(self, x):
        return rwkv4_time_mix_forward(x, self.weights())

    def backward(self, dout, cache):
        g = rwkv4_time_mix_backward(dout, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))

    def init_state(self, batch, max_len=None):
        """[previous x, a, b, p] as one (4, B, D) array (p starts at −1e38, as upstream)."""
        state = np.zeros((4, batch, self.Wk.data.shape[0]), self.Wk.data.dtype)
        state[3] = -1e38
        return state

    def decode(self, x_t, state, position=None):
        """One token (B, D) -> (B, D); updates `state` in place. At position 0 the previous x
        is zero (the token shift's padding), which the zero state already holds."""
        out, (x_prev, wkv) = rwkv4_time_mix_step(x_t, (state[0], WKVState(*state[1:])),
                                                 self.weights())
        state[0], state[1], state[2], state[3] = x_prev, wkv.a, wkv.b, wkv.p
        return out


class RWKV4ChannelMix(Module):
    """RWKV-4 channel-mix as a Module of width d_ff (a Block's FFN, FFNSpec kind
    "channel_mix"); owns the Params named as ChannelMixWeights' fields: μ_k = μ_r = c/D,
    Wk ~ N(0, 1/D), Wr ~ N(0, 1/D), Wv ~ N(0, 1/F). Its decoding state is the previous token's x (B, D)
    (zero at position 0: the token shift's padding)."""

    def __init__(self, d_model, d_ff, *, rng, dtype=np.float32):
        c = (np.arange(d_model) / d_model).astype(dtype)  # (D,)
        self.mix_k, self.mix_r = Param(c.copy()), Param(c.copy())
        self.Wk = Param(normal_init(rng, (d_model, d_ff), d_model ** -0.5, dtype))
        self.Wr = Param(normal_init(rng, (d_model, d_model), d_model ** -0.5, dtype))
        self.Wv = Param(normal_init(rng, (d_ff, d_model), d_ff ** -0.5, dtype))

    def weights(self):
        """The Params' arrays as one ChannelMixWeights."""
        return ChannelMixWeights(*(getattr(self, n).data for n in ChannelMixWeights._fields))

    def forward(self, x):
        return rwkv4_channel_mix_forward(x, self.weights())

    def backward(self, dout, cache):
        g = rwkv4_channel_mix_backward(dout, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))

    def init_state(self, batch):
        """The previous token's x, (B, D) zeros."""
        return np.zeros((batch, self.Wr.data.shape[0]), self.Wr.data.dtype)

    def decode(self, x_t, state):
        """One token (B, D) -> (B, D); `state` (init_state) becomes x_t, in place."""
        out, _ = rwkv4_channel_mix_step(x_t, state, self.weights())
        state[...] = x_t
        return out
