"""A Mamba-2 token mixer (Dao & Gu 2024, arXiv 2405.21060; upstream `state-spaces/mamba
mamba_ssm/modules/mamba2_simple.py`) around the SSD pair, as a forward/backward pair and a
Module with a constant-size decoding state.

    z = x Wz,   xBC = silu(conv([x Wx | x WB | x WC]))  split into u (H heads of Dh), B, C (N)
    Δ = softplus(x Wdt + dt_bias) (H),  A = −exp(A_log) (H)
    y = ssd(u, Δ, A, B, C, D);   out = rmsnorm(y ⊙ silu(z), norm) Wout
conv is the depthwise causal convolution of Mamba-1 (ssm/mamba.py; kernel K = d_conv) over the
Di + 2GN channels of x, B and C together; the gated RMSNorm is upstream's RMSNormGated with
norm_before_gate=False (gate first, then normalise). With G = spec.n_groups > 1 (upstream's
ngroups) B and C are G groups of N, head h reading group h // (H / G), and the gated RMSNorm
normalises each of the G slices of Di / G apart (its gain still one vector of Di). The
decoding state (Mamba2State) is the last K − 1 conv inputs and the SSD state. The sizes come
from one Mamba2Spec (scratchllm.specs: n_heads, d_state, expand, d_conv, chunk, n_groups);
the arrays of one block travel as one Mamba2Weights.

Glossary: B batch (the array B is SSD's input matrix), T time, D model width, Di = H·Dh
inner width, H heads, Dh head dim, N state size, G groups of B and C, K conv width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import (linear_backward, linear_forward, linear_out, rmsnorm_backward,
                                 rmsnorm_forward, silu_backward, silu_forward,
                                 softplus_backward, softplus_forward)
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_instance,
                                      expect_ndim, expect_shape)
from scratchllm.specs import Mamba2Spec
from scratchllm.ssm.mamba import causal_conv1d_backward, causal_conv1d_forward
from scratchllm.ssm.ssd import ssd_backward, ssd_forward, ssd_step

NORM_EPS = 1e-5  # upstream's RMSNormGated eps


class Mamba2Weights(NamedTuple):
    """The arrays of one Mamba-2 block (the Mamba2 Module's Param names)."""
    Wz: np.ndarray  # (D, Di) gate
    Wx: np.ndarray  # (D, Di) SSD input u
    WB: np.ndarray  # (D, G*N)
    WC: np.ndarray  # (D, G*N)
    Wdt: np.ndarray  # (D, H)
    dt_bias: np.ndarray  # (H,)
    A_log: np.ndarray  # (H,), A = -exp(A_log)
    D: np.ndarray  # (H,) skip
    conv_w: np.ndarray  # (Di + 2GN, K)
    conv_b: np.ndarray  # (Di + 2GN,)
    norm: np.ndarray  # (Di,) the gated RMSNorm's gain
    Wout: np.ndarray  # (Di, D)


class Mamba2State(NamedTuple):
    """Per-layer decoding state; Mamba2.decode overwrites the arrays in place."""
    conv: np.ndarray  # (B, K − 1, Di + 2N) the last conv inputs
    ssd: np.ndarray  # (B, H, N, Dh)


class Mamba2Cache(NamedTuple):
    lin: tuple  # linear caches of z, u, B, C, dt, out
    sp: tuple  # softplus cache
    conv: tuple  # the causal conv's cache and the silu after it
    silu: tuple
    z_act: np.ndarray  # silu(z)
    y: np.ndarray  # SSD output (B, T, H·Dh)
    norm: tuple  # the RMSNorm cache
    A: np.ndarray
    ssd: tuple


def _split(a, Di, N):
    """(..., Di + 2N) -> u (..., Di), B (..., N), C (..., N)."""
    return a[..., :Di], a[..., Di:Di + N], a[..., Di + N:]


def _check(fn, x_ndim, x, w, spec):
    """Check x (B, T, D) or (B, D), w and spec against each other; return (Di, N, H)."""
    expect_instance(fn, "spec", spec, Mamba2Spec)
    expect_instance(fn, "w", w, Mamba2Weights)
    expect_ndim(fn, "x", x, x_ndim, "(B, T, D)" if x_ndim == 3 else "(B, D)")
    expect_float(fn, "x", x)
    Dm = x.shape[-1]
    H, N, Di, K = spec.n_heads, spec.d_state, spec.expand * Dm, spec.d_conv
    G = spec.n_groups
    if Di % H or H % G:
        raise ValueError(f"{fn}: the inner width Di = spec.expand D = {Di} must be a multiple "
                         f"of spec.n_heads = {H}, a multiple of spec.n_groups = {G}")
    hint = (f"H = spec.n_heads = {H}, N = spec.d_state = {N}, G = spec.n_groups = {G}, "
            f"Di = spec.expand D = {Di}")
    for name, shape in (("Wz", (Dm, Di)), ("Wx", (Dm, Di)), ("WB", (Dm, G * N)),
                        ("WC", (Dm, G * N)), ("Wdt", (Dm, H)), ("dt_bias", (H,)),
                        ("A_log", (H,)), ("D", (H,)), ("conv_w", (Di + 2 * G * N, K)),
                        ("conv_b", (Di + 2 * G * N,)), ("norm", (Di,)), ("Wout", (Di, Dm))):
        expect_float(fn, name, getattr(w, name))
        expect_shape(fn, name, getattr(w, name), shape,
                     hint + (f", K = spec.d_conv = {K}" if name == "conv_w" else ""))
    return Di, N, H


def _gated_norm_forward(v, g, G):
    """rmsnorm(v) * g over each of the G slices of v's last axis (Di) apart: (n, cache).
    G = 1 is the plain rmsnorm pair (gain g)."""
    if G == 1:
        return rmsnorm_forward(v, g, NORM_EPS)  # (..., Di)
    vg = v.reshape(v.shape[:-1] + (G, -1))  # (..., G, Di/G)
    nh, c = rmsnorm_forward(vg, np.ones(vg.shape[-1], v.dtype), NORM_EPS)  # (..., G, Di/G)
    nh = nh.reshape(v.shape)  # (..., Di)
    return nh * g, (c, nh, g)


def _gated_norm_backward(dn, cache, G):
    """Reverse of _gated_norm_forward: {"x": dv, "g": dg}."""
    if G == 1:
        return rmsnorm_backward(dn, cache)
    c, nh, g = cache
    dg = (dn * nh).reshape(-1, nh.shape[-1]).sum(axis=0)  # fwd: n = nh g
    dnh = (dn * g).reshape(nh.shape[:-1] + (G, -1))  # (..., G, Di/G)
    return {"x": rmsnorm_backward(dnh, c)["x"].reshape(nh.shape), "g": dg}


def mamba2_forward(x, w, *, spec):
    """Inputs: x (B, T, D); w Mamba2Weights: Wz, Wx (D, Di); WB, WC (D, GN); Wdt (D, H);
    dt_bias, A_log, D (H,); conv_w (Di + 2GN, K), conv_b (Di + 2GN,); norm (Di,); Wout (Di, D);
    spec Mamba2Spec (H = n_heads, N = d_state, Di = expand D, K = d_conv, the scan's chunk,
    G = n_groups).
    Returns out (B, T, D).  Cache: Mamba2Cache of the pairs' caches."""
    x, w = common_float(x, w)
    Di, N, H = _check("mamba2", 3, x, w, spec)
    batch, T, _ = x.shape
    (z, cz), (u, cu), (Bm, cB), (Cm, cC) = (linear_forward(x, W)
                                            for W in (w.Wz, w.Wx, w.WB, w.WC))  # (B, T, .)
    c, cc = causal_conv1d_forward(np.concatenate([u, Bm, Cm], axis=-1), w.conv_w, w.conv_b)
    xbc, ca = silu_forward(c)  # (B, T, Di + 2GN)
    G = spec.n_groups
    u, Bm, Cm = _split(xbc, Di, G * N)
    dt_lin, cdt = linear_forward(x, w.Wdt, w.dt_bias)  # (B, T, H)
    dt, sp = softplus_forward(dt_lin)  # (B, T, H)
    A = -np.exp(w.A_log)  # (H,)
    y, cs = ssd_forward(u.reshape(batch, T, H, -1), dt, A, Bm.reshape(batch, T, G, N),
                        Cm.reshape(batch, T, G, N), w.D, chunk=spec.chunk)  # (B, T, H, Dh)
    y = y.reshape(batch, T, -1)  # (B, T, Di)
    z_act, csilu = silu_forward(z)  # (B, T, Di)
    n, cn = _gated_norm_forward(y * z_act, w.norm, G)  # (B, T, Di)
    out, co = linear_forward(n, w.Wout)  # (B, T, D)
    return out, Mamba2Cache((cz, cu, cB, cC, cdt, co), sp, (cc, ca), csilu, z_act, y, (G, cn),
                            A, cs)


def mamba2_backward(dout, cache):
    """Math: the pairs in reverse: Wout, the RMSNorm (dnorm and the gated input's gradient),
    the SiLU gate (dy = dg·silu(z), dz through silu), SSD (dx, dΔ, dA, dB, dC, dD),
    dA_log = dA·A, Δ through softplus and its linear; u, B, C concatenated back through the
    silu and the causal conv (dconv_w, dconv_b), split again into the three input projections,
    whose dx add up with Wz's and Wdt's.
    Returns: {"x": dx (B, T, D), "w": Mamba2Weights of the gradients}.
    Reference: Dao & Gu 2024, arXiv 2405.21060 (the backward derived here)."""
    expect_dout("mamba2_backward", dout, *linear_out(cache.lin[5]))
    (cz, cu, cB, cC, cdt, co), sp, (cc, ca), csilu, z_act, y, cn, A, cs = cache
    g_o = linear_backward(dout, co)  # fwd: out = n Wout
    g_n = _gated_norm_backward(g_o["x"], cn[1], cn[0])  # fwd: n = rmsnorm_G(y silu(z)) norm
    dz = silu_backward(g_n["x"] * y, csilu)["x"]  # (B, T, Di)
    dy = g_n["x"] * z_act  # (B, T, Di)
    batch, T, Di = dy.shape
    g = ssd_backward(dy.reshape(batch, T, A.shape[0], -1), cs)
    # fwd: [u | B | C] = silu(conv(x [Wx | WB | WC]))
    dxbc = np.concatenate([g["x"].reshape(batch, T, Di), g["B"].reshape(batch, T, -1),
                           g["C"].reshape(batch, T, -1)], -1)  # (B, T, Di + 2GN)
    g_c = causal_conv1d_backward(silu_backward(dxbc, ca)["x"], cc)
    du, dB, dC = _split(g_c["x"], Di, (g_c["x"].shape[-1] - Di) // 2)
    # fwd: dt = softplus(x Wdt + dt_bias)
    g_dt = linear_backward(softplus_backward(g["dt"], sp)["x"], cdt)
    grads, dx = {}, g_dt["x"]
    for name, d, c in (("Wz", dz, cz), ("Wx", du, cu), ("WB", dB, cB), ("WC", dC, cC)):
        g_l = linear_backward(d, c)
        grads[name], dx = g_l["W"], dx + g_l["x"]
    dw = Mamba2Weights(grads["Wz"], grads["Wx"], grads["WB"], grads["WC"], g_dt["W"],
                       g_dt["b"], g["A"] * A,  # fwd: A = -exp(A_log)
                       g["D"], g_c["w"], g_c["b"], g_n["g"], g_o["W"])
    return {"x": dx, "w": dw}


def _check_state(state, batch, width, ssd_shape, K):
    """A Mamba2State of every row: conv (B, K-1, Di + 2GN), ssd (B, H, N, Dh)."""
    expect_instance("mamba2_step", "state", state, Mamba2State)
    expect_shape("mamba2_step", "state.conv", state.conv, (batch, K - 1, width),
                 "(B, K-1, Di + 2GN): the last K-1 conv inputs of every row")
    expect_shape("mamba2_step", "state.ssd", state.ssd, (batch,) + ssd_shape,
                 "(B, H, N, Dh): the SSD state of every row")


def mamba2_step(x_t, state, w, *, spec):
    """One decoding token: x_t (B, D), state a Mamba2State, w and spec as in mamba2_forward
    -> (out_t (B, D), the new Mamba2State); the inputs are not modified."""
    Di, N, H = _check("mamba2_step", 2, x_t, w, spec)
    batch = x_t.shape[0]
    _check_state(state, batch, Di + 2 * spec.n_groups * N, (H, N, Di // H), spec.d_conv)
    z = linear_forward(x_t, w.Wz)[0]  # (B, Di)
    xbc = np.concatenate([linear_forward(x_t, W)[0] for W in (w.Wx, w.WB, w.WC)],
                         -1)  # (B, Di + 2GN)
    window = np.concatenate([state.conv, xbc[:, None]], axis=1)  # (B, K, Di + 2N)
    xc = causal_conv1d_forward(window, w.conv_w, w.conv_b)[0][:, -1]  # (B, Di + 2N)
    G = spec.n_groups
    u, Bm, Cm = _split(silu_forward(xc)[0], Di, G * N)
    dt = softplus_forward(linear_forward(x_t, w.Wdt, w.dt_bias)[0])[0]  # (B, H)
    y, ssd = ssd_step(u.reshape(batch, H, -1), dt, -np.exp(w.A_log), Bm.reshape(batch, G, N),
                      Cm.reshape(batch, G, N), w.D, state.ssd)  # (B, H, Dh)
    n = _gated_norm_forward(y.reshape(batch, -1) * silu_forward(z)[0], w.norm, G)[0]
    return linear_forward(n, w.Wout)[0], Mamba2State(window[:, 1:], ssd)  # (B, D)


class Mamba2(Module):
    """A Mamba-2 block of a Mamba2Spec: owns the block's Params (the names of Mamba2Weights'
    fields; upstream's init: A = −(1..H) spread as A_log = log U[1, 16], dt ~ logU[1e-3, 0.1]
    through dt_bias = softplus^-1(dt), D = 1, norm = 1, the conv as PyTorch's Conv1d:
    U(±1/√K)); calls mamba2_forward/backward with its spec."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        expect_instance("Mamba2", "spec", spec, Mamba2Spec)
        Di, H, d_conv = spec.expand * d_model, spec.n_heads, spec.d_conv
        N = spec.n_groups * spec.d_state  # the B and C widths (G groups of d_state)
        self.spec = spec
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(0.1), H))  # (H,)
        init = {"Wz": (d_model, Di), "Wx": (d_model, Di), "WB": (d_model, N),
                "WC": (d_model, N), "Wdt": (d_model, H)}
        for name, shape in init.items():
            setattr(self, name, Param(normal_init(rng, shape, d_model ** -0.5, dtype)))
        self.dt_bias = Param((dt + np.log(-np.expm1(-dt))).astype(dtype))  # (H,)
        self.A_log = Param(np.log(rng.uniform(1, 16, H)).astype(dtype))  # (H,)
        self.D = Param(np.ones(H, dtype))  # (H,)
        bound = d_conv ** -0.5  # PyTorch's Conv1d init, fan_in = K (depthwise)
        self.conv_w = Param(rng.uniform(-bound, bound, (Di + 2 * N, d_conv)).astype(dtype))
        self.conv_b = Param(rng.uniform(-bound, bound, Di + 2 * N).astype(dtype))
        self.norm = Param(np.ones(Di, dtype))  # (Di,)
        self.Wout = Param(normal_init(rng, (Di, d_model), Di ** -0.5, dtype))

    def weights(self):
        """The Params' arrays as one Mamba2Weights."""
        return Mamba2Weights(*(getattr(self, n).data for n in Mamba2Weights._fields))

    def forward(self, x):
        return mamba2_forward(x, self.weights(), spec=self.spec)

    def backward(self, dout, cache):
        g = mamba2_backward(dout, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))

    def init_state(self, batch, max_len=None):
        """Zero states: the conv's (B, K − 1, Di + 2N) and SSD's (B, H, N, Dh); their size does
        not grow with max_len."""
        H, N, dtype = self.A_log.data.shape[0], self.spec.d_state, self.Wx.data.dtype
        (C, K), Dh = self.conv_w.data.shape, self.Wx.data.shape[1] // H
        return Mamba2State(np.zeros((batch, K - 1, C), dtype), np.zeros((batch, H, N, Dh), dtype))

    def decode(self, x_t, state, position=None):
        """One token (B, D) -> (B, D); updates `state` in place."""
        out, new = mamba2_step(x_t, state, self.weights(), spec=self.spec)
        state.conv[...], state.ssd[...] = new.conv, new.ssd
        return out
