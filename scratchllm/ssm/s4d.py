"""The S4D layer (Gu et al. 2022, "On the Parameterization and Initialization of Diagonal
State Space Models", arXiv 2206.11893) as a forward/backward pair composed of the LTI pairs
(lti.py), its one-token decoding step, and the S4D Module.

    A = -exp(A_log), Δ = exp(log_dt)                      (both kept in their domain)
    (Ā, B̄) = zoh(A, B, Δ);  K = kernel(Ā, B̄, C, T);  y = causal_conv(x, K) + D x

Glossary: B batch, T time, D channels (d_model), N state size per channel; A, B, C, D are
also the SSM's arrays, so the code spells clashing sizes out (batch, width).
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.validate import expect_dout, expect_float, expect_ndim, expect_shape
from scratchllm.ssm.lti import (ConvCache, KernelCache, ZohCache, fft_conv_backward,
                                fft_conv_forward, ssm_kernel_backward, ssm_kernel_forward,
                                ssm_step, zoh_backward, zoh_forward)


class S4DCache(NamedTuple):
    x: np.ndarray
    A: np.ndarray
    dt: np.ndarray
    D: np.ndarray
    zoh: ZohCache
    kernel: KernelCache
    conv: ConvCache


def _check_s4d(fn, x_ndim, x, A_log, B, C, log_dt, D):
    expect_ndim(fn, "x", x, x_ndim, "(B, T, D)" if x_ndim == 3 else "(B, D)")
    expect_float(fn, "x", x)
    width = x.shape[-1]
    expect_shape(fn, "A_log", A_log, (width, None), "(D, N) with D = x.shape[-1]")
    for name, arr in (("B", B), ("C", C)):
        expect_shape(fn, name, arr, A_log.shape, "(D, N), the shape of A_log")
    expect_shape(fn, "log_dt", log_dt, (width,), "(D,)")
    expect_shape(fn, "D", D, (width,), "(D,)")


def s4d_forward(x, A_log, B, C, log_dt, D):
    """S4D (real diagonal) layer: ZOH → kernel → causal FFT convolution → + D·x.

    Inputs:  x (B, T, D); A_log, B, C (D, N) with A = −exp(A_log); log_dt (D,) with
             Δ = exp(log_dt); D (D,) the skip.
    Returns: y (B, T, D), y_t = Σ_{s≤t} K_s x_(t−s) + D x_t, K_l = Σ_n C_n Ā_n^l B̄_n.
    Cache:   (x, A, Δ, D, zoh cache, kernel cache, conv cache).
    """
    _check_s4d("s4d", 3, x, A_log, B, C, log_dt, D)
    T = x.shape[1]
    A, dt = -np.exp(A_log), np.exp(log_dt)  # (D, N), (D,)
    (A_bar, B_bar), zoh_cache = zoh_forward(A, B, dt)  # (D, N) each
    K, kernel_cache = ssm_kernel_forward(A_bar, B_bar, C, T)  # (D, T)
    yc, conv_cache = fft_conv_forward(np.swapaxes(x, 1, 2), K)  # (B, D, T)
    y = np.swapaxes(yc, 1, 2) + D * x  # (B, T, D)
    return y, S4DCache(x, A, dt, D, zoh_cache, kernel_cache, conv_cache)


def s4d_backward(dy, cache):
    """Math: the pairs in reverse: conv → kernel → ZOH, then dA_log = dA·A (A = −exp(A_log)),
    dlog_dt = dΔ·Δ, dD = Σ_{b,t} dy·x, dx = conv's dx + D·dy."""
    x, A, dt, D, zoh_cache, kernel_cache, conv_cache = cache
    expect_dout("s4d_backward", dy, x.shape, np.result_type(x, A, D), name="dy")
    # fwd: y = swap(yc) + D * x  ->  dD, the skip part of dx
    dD = (dy * x).sum(axis=(0, 1))  # (D,)
    g_conv = fft_conv_backward(np.swapaxes(dy, 1, 2), conv_cache)  # x (B, D, T), K (D, T)
    dx = np.swapaxes(g_conv["x"], 1, 2) + D * dy  # (B, T, D)
    g_kernel = ssm_kernel_backward(g_conv["K"], kernel_cache)  # A_bar, B_bar, C (D, N)
    g_zoh = zoh_backward((g_kernel["A_bar"], g_kernel["B_bar"]), zoh_cache)  # A, B, delta
    # fwd: A = -exp(A_log), dt = exp(log_dt)  ->  dA_log = dA * A, dlog_dt = ddt * dt
    return {"x": dx, "A_log": g_zoh["A"] * A, "B": g_zoh["B"], "C": g_kernel["C"],
            "log_dt": g_zoh["delta"] * dt, "D": dD}


def s4d_step(x_t, state, A_log, B, C, log_dt, D):
    """One decoding step of the S4D layer in O(D·N) memory (the recurrent view).

    Inputs:  x_t (B, D); state (B, D, N) or None (zeros); parameters as in s4d_forward.
    Returns: (y_t (B, D), new state (B, D, N)). T steps equal s4d_forward's T outputs.
    """
    _check_s4d("s4d_step", 2, x_t, A_log, B, C, log_dt, D)
    (A_bar, B_bar), _ = zoh_forward(-np.exp(A_log), B, np.exp(log_dt))  # (D, N) each
    if state is None:
        state = np.zeros(x_t.shape + A_log.shape[-1:], x_t.dtype)  # (B, D, N)
    expect_shape("s4d_step", "state", state, x_t.shape + A_log.shape[-1:],
                 "(B, D, N): the state of every row")
    return ssm_step(x_t, state, A_bar, B_bar, C, D)


class S4D(Module):
    """S4D-real layer over (B, T, D): A = −(1, 2, …, N) per channel (A_log = log n), B = 1,
    C ~ N(0, 1/N), Δ log-uniform in [dt_min, dt_max], D = 1. Calls s4d_forward/backward/step."""

    def __init__(self, d_model, d_state=64, *, rng, dt_min=1e-3, dt_max=1e-1, dtype=np.float32):
        n = np.arange(1, d_state + 1, dtype=np.float64)  # (N,)
        self.A_log = Param(np.tile(np.log(n), (d_model, 1)).astype(dtype))  # (D, N)
        self.B = Param(np.ones((d_model, d_state), dtype))  # (D, N)
        self.C = Param(normal_init(rng, (d_model, d_state), d_state ** -0.5, dtype))
        log_dt = rng.uniform(np.log(dt_min), np.log(dt_max), d_model)  # (D,)
        self.log_dt = Param(log_dt.astype(dtype))  # (D,)
        self.D = Param(np.ones(d_model, dtype))  # (D,)

    def _params(self):
        return self.A_log.data, self.B.data, self.C.data, self.log_dt.data, self.D.data

    def forward(self, x):
        return s4d_forward(x, *self._params())

    def backward(self, dy, cache):
        return self.add_grads(s4d_backward(dy, cache))

    def step(self, x_t, state=None):
        return s4d_step(x_t, state, *self._params())
