"""Linear time-invariant state-space models: ZOH discretisation, the SSM kernel and causal FFT
convolution, each as a forward/backward pair, and the recurrence they equal (the S4D layer
built from them is in s4d.py; Gu et al. 2022, arXiv 2206.11893).

A diagonal SSM per channel, continuous time:   h'(t) = A h(t) + B u(t),   y = <C, h> + D u
ZOH with step Δ (input held constant):          Ā = exp(ΔA),   B̄ = (exp(ΔA) − 1)/A · B
Recurrence (one step per token):                h_t = Ā h_{t-1} + B̄ u_t,  y_t = <C, h_t> + D u_t
Unrolled, it is a causal convolution:           y_t = Σ_{s≤t} K_s u_{t-s} + D u_t
with the kernel                                 K_l = Σ_n C_n Ā_n^l B̄_n,   l = 0 … T−1.
The convolution runs as an FFT product of length n ≥ 2T−1 (so the circular wrap-around never
lands in [0, T)); its backward is the same product against conjugate spectra: a correlation.

Glossary: B batch, T time (= kernel length L), D channels (d_model), N state size per channel,
n FFT length, Δ (delta/dt) step size, z = ΔA, φ(z) = expm1(z)/z so that B̄ = Δ φ(z) B.
A, B, C, D are also the SSM's arrays (as in the papers); where a size would clash with one,
the code spells the size out (batch, width).
"""
import math
from typing import NamedTuple

import numpy as np
import scipy.fft

from scratchllm.core.validate import (expect_dout, expect_douts, expect_float, expect_inexact,
                                      expect_ndim, expect_positive, expect_shape)

_SERIES_BELOW = 0.1  # |z| below this: Taylor series for φ and φ' (10 terms, truncation < 3e-17)
_PHI_COEFFS = [1 / math.factorial(k + 1) for k in range(10)]  # φ(z) = Σ z^k/(k+1)!
_DPHI_COEFFS = [(k + 1) / math.factorial(k + 2) for k in range(10)]  # φ'(z) = Σ (k+1) z^k/(k+2)!


def _horner(coeffs, z):
    out = np.zeros_like(z) + coeffs[-1]  # same shape and dtype as z
    for c in coeffs[-2::-1]:
        out = out * z + c
    return out


def _split(z):
    """Mask |z| < 0.1, the series argument (large z zeroed: no overflow), the direct one (≠ 0)."""
    small = np.abs(z) < _SERIES_BELOW  # (..., N)
    return small, np.where(small, z, 0), np.where(small, 1, z)


def _dt_phi_dA(z, dt, A):
    """∂(Δ φ(ΔA))/∂A = Δ² φ'(z) = (z exp(z) − expm1(z)) / A², by the series near z = 0 (where
    the difference cancels) and the right-hand side elsewhere: Δ² times φ'(z) underflows to
    0·huge for a huge Δ, while the right-hand side tends to 1/A², the gradient of the limit
    B̄ = −B/A. (z exp(z) is 0, not −inf·0, where exp(z) underflows.)"""
    small, zs, zd = _split(z)
    ez = np.exp(zd)  # (..., N)
    Ad = np.where(small, 1, A)  # (..., N)
    direct = (np.where(ez == 0, 0, zd) * ez - np.expm1(zd)) / Ad / Ad  # (..., N)
    dts = np.where(small, dt, 0)  # (..., N)
    return np.where(small, dts * dts * _horner(_DPHI_COEFFS, zs), direct)  # (..., N)


def _dt_phi(z, dt, A):
    """Δ·φ(ΔA) = expm1(ΔA)/A: the series near z = 0, expm1(z)/A elsewhere (never Δ·(1/z):
    a huge Δ sends z to -inf and gives -1/A, not 0·inf)."""
    small, zs, zd = _split(z)
    return np.where(small, dt * _horner(_PHI_COEFFS, zs), np.expm1(zd) / np.where(small, 1, A))


