"""Complex S4D (Gu et al. 2022, "On the Parameterization and Initialization of Diagonal State
Space Models", arXiv 2206.11893; upstream `state-spaces/s4 models/s4/s4d.py` S4DKernel):
a diagonal SSM with complex A, whose N modes stand for 2N real states in conjugate pairs, so
the kernel and the output are real.

    A = −exp(A_log_re) + i A_im,  B = B_re + i B_im,  C = C_re + i C_im,  Δ = exp(log_dt)
    (Ā, B̄) = zoh(A, B, Δ)  in complex arithmetic (lti.py's zoh_forward)
    K_l = 2 Re Σ_n C_n Ā_n^l B̄_n  (lti.py's Vandermonde kernel, then 2·Re)
    y = causal_conv(x, K) + D x     (lti.py's FFT convolution)
Initialisations (B = 1, C ~ CN(0, 1), log Δ ~ U[log 1e-3, log 1e-1]):
    S4D-Lin  A_n = −1/2 + iπn
    S4D-Inv  A_n = −1/2 + i (2N/π) (2N/(2n+1) − 1)     (2N the real state size)
    S4D-LegS A_n = the eigenvalues of HiPPO-LegS's normal part (size 2N) with Im > 0, and
             B = V* B (s4.py's dplr_legs): Re A = −1/2 exactly
Gradients of a real loss w.r.t. a complex z = a + ib are carried as dz = ∂L/∂a + i ∂L/∂b.
For a holomorphic step w = f(z) that is dz = conj(f'(z)) dw, so each real backward of the
lti pairs (linear in dout, holomorphic in its inputs) serves as conj(backward(conj(dw))).
Real parameters take the real part: dΔ = Re(...). The checker sees only real pairs. The eight
real arrays of a layer travel as one S4DComplexWeights.

Glossary: B batch, T time, D channels, N complex modes per channel (2N real states).
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_instance,
                                      expect_ndim, expect_shape)
from scratchllm.ssm.s4 import dplr_legs
from scratchllm.ssm.lti import (ConvCache, KernelCache, ZohCache, fft_conv_backward,
                                fft_conv_forward, ssm_kernel_backward, ssm_kernel_forward,
                                ssm_step, zoh_backward, zoh_forward)


class S4DComplexWeights(NamedTuple):
    """The real arrays of one complex S4D layer (the S4DComplex Module's Param names)."""
    A_log_re: np.ndarray  # (D, N)  Re A = -exp(A_log_re)
    A_im: np.ndarray  # (D, N)  Im A
    B_re: np.ndarray  # (D, N)
    B_im: np.ndarray  # (D, N)
    C_re: np.ndarray  # (D, N)
    C_im: np.ndarray  # (D, N)
    log_dt: np.ndarray  # (D,)  Δ = exp(log_dt)
    D: np.ndarray  # (D,) skip


class S4DComplexCache(NamedTuple):
    x: np.ndarray
    A_re: np.ndarray
    dt: np.ndarray
    D: np.ndarray
    zoh: ZohCache
    kernel: KernelCache
    conv: ConvCache


def _check(fn, x_ndim, x, w):
    expect_ndim(fn, "x", x, x_ndim, "(B, T, D)" if x_ndim == 3 else "(B, D)")
    expect_instance(fn, "w", w, S4DComplexWeights)
    width = x.shape[-1]
    expect_shape(fn, "A_log_re", w.A_log_re, (width, None), "(D, N) with D = x.shape[-1]")
    for name, a in zip(w._fields, w):
        expect_float(fn, name, a)
        if name != "A_log_re":
            want = (width,) if name in ("log_dt", "D") else w.A_log_re.shape
            expect_shape(fn, name, a, want, "(D,)" if len(want) == 1 else "(D, N) like A_log_re")
    expect_float(fn, "x", x)


def _discretise(w):
    A = -np.exp(w.A_log_re) + 1j * w.A_im  # (D, N) complex
    return zoh_forward(A, w.B_re + 1j * w.B_im, np.exp(w.log_dt))  # ZohOut (D, N) each, cache


def s4d_complex_forward(x, w):
    """Complex diagonal S4D on real inputs: ZOH → Vandermonde kernel → 2 Re → FFT conv → + D x.

    Inputs:  x (B, T, D); w S4DComplexWeights: A_log_re, A_im, B_re, B_im, C_re, C_im (D, N);
             log_dt, D (D,).
    Returns: y (B, T, D), real.  Cache: x, Re A, Δ, D and the ZOH, kernel and conv caches.
    """
    x, w = common_float(x, w)
    _check("s4d_complex", 3, x, w)
    (A_bar, B_bar), zc = _discretise(w)  # (D, N) complex
    Kc, kc = ssm_kernel_forward(A_bar, B_bar, w.C_re + 1j * w.C_im, x.shape[1])  # (D, T)
    K = (2 * Kc.real).astype(x.dtype)  # (D, T) real: the conjugate pairs' sum
    yc, cc = fft_conv_forward(np.swapaxes(x, 1, 2), K)  # (B, D, T)
    y = np.swapaxes(yc, 1, 2) + w.D * x  # (B, T, D)
    return y, S4DComplexCache(x, -np.exp(w.A_log_re), np.exp(w.log_dt), w.D, zc, kc, cc)


def _conj_backward(backward, dout, cache):
    """A holomorphic pair's complex gradient: conj(backward(conj(dout)))."""
    dout = tuple(np.conj(d) for d in dout) if isinstance(dout, tuple) else np.conj(dout)
    return {name: np.conj(g) for name, g in backward(dout, cache).items()}


def s4d_complex_backward(dy, cache):
    """Math: dD = Σ dy x; conv's backward gives dx and dK (real); K = 2 Re Kc -> dKc = 2 dK;
    then the kernel and ZOH backwards in complex arithmetic (conj(backward(conj(·))));
    A = −exp(A_log_re) + i A_im: dA_log_re = Re(dA)·Re(A), dA_im = Im(dA); dB_re, dB_im =
    Re, Im of dB (C likewise); dlog_dt = Re(dΔ)·Δ.
    Returns: {"x": dx (B, T, D), "w": S4DComplexWeights of the gradients}.
    Reference: Gu et al. 2022, arXiv 2206.11893 (the backward derived here).
    """
    expect_dout("s4d_complex_backward", dy, cache.x.shape, np.result_type(cache.x, cache.D),
                name="dy")
    x, A_re, dt, D, zc, kc, cc = cache
    g_conv = fft_conv_backward(np.swapaxes(dy, 1, 2), cc)  # x (B, D, T), K (D, T)
    dx = np.swapaxes(g_conv["x"], 1, 2) + D * dy  # (B, T, D)
    # fwd: K = 2 Re(Kc)  ->  dKc = 2 dK (no imaginary part)
    g_k = _conj_backward(ssm_kernel_backward, 2 * g_conv["K"].astype(kc.A_bar.dtype), kc)
    g_z = _conj_backward(zoh_backward, (g_k["A_bar"], g_k["B_bar"]), zc)
    real = x.dtype
    dw = S4DComplexWeights((g_z["A"].real * A_re).astype(real), g_z["A"].imag.astype(real),
                           g_z["B"].real.astype(real), g_z["B"].imag.astype(real),
                           g_k["C"].real.astype(real), g_k["C"].imag.astype(real),
                           (g_z["delta"].real * dt).astype(real), (dy * x).sum(axis=(0, 1)))
    return {"x": dx, "w": dw}


def s4d_complex_step(x_t, state, w):
    """One decoding step through the complex state h (B, D, N) (None = zeros):
    h = Ā h + B̄ x_t, y_t = 2 Re ⟨C, h⟩ + D x_t. w as in s4d_complex_forward.
    Returns (y_t (B, D), new h)."""
    _check("s4d_complex_step", 2, x_t, w)
    if state is not None:
        expect_shape("s4d_complex_step", "state", state, x_t.shape + w.A_log_re.shape[-1:],
                     "(B, D, N) of this step's rows")
    (A_bar, B_bar), _ = _discretise(w)  # (D, N)
    if state is None:
        state = np.zeros(x_t.shape + w.A_log_re.shape[-1:], complex)  # (B, D, N)
    y, state = ssm_step(x_t, state, A_bar, B_bar, 2 * (w.C_re + 1j * w.C_im),
                        np.zeros_like(w.D))
    return (y.real + w.D * x_t).astype(x_t.dtype), state  # (B, D)


def s4d_init(d_model, n_modes, init, *, rng, dtype=np.float64):
    """S4DComplexWeights of S4D-Lin ("lin"), S4D-Inv ("inv") or S4D-LegS ("legs"): the
    module doc."""
    n = np.arange(n_modes, dtype=np.float64)  # (N,)
    B = np.ones(n_modes, complex)  # (N,)
    if init == "lin":
        imag = np.pi * n  # (N,)
    elif init == "inv":
        imag = (2 * n_modes / np.pi) * (2 * n_modes / (2 * n + 1) - 1)  # (N,)
    elif init == "legs":  # half of each conjugate pair of the 2N normal-part eigenvalues
        d = dplr_legs(2 * n_modes)
        keep = np.argsort(d.Lambda.imag)[n_modes:]  # (N,) Im > 0, ascending
        imag, B = d.Lambda.imag[keep], d.B[keep]  # (N,)
    else:
        raise ValueError(f"s4d_init: init must be 'lin', 'inv' or 'legs', got {init!r}")
    shape = (d_model, n_modes)
    p = dict(A_log_re=np.full(shape, np.log(0.5)), A_im=np.tile(imag, (d_model, 1)),
             B_re=np.tile(B.real, (d_model, 1)), B_im=np.tile(B.imag, (d_model, 1)),
             C_re=rng.standard_normal(shape) * 0.5 ** 0.5,
             C_im=rng.standard_normal(shape) * 0.5 ** 0.5,
             log_dt=rng.uniform(np.log(1e-3), np.log(1e-1), d_model), D=np.ones(d_model))
    return S4DComplexWeights(**{k: v.astype(dtype) for k, v in p.items()})


class S4DComplex(Module):
    """Complex S4D over (B, T, D) with S4D-Lin, S4D-Inv or S4D-LegS initialisation; real
    Params only."""

    def __init__(self, d_model, n_modes=32, *, init="lin", rng, dtype=np.float32):
        w = s4d_init(d_model, n_modes, init, rng=rng, dtype=dtype)
        for name, value in zip(w._fields, w):
            setattr(self, name, Param(value))

    def weights(self):
        """The Params' arrays as one S4DComplexWeights."""
        return S4DComplexWeights(*(getattr(self, n).data for n in S4DComplexWeights._fields))

    def forward(self, x):
        return s4d_complex_forward(x, self.weights())

    def backward(self, dy, cache):
        g = s4d_complex_backward(dy, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))

    def init_state(self, batch, max_len=None):
        """The complex state (B, D, N); its size does not grow with max_len."""
        return np.zeros((batch,) + self.A_log_re.data.shape, complex)

    def decode(self, x_t, state, position=None):
        """One token (B, D) -> (B, D); updates `state` in place."""
        y, new = s4d_complex_step(x_t, state, self.weights())
        state[...] = new
        return y
