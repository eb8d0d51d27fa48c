"""A Mamba-2 token mixer (Dao & Gu 2024, arXiv 2405.21060; upstream `state-spaces/mamba
mamba_ssm/modules/mamba2_simple.py`, one group) around the SSD pair, as a forward/backward
pair and a Module with a constant-size decoding state.

    z = x Wz,   xBC = silu(conv([x Wx | x WB | x WC]))  split into u (H heads of Dh), B, C (N)
    Δ = softplus(x Wdt + dt_bias) (H),  A = −exp(A_log) (H)
    y = ssd(u, Δ, A, B, C, D);   out = rmsnorm(y ⊙ silu(z), norm) Wout
conv is the depthwise causal convolution of Mamba-1 (ssm/mamba.py; kernel K = d_conv) over the
Di + 2N channels of x, B and C together; the gated RMSNorm is upstream's RMSNormGated with
norm_before_gate=False (gate first, then normalise). The decoding state is the last K − 1
conv inputs and the SSD state.

Glossary: B batch (the array B is SSD's input matrix), T time, D model width, Di = H·Dh
inner width, H heads, Dh head dim, N state size, K conv width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import (linear_backward, linear_forward, linear_out, rmsnorm_backward,
                                 rmsnorm_forward, silu_backward, silu_forward,
                                 softplus_backward, softplus_forward)
from scratchllm.core.validate import expect_dout, expect_float, expect_ndim, expect_shape
from scratchllm.ssm.mamba import causal_conv1d_backward, causal_conv1d_forward
from scratchllm.ssm.ssd import ssd_backward, ssd_forward, ssd_step

WEIGHTS = ("Wz", "Wx", "WB", "WC", "Wdt", "dt_bias", "A_log", "D", "conv_w", "conv_b", "norm",
           "Wout")
NORM_EPS = 1e-5  # upstream's RMSNormGated eps


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


def mamba2_forward(x, Wz, Wx, WB, WC, Wdt, dt_bias, A_log, D, conv_w, conv_b, norm, Wout, *,
                   chunk=64):
    """Inputs: x (B, T, D); Wz, Wx (D, Di); WB, WC (D, N); Wdt (D, H); dt_bias, A_log, D (H,);
    conv_w (Di + 2N, K), conv_b (Di + 2N,); norm (Di,); Wout (Di, D). Returns out (B, T, D)."""
    expect_ndim("mamba2", "x", x, 3, "(B, T, D)")
    expect_float("mamba2", "x", x)
    batch, T, Dm = x.shape
    expect_float("mamba2", "A_log", A_log)
    expect_ndim("mamba2", "A_log", A_log, 1, "(H,)")
    H = A_log.shape[0]
    expect_shape("mamba2", "Wz", Wz, (Dm, None), "(D, Di)")
    if H == 0 or Wz.shape[1] % H:
        raise ValueError(f"mamba2: Wz has shape {Wz.shape}, expected (D, Di) with H = {H} | Di")
    expect_shape("mamba2", "Wx", Wx, Wz.shape, "(D, Di), like Wz")
    expect_shape("mamba2", "WB", WB, (Dm, None), "(D, N)")
    expect_shape("mamba2", "WC", WC, WB.shape, "(D, N), like WB")
    expect_shape("mamba2", "Wdt", Wdt, (Dm, H), "(D, H)")
    for name, a in (("dt_bias", dt_bias), ("D", D)):
        expect_shape("mamba2", name, a, (H,), "(H,), like A_log")
    expect_shape("mamba2", "norm", norm, (Wz.shape[1],), "(Di,)")
    expect_shape("mamba2", "Wout", Wout, Wz.shape[::-1], "(Di, D)")
    Di, N = Wx.shape[1], WB.shape[1]
    (z, cz), (u, cu), (Bm, cB), (Cm, cC) = (linear_forward(x, W) for W in (Wz, Wx, WB, WC))
    c, cc = causal_conv1d_forward(np.concatenate([u, Bm, Cm], axis=-1), conv_w, conv_b)
    xbc, ca = silu_forward(c)  # (B, T, Di + 2N)
    u, Bm, Cm = _split(xbc, Di, N)
    dt_lin, cdt = linear_forward(x, Wdt, dt_bias)  # (B, T, H)
    dt, sp = softplus_forward(dt_lin)  # (B, T, H)
    A = -np.exp(A_log)  # (H,)
    y, cs = ssd_forward(u.reshape(batch, T, H, -1), dt, A, Bm[:, :, None], Cm[:, :, None], D,
                        chunk=chunk)  # (B, T, H, Dh)
    y = y.reshape(batch, T, -1)  # (B, T, Di)
    z_act, csilu = silu_forward(z)  # (B, T, Di)
    n, cn = rmsnorm_forward(y * z_act, norm, NORM_EPS)  # (B, T, Di)
    out, co = linear_forward(n, Wout)  # (B, T, D)
    return out, Mamba2Cache((cz, cu, cB, cC, cdt, co), sp, (cc, ca), csilu, z_act, y, cn, A, cs)


def mamba2_backward(dout, cache):
    """Math: the pairs in reverse: Wout, the RMSNorm (dnorm and the gated input's gradient),
    the SiLU gate (dy = dg·silu(z), dz through silu), SSD (dx, dΔ, dA, dB, dC, dD),
    dA_log = dA·A, Δ through softplus and its linear; u, B, C concatenated back through the
    silu and the causal conv (dconv_w, dconv_b), split again into the three input projections,
    whose dx add up with Wz's and Wdt's.
    Reference: Dao & Gu 2024, arXiv 2405.21060 (the backward derived here)."""
    expect_dout("mamba2_backward", dout, *linear_out(cache.lin[5]))
    (cz, cu, cB, cC, cdt, co), sp, (cc, ca), csilu, z_act, y, cn, A, cs = cache
    g_o = linear_backward(dout, co)  # fwd: out = n Wout
    g_n = rmsnorm_backward(g_o["x"], cn)  # fwd: n = rmsnorm(y * silu(z), norm)
    dz = silu_backward(g_n["x"] * y, csilu)["x"]  # (B, T, Di)
    dy = g_n["x"] * z_act  # (B, T, Di)
    batch, T, Di = dy.shape
    g = ssd_backward(dy.reshape(batch, T, A.shape[0], -1), cs)
    # fwd: [u | B | C] = silu(conv(x [Wx | WB | WC]))
    dxbc = np.concatenate([g["x"].reshape(batch, T, Di), g["B"][:, :, 0], g["C"][:, :, 0]], -1)
    g_c = causal_conv1d_backward(silu_backward(dxbc, ca)["x"], cc)
    du, dB, dC = _split(g_c["x"], Di, g["B"].shape[-1])
    # fwd: dt = softplus(x Wdt + dt_bias)
    g_dt = linear_backward(softplus_backward(g["dt"], sp)["x"], cdt)
    grads, dx = {}, g_dt["x"]
    for name, d, c in (("Wz", dz, cz), ("Wx", du, cu), ("WB", dB, cB), ("WC", dC, cC)):
        g_l = linear_backward(d, c)
        grads[name], dx = g_l["W"], dx + g_l["x"]
    return {"x": dx, **grads, "Wdt": g_dt["W"], "dt_bias": g_dt["b"], "A_log": g["A"] * A,
            "D": g["D"], "conv_w": g_c["w"], "conv_b": g_c["b"], "norm": g_n["g"],
            "Wout": g_o["W"]}  # fwd: A = -exp(A_log)


class Mamba2State(NamedTuple):
    """Per-layer decoding state; decode() overwrites the arrays in place."""
    conv: np.ndarray  # (B, K − 1, Di + 2N) the last conv inputs
    ssd: np.ndarray  # (B, H, N, Dh)


def mamba2_step(x_t, state, Wz, Wx, WB, WC, Wdt, dt_bias, A_log, D, conv_w, conv_b, norm,
                Wout):
    """One decoding token: x_t (B, D), state a Mamba2State -> (out_t (B, D), new state)."""
    batch, H, Di, N = x_t.shape[0], A_log.shape[0], Wx.shape[1], WB.shape[1]
    z = linear_forward(x_t, Wz)[0]  # (B, Di)
    xbc = np.concatenate([linear_forward(x_t, W)[0] for W in (Wx, WB, WC)], -1)  # (B, Di+2N)
    window = np.concatenate([state.conv, xbc[:, None]], axis=1)  # (B, K, Di + 2N)
    u, Bm, Cm = _split(silu_forward(causal_conv1d_forward(window, conv_w, conv_b)[0][:, -1])[0],
                       Di, N)
    dt = softplus_forward(linear_forward(x_t, Wdt, dt_bias)[0])[0]  # (B, H)
    y, ssd = ssd_step(u.reshape(batch, H, -1), dt, -np.exp(A_log), Bm[:, None], Cm[:, None],
                      D, state.ssd)  # (B, H, Dh)
    n = rmsnorm_forward(y.reshape(batch, -1) * silu_forward(z)[0], norm, NORM_EPS)[0]
    return linear_forward(n, Wout)[0], Mamba2State(window[:, 1:], ssd)


class Mamba2(Module):
    """Owns the block's Params (upstream's init: A = −(1..H) spread as A_log = log U[1, 16],
    dt ~ logU[1e-3, 0.1] through dt_bias = softplus^-1(dt), D = 1, norm = 1, the conv as
    PyTorch's Conv1d: U(±1/√K)); calls mamba2_forward/backward."""

    def __init__(self, d_model, *, n_heads=4, d_state=16, expand=2, d_conv=4, chunk=64, rng,
                 dtype=np.float32):
        Di = expand * d_model
        H, N = n_heads, d_state
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
        self.chunk = chunk

    def _weights(self):
        return [getattr(self, name).data for name in WEIGHTS]

    def forward(self, x):
        return mamba2_forward(x, *self._weights(), chunk=self.chunk)

    def backward(self, dout, cache):
        return self.add_grads(mamba2_backward(dout, cache))

    def init_state(self, batch, max_len=None):
        """Zero states: the conv's (B, K − 1, Di + 2N) and SSD's (B, H, N, Dh); their size does
        not grow with max_len."""
        H, N, dtype = self.A_log.data.shape[0], self.WB.data.shape[1], self.Wx.data.dtype
        (C, K), Dh = self.conv_w.data.shape, self.Wx.data.shape[1] // H
        return Mamba2State(np.zeros((batch, K - 1, C), dtype), np.zeros((batch, H, N, Dh), dtype))

    def decode(self, x_t, state, position=None):
        """One token (B, D) -> (B, D); updates `state` in place."""
        out, new = mamba2_step(x_t, state, *self._weights())
        state.conv[...], state.ssd[...] = new.conv, new.ssd
        return out
