"""A Mamba-2 token mixer (Dao & Gu 2024, arXiv 2405.21060; upstream `state-spaces/mamba
mamba_ssm/modules/mamba2_simple.py`) around the SSD pair, as a forward/backward pair and a
Module with a constant-size decoding state.

    z = x Wz,  u = x Wx (H heads of Dh),  B = x WB,  C = x WC (one group, N each)
    Δ = softplus(x Wdt + dt_bias) (H),  A = −exp(A_log) (H)
    y = ssd(u, Δ, A, B, C, D);   out = (y ⊙ silu(z)) Wout
Simplified against upstream: no depthwise causal convolution on (u, B, C) and no gated
RMSNorm before Wout (the SiLU gate is applied directly), so the state is the SSD state alone.

Glossary: B batch (the array B is SSD's input matrix), T time, D model width, H heads,
Dh head dim, N state size.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import (linear_backward, linear_forward, linear_out, silu_backward,
                                 silu_forward, softplus_backward, softplus_forward)
from scratchllm.core.validate import expect_dout, expect_float, expect_ndim, expect_shape
from scratchllm.ssm.ssd import ssd_backward, ssd_forward, ssd_step

WEIGHTS = ("Wz", "Wx", "WB", "WC", "Wdt", "dt_bias", "A_log", "D", "Wout")


class Mamba2Cache(NamedTuple):
    lin: tuple  # linear caches of z, u, B, C, dt, out
    sp: tuple  # softplus cache
    silu: tuple
    z_act: np.ndarray  # silu(z)
    y: np.ndarray  # SSD output (B, T, H·Dh)
    A: np.ndarray
    ssd: tuple


def mamba2_forward(x, Wz, Wx, WB, WC, Wdt, dt_bias, A_log, D, Wout, *, chunk=64):
    """Inputs: x (B, T, D); Wz, Wx (D, H·Dh); WB, WC (D, N); Wdt (D, H); dt_bias, A_log, D (H,);
    Wout (H·Dh, D). Returns out (B, T, D)."""
    expect_ndim("mamba2", "x", x, 3, "(B, T, D)")
    expect_float("mamba2", "x", x)
    batch, T, Dm = x.shape
    expect_ndim("mamba2", "A_log", A_log, 1, "(H,)")
    H = A_log.shape[0]
    expect_shape("mamba2", "Wz", Wz, (Dm, None), "(D, H·Dh)")
    if Wz.shape[1] % H:
        raise ValueError(f"mamba2: Wz has shape {Wz.shape}, expected (D, H·Dh) with H = {H}")
    expect_shape("mamba2", "Wx", Wx, Wz.shape, "(D, H·Dh), like Wz")
    expect_shape("mamba2", "WB", WB, (Dm, None), "(D, N)")
    expect_shape("mamba2", "WC", WC, WB.shape, "(D, N), like WB")
    expect_shape("mamba2", "Wdt", Wdt, (Dm, H), "(D, H)")
    for name, a in (("dt_bias", dt_bias), ("D", D)):
        expect_shape("mamba2", name, a, (H,), "(H,), like A_log")
    expect_shape("mamba2", "Wout", Wout, Wz.shape[::-1], "(H·Dh, D)")
    (z, cz), (u, cu), (Bm, cB), (Cm, cC) = (linear_forward(x, W) for W in (Wz, Wx, WB, WC))
    dt_lin, cdt = linear_forward(x, Wdt, dt_bias)  # (B, T, H)
    dt, sp = softplus_forward(dt_lin)  # (B, T, H)
    A = -np.exp(A_log)  # (H,)
    y, cs = ssd_forward(u.reshape(batch, T, H, -1), dt, A, Bm[:, :, None], Cm[:, :, None], D,
                        chunk=chunk)  # (B, T, H, Dh)
    y = y.reshape(batch, T, -1)  # (B, T, H·Dh)
    z_act, csilu = silu_forward(z)  # (B, T, H·Dh)
    out, co = linear_forward(y * z_act, Wout)  # (B, T, D)
    return out, Mamba2Cache((cz, cu, cB, cC, cdt, co), sp, csilu, z_act, y, A, cs)


def mamba2_backward(dout, cache):
    """Math: the pairs in reverse: Wout, the SiLU gate (dy = dg·silu(z), dz through silu),
    SSD (dx, dΔ, dA, dB, dC, dD), dA_log = dA·A, Δ through softplus and its linear, and the four
    input projections, whose dx add up.
    Reference: Dao & Gu 2024, arXiv 2405.21060 (the backward derived here)."""
    expect_dout("mamba2_backward", dout, *linear_out(cache.lin[5]))
    (cz, cu, cB, cC, cdt, co), sp, csilu, z_act, y, A, cs = cache
    g_o = linear_backward(dout, co)  # fwd: out = (y * silu(z)) Wout
    dz = silu_backward(g_o["x"] * y, csilu)["x"]  # (B, T, H·Dh)
    dy = g_o["x"] * z_act  # (B, T, H·Dh)
    batch, T, HD = dy.shape
    g = ssd_backward(dy.reshape(batch, T, A.shape[0], -1), cs)
    # fwd: dt = softplus(x Wdt + dt_bias)
    g_dt = linear_backward(softplus_backward(g["dt"], sp)["x"], cdt)
    grads, dx = {}, g_dt["x"]
    for name, d, c in (("Wz", dz, cz), ("Wx", g["x"].reshape(batch, T, HD), cu),
                       ("WB", g["B"][:, :, 0], cB), ("WC", g["C"][:, :, 0], cC)):
        g_l = linear_backward(d, c)
        grads[name], dx = g_l["W"], dx + g_l["x"]
    return {"x": dx, **grads, "Wdt": g_dt["W"], "dt_bias": g_dt["b"], "A_log": g["A"] * A,
            "D": g["D"], "Wout": g_o["W"]}  # fwd: A = -exp(A_log)


def mamba2_step(x_t, state, Wz, Wx, WB, WC, Wdt, dt_bias, A_log, D, Wout):
    """One decoding token: x_t (B, D), state (B, H, N, Dh) -> (out_t (B, D), state)."""
    batch, H = x_t.shape[0], A_log.shape[0]
    z, u, Bm, Cm = (linear_forward(x_t, W)[0] for W in (Wz, Wx, WB, WC))
    dt = softplus_forward(linear_forward(x_t, Wdt, dt_bias)[0])[0]  # (B, H)
    y, state = ssd_step(u.reshape(batch, H, -1), dt, -np.exp(A_log), Bm[:, None], Cm[:, None],
                        D, state)  # (B, H, Dh)
    return linear_forward(y.reshape(batch, -1) * silu_forward(z)[0], Wout)[0], state


class Mamba2(Module):
    """Owns the block's Params (upstream's init: A = −(1..H) spread as A_log = log U[1, 16],
    dt ~ logU[1e-3, 0.1] through dt_bias = softplus^-1(dt), D = 1); calls mamba2_forward/backward."""

    def __init__(self, d_model, *, n_heads=4, d_state=16, expand=2, chunk=64, rng,
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
        self.Wout = Param(normal_init(rng, (Di, d_model), Di ** -0.5, dtype))
        self.chunk = chunk

    def _weights(self):
        return [getattr(self, name).data for name in WEIGHTS]

    def forward(self, x):
        return mamba2_forward(x, *self._weights(), chunk=self.chunk)

    def backward(self, dout, cache):
        return self.add_grads(mamba2_backward(dout, cache))

    def init_state(self, batch, max_len=None):
        """The zero SSD state (B, H, N, Dh); its size does not grow with max_len."""
        H, N = self.A_log.data.shape[0], self.WB.data.shape[1]
        return np.zeros((batch, H, N, self.Wx.data.shape[1] // H), self.Wx.data.dtype)

    def decode(self, x_t, state, position=None):
        """One token (B, D) -> (B, D); updates `state` in place."""
        out, new = mamba2_step(x_t, state, *self._weights())
        state[...] = new
        return out