def _sum_to_shape(g, shape):
    """Sum a broadcast gradient back to `shape` (the adjoint of numpy broadcasting)."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


# ---------------------------------------------------------------------------- ZOH
class ZohOut(NamedTuple):
    """The outputs of zoh_forward (and the shape of its backward's dout)."""
    A_bar: np.ndarray  # (..., N)
    B_bar: np.ndarray  # (..., N)


class ZohCache(NamedTuple):
    A: np.ndarray
    B: np.ndarray
    delta: np.ndarray
    A_bar: np.ndarray


def zoh_forward(A, B, delta):
    """Zero-order-hold discretisation of a diagonal SSM.

    Inputs:  A (..., N) diagonal state matrix, B (..., N), delta (...) one step per channel.
    Returns: ZohOut(A_bar, B_bar), both (..., N): Ā = exp(ΔA), B̄ = expm1(ΔA)/A · B = Δ φ(ΔA) B
             (→ Δ·B as A → 0).
    Cache:   (A, B, delta, A_bar); φ is recomputed.
    """
    expect_inexact("zoh", "A", A)  # complex A: complex S4D (s4d_complex.py)
    expect_shape("zoh", "B", B, A.shape, "the shape of A")
    expect_shape("zoh", "delta", delta, A.shape[:-1], "A.shape[:-1], one step per channel")
    dt = delta[..., None]  # (..., 1)
    z = dt * A  # (..., N)
    A_bar = np.exp(z)  # (..., N)
    B_bar = _dt_phi(z, dt, A) * B  # (..., N) = Δ φ(z) B
    return ZohOut(A_bar, B_bar), ZohCache(A, B, delta, A_bar)


def zoh_backward(dout, cache):
    """Math: with z = ΔA, g = dB̄·B:  ∂Ā/∂A = Δ Ā, ∂B̄/∂A = Δ² φ'(z) B = (z e^z − expm1(z)) B/A²
    (→ B/A² as z → −∞: the gradient of the limit −B/A), so dA = dĀ·Δ·Ā + g·Δ²φ'(z);
    dB = dB̄·Δ·φ(z);  ∂Ā/∂Δ = A Ā, ∂B̄/∂Δ = (φ + zφ') B = Ā B, so dΔ = Σ_n (dĀ·A + g)·Ā.
    A None entry of dout counts as zero. Reference: Gu et al. 2022 (arXiv 2206.11893) §2;
    the ZOH derivation in notebooks/06_ssm_zoh_fft.ipynb."""
    A, B, delta, A_bar = cache
    expect_douts("zoh_backward", dout, {"A_bar": (A.shape, A_bar.dtype),
                                        "B_bar": (A.shape, np.result_type(A, B, delta))})
    dA_bar, dB_bar = (np.zeros_like(A) if d is None else d for d in dout)
    dt = delta[..., None]  # (..., 1)
    z = dt * A  # (..., N)
    # fwd: B_bar = dt * phi(z) * B  ->  dB, and g = dB_bar * B flows into A and dt
    g = dB_bar * B  # (..., N)
    dB = dB_bar * _dt_phi(z, dt, A)  # (..., N)
    # fwd: A_bar = exp(dt A), B_bar = expm1(dt A) / A * B  ->  their partials in A and dt
    dA = dA_bar * A_bar * dt + g * _dt_phi_dA(z, dt, A)  # (..., N)
    ddelta = ((dA_bar * A + g) * A_bar).sum(axis=-1)  # (...)
    return {"A": dA, "B": dB, "delta": ddelta}


# ---------------------------------------------------------------------------- kernel
def _cumpowers(a, k):
    """a^0, a^1, …, a^(k−1) along a new last axis, by a cumulative product."""
    ones = np.ones(a.shape + (1,), a.dtype)  # (..., 1)
    factors = np.concatenate([ones, np.repeat(a[..., None], k - 1, -1)], -1)  # (..., k)
    return np.cumprod(factors, -1)  # (..., k)


def _power_blocks(A_bar, L):
    """A^l for l = m·c + j as (A^c)^m · A^j, c = ceil(sqrt L): returns P (..., N, c) = A^j and
    Q (..., N, M) = A^(m·c), by cumulative products (2 sqrt(L) per state; no exp, no log)."""
    c = int(np.ceil(np.sqrt(L)))
    P = _cumpowers(A_bar, c)  # (..., N, c)
    Q = _cumpowers(P[..., -1] * A_bar, -(-L // c))  # (..., N, M)
    return P, Q


def vandermonde(A_bar, w, L):
    """K_l = Σ_n w_n A_n^l for l < L, without the (..., N, L) power matrix.

    Inputs: A_bar, w (..., N); L int.  Returns: K (..., L).
    With l = m·c + j: K[m, j] = Σ_n (w_n A_n^(mc)) A_n^j, one (M, N) @ (N, c) matmul."""
    P, Q = _power_blocks(A_bar, L)  # (..., N, c), (..., N, M)
    K = np.swapaxes(w[..., None] * Q, -1, -2) @ P  # (..., M, c)
    return K.reshape(K.shape[:-2] + (-1,))[..., :L]  # (..., L)


def vandermonde_transpose(A_bar, g):
    """The adjoint of `vandermonde` in w: W_n = Σ_l g_l A_n^l.

    Inputs: A_bar (..., N); g (..., L) or (..., S, L) for S stacked signals.
    Returns: W (..., N) or (..., S, N).  Same blocks: W_n = Σ_m A_n^(mc) Σ_j g[m, j] A_n^j."""
    L = g.shape[-1]
    P, Q = _power_blocks(A_bar, L)  # (..., N, c), (..., N, M)
    M, c = Q.shape[-1], P.shape[-1]
    pad = np.zeros(g.shape[:-1] + (M * c - L,), g.dtype)  # (..., [S,] M·c − L)
    G = np.concatenate([g, pad], -1).reshape(g.shape[:-1] + (M, c))  # (..., [S,] M, c)
    if g.ndim > A_bar.ndim:  # stacked signals share the powers
        P, Q = P[..., None, :, :], Q[..., None, :, :]
    R = G @ np.swapaxes(P, -1, -2)  # (..., [S,] M, N)
    return np.einsum("...nm,...mn->...n", Q, R)  # (..., [S,] N)


class KernelCache(NamedTuple):
    A_bar: np.ndarray
    B_bar: np.ndarray
    C: np.ndarray
    L: int


def ssm_kernel_forward_ref(A_bar, B_bar, C, L):
    """Twin of ssm_kernel_forward: the dense power matrix V[n, l] = A_n^l, then K = (C·B̄) V.
    Same signature and return (K (..., L), KernelCache)."""
    V = A_bar[..., None] ** np.arange(L)  # (..., N, L)
    K = np.einsum("...n,...nl->...l", C * B_bar, V)  # (..., L)
    return K, KernelCache(A_bar, B_bar, C, L)


def ssm_kernel_forward(A_bar, B_bar, C, L):
    """The SSM convolution kernel K_l = Σ_n C_n Ā_n^l B̄_n, l = 0 … L−1.

    Inputs:  A_bar, B_bar, C (..., N); L int > 0.
    Returns: K (..., L), via `vandermonde` (blocked powers: memory O(N sqrt L), not O(N L)).
    Cache:   (A_bar, B_bar, C); the power blocks are recomputed.
    """
    expect_inexact("ssm_kernel", "A_bar", A_bar)  # complex too (s4d_complex.py)
    expect_shape("ssm_kernel", "B_bar", B_bar, A_bar.shape, "the shape of A_bar")
    expect_shape("ssm_kernel", "C", C, A_bar.shape, "the shape of A_bar")
    expect_positive("ssm_kernel", "L", L)
    return vandermonde(A_bar, C * B_bar, L), KernelCache(A_bar, B_bar, C, L)


def ssm_kernel_backward(dK, cache):
    """Math: with w = C·B̄ and K_l = Σ_n w_n Ā_n^l:
    dw_n = Σ_l dK_l Ā_n^l;  dC = dw·B̄;  dB̄ = dw·C;
    dĀ_n = w_n Σ_l l dK_l Ā_n^(l−1) = w_n Σ_l dK'_l Ā_n^l  with dK'_l = (l+1) dK_(l+1):
    both sums are one `vandermonde_transpose` of the stacked (dK, dK')."""
    A_bar, B_bar, C, L = cache
    expect_dout("ssm_kernel_backward", dK, A_bar.shape[:-1] + (L,),
                np.result_type(A_bar, B_bar, C), name="dK")
    l1 = np.arange(1, L, dtype=dK.dtype)  # (L-1,)
    shifted = np.concatenate([l1 * dK[..., 1:], np.zeros_like(dK[..., :1])], -1)  # (..., L)
    W = vandermonde_transpose(A_bar, np.stack([dK, shifted], -2))  # (..., 2, N)
    # fwd: K = V(A_bar) w, w = C * B_bar  ->  dw = V^T dK, dA_bar = w * (dV/dA)^T dK
    dw, dA_pow = W[..., 0, :], W[..., 1, :]  # (..., N) each
    return {"A_bar": C * B_bar * dA_pow, "B_bar": dw * C, "C": dw * B_bar}


# ---------------------------------------------------------------------------- FFT convolution
def fft_len(T):
    """FFT length for an exact causal convolution of length T: next_fast_len(2T − 1)."""
    return scipy.fft.next_fast_len(2 * T - 1, real=True)


class DirectConvCache(NamedTuple):
    x: np.ndarray
    K: np.ndarray


def _check_conv(fn, x, K):
    """x (..., T) and K (..., T) float, broadcastable against each other; returns T."""
    expect_float(fn, "x", x, 1)
    expect_float(fn, "K", K, 1)
    T = x.shape[-1]
    if K.shape[-1] != T:
        raise ValueError(f"{fn}: K has length {K.shape[-1]} on its last axis, expected {T} "
                         "(the length of x)")
    try:
        np.broadcast_shapes(x.shape, K.shape)
    except ValueError:
        raise ValueError(f"{fn}: K has shape {K.shape}, which does not broadcast against "
                         f"x {x.shape}") from None
    return T


def fft_conv_forward_ref(x, K):
    """Twin of fft_conv_forward: the direct sum y_t = Σ_{s≤t} K_s x_(t−s), O(T²).
    Returns (y (..., T), DirectConvCache) for fft_conv_backward_ref."""
    T = _check_conv("fft_conv_ref", x, K)
    y = np.zeros(np.broadcast_shapes(x.shape, K.shape), np.result_type(x, K))  # (..., T)
    for s in range(T):
        y[..., s:] += K[..., s:s + 1] * x[..., :T - s]
    return y, DirectConvCache(x, K)


def fft_conv_backward_ref(dy, cache):
    """Twin of fft_conv_backward: the direct correlations dx_s = Σ_{t≥s} dy_t K_(t−s) and
    dK_s = Σ_{t≥s} dy_t x_(t−s), each summed over the axes its input was broadcast along."""
    x, K = cache
    T = x.shape[-1]
    expect_dout("fft_conv_backward_ref", dy, np.broadcast_shapes(x.shape, K.shape),
                np.result_type(x, K), name="dy")
    dx = np.zeros(dy.shape, dy.dtype)  # (..., T)
    dK = np.zeros(dy.shape, dy.dtype)  # (..., T)
    for s in range(T):  # fwd: y[..., s:] += K[..., s] * x[..., :T-s]
        dx[..., :T - s] += K[..., s:s + 1] * dy[..., s:]
        dK[..., s] = np.sum(dy[..., s:] * x[..., :T - s], axis=-1)
    return {"x": _sum_to_shape(dx, x.shape), "K": _sum_to_shape(dK, K.shape)}


class ConvCache(NamedTuple):
    Xf: np.ndarray
    Kf: np.ndarray
    n: int
    K_shape: tuple
    T: int


def fft_conv_forward(x, K):
    """Causal convolution per channel along the last axis, via rfft/irfft of length n ≥ 2T−1.

    Inputs:  x (..., T); K (..., T), broadcastable against x (e.g. x (B, D, T), K (D, T)).
    Returns: y (..., T), y_t = Σ_{s≤t} K_s x_(t−s) = irfft(rfft(x, n) · rfft(K, n), n)[:T].
    Cache:   (Xf, Kf, n, K.shape): the spectra, reused by the backward.
    """
    T = _check_conv("fft_conv", x, K)
    n = fft_len(T)
    Xf, Kf = scipy.fft.rfft(x, n), scipy.fft.rfft(K, n)  # (..., n//2+1) each
    y = scipy.fft.irfft(Xf * Kf, n)[..., :T]  # (..., T)
    return y, ConvCache(Xf, Kf, n, K.shape, T)


def fft_conv_backward(dy, cache):
    """Math: the correlations dx_s = Σ_{t≥s} dy_t K_(t−s) and
    dK_s = Σ_{t≥s} dy_t x_(t−s), i.e. dx = flip(conv(flip(dy), K)), computed as
    irfft(conj(rfft(K)) · rfft(dy))[:T] (resp. conj(rfft(x))); n ≥ 2T−1 keeps it exact.
    Each gradient is summed (as a spectrum, before the irfft) over the axes it was broadcast
    along. Reference: the derivation in notebooks/06_ssm_zoh_fft.ipynb.
    """
    Xf, Kf, n, K_shape, T = cache
    expect_dout("fft_conv_backward", dy, np.broadcast_shapes(Xf.shape[:-1], K_shape[:-1]) + (T,),
                np.finfo(np.result_type(Xf, Kf)).dtype, name="dy")
    Yf = scipy.fft.rfft(dy, n)  # (..., n//2+1)
    # fwd: y = irfft(Xf * Kf)[:T]  ->  dx = irfft(conj(Kf) * Yf)[:T], dK likewise with conj(Xf)
    dxf = _sum_to_shape(np.conj(Kf) * Yf, Xf.shape)  # (x's axes, n//2+1)
    dx = scipy.fft.irfft(dxf, n)[..., :T]  # (..., T)
    dKf = _sum_to_shape(np.conj(Xf) * Yf, K_shape[:-1] + Yf.shape[-1:])  # (K's axes, n//2+1)
    dK = scipy.fft.irfft(dKf, n)[..., :T]  # K_shape (summing spectra first: fewer irffts)
    return {"x": dx, "K": dK}


# ---------------------------------------------------------------------------- recurrence
def ssm_step(x_t, h, A_bar, B_bar, C, D):
    """One step of the discrete recurrence: h_t = Ā h_(t−1) + B̄ x_t, y_t = <C, h_t> + D x_t.

    Inputs:  x_t (B, D), h (B, D, N); A_bar, B_bar, C (D, N); D (D,).
    Returns: (y_t (B, D), h_t (B, D, N)). A state of another shape (no batch axis, batch 1
    for a batch of 2) is an error, never broadcast.
    """
    expect_float("ssm_step", "x_t", x_t)
    expect_ndim("ssm_step", "x_t", x_t, 2, "(B, D)")
    batch, width = x_t.shape
    for name, a in (("A_bar", A_bar), ("B_bar", B_bar), ("C", C)):
        expect_shape("ssm_step", name, a, (width, None), "(D, N), D = x_t.shape[1]")
    N = A_bar.shape[1]
    expect_shape("ssm_step", "B_bar", B_bar, (width, N), "(D, N) like A_bar")
    expect_shape("ssm_step", "C", C, (width, N), "(D, N) like A_bar")
    expect_shape("ssm_step", "D", D, (width,), "(D,)")
    expect_shape("ssm_step", "h", h, (batch, width, N), "(B, D, N): the state of every row")
    h = A_bar * h + B_bar * x_t[..., None]  # (B, D, N)
    return (h * C).sum(-1) + D * x_t, h  # (B, D), (B, D, N)


def ssm_recurrence(x, A_bar, B_bar, C, D):
    """The SSM as a loop over time (the recurrent view, for tests and teaching): it equals
    kernel + convolution.

    Inputs: x (B, T, D); A_bar, B_bar, C (D, N); D (D,).  Returns: y (B, T, D).
    """
    batch, T, width = x.shape
    h = np.zeros((batch, width, A_bar.shape[-1]), np.result_type(x, A_bar))  # (B, D, N)
    y = np.empty(x.shape, h.dtype)  # (B, T, D)
    for t in range(T):
        y[:, t], h = ssm_step(x[:, t], h, A_bar, B_bar, C, D)
    return y
