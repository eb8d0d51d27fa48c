"""S4's dense-A problem and its fix (Gu, Goel & Ré 2022, "Efficiently Modeling Long Sequences
with Structured State Spaces", arXiv 2111.00396; upstream state-spaces/s4
models/s4/s4.py and its dplr/transition code): the HiPPO-LegS matrix, its normal plus
low-rank (DPLR) form, and the SSM convolution kernel from a Cauchy kernel, with its backward.

HiPPO-LegS (N x N, real):  A_nk = −sqrt(2n+1) sqrt(2k+1) (n > k),  −(n+1) (n = k),  0 (n < k);
B_n = sqrt(2n+1). The problem: A is not normal, and diagonalising it needs eigenvectors whose
condition number grows exponentially in N, so the diagonal recipe (S4D with A itself) is
numerically useless; the dense recurrence costs O(N^2 L) and the kernel O(N^2 L) too.
The fix: with P_n = sqrt(n + 1/2), A + P P^T = −I/2 + (skew-symmetric) is normal, so
    A = V Λ V* − P P^T,   V unitary, Λ = −1/2 + i μ            (DPLR: dplr_legs)
and in the basis of V:  Ã = Λ − p p*  with p = V* P, B̃ = V* B, C̃ = C V.
Kernel (bilinear discretisation, as S4): Ā = (I − Δ/2 A)^-1 (I + Δ/2 A), B̄ = (I − Δ/2 A)^-1 Δ B,
K_l = C Ā^l B̄ (l < L). Its generating function at the L roots of unity ω_k = exp(−2πik/L),
with Ĉ = C (I − Ā^L) (S4 learns Ĉ directly), is
    K̂(ω) = Ĉ (I − Ā ω)^-1 B̄ = Ĉ M(ω)^-1 B,  M(ω) = a I − b Ã,  a = (1 − ω)/Δ,  b = (1 + ω)/2
and with Ã = Λ − p p*, Woodbury reduces the N x N solve to four Cauchy sums
    k_uv(ω) = Σ_n u_n v_n / (a − b λ_n)        (S4's Σ v_n / (g(ω) − λ_n), g = a/b, times b:
                                               the form here has no pole at ω = −1)
    K̂ = k_ĈB − b k_Ĉp k_p̄B / (1 + b k_p̄p),   K = Re ifft(K̂):  O(N L) work, no N x N matrix.
Backward (dz carried as ∂L/∂Re z + i ∂L/∂Im z; a holomorphic w = f(z) gives dz = conj(f') dw):
    dK̂ = fft(dK) / L  (the adjoint of Re ifft);  r = 1/(1 + b k_p̄p);
    dk_ĈB = dK̂,  dk_Ĉp = conj(−b r k_p̄B) dK̂,  dk_p̄B = conj(−b r k_Ĉp) dK̂,
    dk_p̄p = conj(b² r² k_Ĉp k_p̄B) dK̂;
    each k_uv = Σ u v / d:  du = Σ_ω conj(v/d) dk,  dv = Σ_ω conj(u/d) dk,  dd = Σ conj(−u v/d²) dk;
    d = a − b λ:  dλ = conj(−b) dd,  da = dd;  a = (1 − ω)/Δ: dΔ = Re Σ_ω conj(−(1 − ω)/Δ²) da;
    p̄ is conj(p): dp += conj(dp̄);  Δ = exp(log_dt): dlog_dt = Δ dΔ.
Zero-order hold (discretization="zoh"): Ā = exp(ΔÃ), B̄ = Ã^-1 (Ā − I) B. The exponential of
a DPLR matrix is not DPLR, so no Woodbury step exists and S4 keeps the bilinear form for it;
for a diagonal Ã = Λ (p None: S4D, whose LegS initialisation is this Λ) the kernel is one
Cauchy sum in ω, with Ā_n = exp(Δλ_n), B̄_n = (Ā_n − 1)/λ_n B_n:
    K̂(ω) = Σ_n Ĉ_n B̄_n / (1 − ω Ā_n),   K = Re ifft(K̂)   (the same Ĉ = C (I − Ā^L)).
Its backward: dĈ = conj(B̄) Σ_ω conj(1/d) dK̂, dB̄ = conj(Ĉ) Σ_ω conj(1/d) dK̂ (d = 1 − ωĀ),
    dĀ = Σ_ω conj(−ω) conj(−Ĉ B̄/d²) dK̂ + conj(1/λ) ds,  ds = conj(B) dB̄,  dB = conj(s) dB̄
    (s = (Ā − 1)/λ),  dλ = conj(−(Ā − 1)/λ²) ds + conj(Δ Ā) dĀ,  dΔ = Re Σ_n conj(λ Ā) dĀ.
Tested against scipy.linalg.expm of the dense A = V Λ V* (tests/ssm/test_s4.py, 1e-10).

Glossary: H channels (independent kernels), N state size, L kernel length, Δ step.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_instance,
                                      expect_integer, expect_shape)


def hippo_legs(N):
    """The HiPPO-LegS matrix A (N, N) and vector B (N,), real (S4 §2.2, eq. (2)).

    A_nk = −sqrt(2n+1) sqrt(2k+1) for n > k, −(n+1) for n = k, 0 for n < k; B_n = sqrt(2n+1).
    """
    expect_integer("hippo_legs", "N", N, 1)
    r = np.sqrt(2 * np.arange(N) + 1.0)  # (N,)
    A = -np.tril(np.outer(r, r), -1) - np.diag(np.arange(N) + 1.0)  # (N, N)
    return A, r.copy()


class DPLR(NamedTuple):
    """HiPPO-LegS as diagonal plus low rank: A = V diag(Λ) V* − P P^T."""
    Lambda: np.ndarray  # (N,) complex, Re = −1/2
    p: np.ndarray  # (N,) complex, V* P
    B: np.ndarray  # (N,) complex, V* B
    V: np.ndarray  # (N, N) complex unitary
    P: np.ndarray  # (N,) real, sqrt(n + 1/2)


def dplr_legs(N):
    """HiPPO-LegS in DPLR form (S4 Theorem 1): P_n = sqrt(n + 1/2) makes S = A + P P^T =
    −I/2 + K with K skew-symmetric; iK is Hermitian, so eigh(iK) = V diag(μ) V* gives a
    unitary V stably, and Λ = −1/2 − iμ. Returns DPLR(Λ, V* P, V* B, V, P)."""
    A, B = hippo_legs(N)  # (N, N), (N,)
    P = np.sqrt(np.arange(N) + 0.5)  # (N,)
    K = A + np.outer(P, P) + 0.5 * np.eye(N)  # (N, N) skew-symmetric
    mu, V = np.linalg.eigh(1j * K)  # iK = V diag(mu) V*
    Lambda = -0.5 - 1j * mu  # (N,) K = V diag(-i mu) V*
    return DPLR(Lambda, V.conj().T @ P, V.conj().T @ B, V, P)


class CauchyWeights(NamedTuple):
    """The real arrays of H DPLR kernels in the basis of V (real and imaginary parts)."""
    lam_re: np.ndarray  # (H, N) Re Λ
    lam_im: np.ndarray  # (H, N) Im Λ
    p_re: np.ndarray  # (H, N) the low-rank vector p = V* P (None: a diagonal Ã = Λ)
    p_im: np.ndarray  # (H, N) (None with p_re)
    B_re: np.ndarray  # (H, N) B̃ = V* B
    B_im: np.ndarray  # (H, N)
    C_re: np.ndarray  # (H, N) Ĉ = C (I − Ā^L) V, S4's learned C
    C_im: np.ndarray  # (H, N)


class CauchyCache(NamedTuple):
    w: CauchyWeights
    log_dt: np.ndarray  # (H,)
    omega: np.ndarray  # (L,) roots of unity
    inv_d: np.ndarray  # (H, L, N) 1 / (a − b λ) (zoh: 1 / (1 − ω Ā))
    k: tuple  # (k_CB, k_Cp, k_qB, k_qp), each (H, L) (zoh: None)
    discretization: str = "bilinear"


def _complex(w):
    lam = w.lam_re + 1j * w.lam_im  # (H, N)
    p = np.zeros_like(lam) if w.p_re is None else w.p_re + 1j * w.p_im  # (H, N) 0: diagonal
    return lam, p, w.B_re + 1j * w.B_im, w.C_re + 1j * w.C_im  # (H, N) each


def _check(fn, w, log_dt, L, discretization):
    expect_instance(fn, "w", w, CauchyWeights)
    expect_integer(fn, "L", L, 1)
    if discretization not in ("bilinear", "zoh"):
        raise ValueError(f"{fn}: discretization must be 'bilinear' or 'zoh', got "
                         f"{discretization!r}")
    if (w.p_re is None) != (w.p_im is None):
        raise ValueError(f"{fn}: p_re and p_im are both arrays (DPLR) or both None (diagonal)")
    if discretization == "zoh" and w.p_re is not None:
        raise ValueError(f"{fn}: discretization='zoh' needs a diagonal state matrix (p_re, p_im "
                         f"None): exp(Δ(Λ − p p*)) is not diagonal plus low rank, so it has no "
                         f"Cauchy form; S4 discretises a DPLR matrix with 'bilinear'")
    expect_float(fn, "lam_re", w.lam_re)
    expect_shape(fn, "lam_re", w.lam_re, (None, None), "(H, N)")
    for name, a in zip(w._fields, w):
        if a is not None:
            expect_float(fn, name, a)
            expect_shape(fn, name, a, w.lam_re.shape, "(H, N) like lam_re")
    expect_float(fn, "log_dt", log_dt)
    expect_shape(fn, "log_dt", log_dt, w.lam_re.shape[:1], "(H,)")


def cauchy_kernel_forward(w, log_dt, *, L, discretization="bilinear"):
    """The SSM kernel K (H, L) of DPLR state matrices, by Cauchy sums at the roots of unity.

    Inputs:  w CauchyWeights ((H, N) float arrays; p_re, p_im None for a diagonal Ã = Λ);
             log_dt (H,) the steps Δ = exp(log_dt); L the kernel length; discretization
             "bilinear" (S4's) or "zoh" (zero-order hold, diagonal Ã only).
    Returns: K (H, L), real: K_l = Re C Ā^l B̄ with Ā, B̄ the discretisation of
             Ã = Λ − p p* and C = Ĉ (I − Ā^L)^-1.  Cache: w, log Δ, ω, 1/d, the sums.
    Math: the module docstring.  O(H N L) work, O(H N L) cache.
    """
    w, log_dt = common_float(w, log_dt)
    _check("cauchy_kernel_forward", w, log_dt, L, discretization)
    lam, p, B, C = _complex(w)  # (H, N)
    dt = np.exp(log_dt)[:, None, None]  # (H, 1, 1)
    omega = np.exp(-2j * np.pi * np.arange(L) / L)  # (L,)
    if discretization == "zoh":
        Abar = np.exp(dt[:, 0] * lam)  # (H, N)  Ā = exp(ΔΛ)
        Bbar = (Abar - 1) / lam * B  # (H, N)  B̄ = Λ^-1 (Ā − 1) B
        inv_d = 1 / (1 - omega[None, :, None] * Abar[:, None, :])  # (H, L, N)
        K_hat = np.einsum("hn,hln->hl", C * Bbar, inv_d)  # (H, L)
        K = np.fft.ifft(K_hat, axis=-1).real  # (H, L)
        return K.astype(w.lam_re.dtype), CauchyCache(w, log_dt, omega, inv_d, None, "zoh")
    a = (1 - omega)[None, :, None] / dt  # (H, L, 1)
    b = ((1 + omega) / 2)[None, :, None]  # (1, L, 1)
    inv_d = 1 / (a - b * lam[:, None, :])  # (H, L, N)
    q = np.conj(p)  # (H, N)
    k = tuple(np.einsum("hn,hln->hl", u * v, inv_d) for u, v in ((C, B), (C, p), (q, B), (q, p)))
    b2 = b[..., 0]  # (1, L)
    K_hat = k[0] - b2 * k[1] * k[2] / (1 + b2 * k[3])  # (H, L)
    K = np.fft.ifft(K_hat, axis=-1).real  # (H, L)
    return K.astype(w.lam_re.dtype), CauchyCache(w, log_dt, omega, inv_d, k)


def cauchy_kernel_backward(dK, cache):
    """Gradients of the Cauchy kernel: the chain of the module docstring's Backward lines,
    from dK̂ = fft(dK)/L back through Woodbury, the four Cauchy sums and a = (1 − ω)/Δ (the
    backward is derived here and checked by grads).  Returns {"w": CauchyWeights, "log_dt"}.
    Reference: Gu, Goel & Ré 2022 (arXiv 2111.00396) §3.3 and Appendix C.3 (the forward)."""
    w, log_dt, omega, inv_d, k, disc = cache
    H, L, N = inv_d.shape
    expect_dout("cauchy_kernel_backward", dK, (H, L), w.lam_re.dtype, name="dK")
    G = np.fft.fft(dK, axis=-1) / L  # (H, L)  fwd: K = Re ifft(K_hat)
    if disc == "zoh":
        return _zoh_backward(G, cache)
    kCB, kCp, kqB, kqp = k
    lam, p, B, C = _complex(w)  # (H, N)
    q = np.conj(p)
    dt = np.exp(log_dt)  # (H,)
    b = ((1 + omega) / 2)[None, :]  # (1, L)
    r = 1 / (1 + b * kqp)  # (H, L)
    # fwd: K_hat = kCB − b kCp kqB r
    g = {"CB": G, "Cp": np.conj(-b * r * kqB) * G, "qB": np.conj(-b * r * kCp) * G,
         "qp": np.conj(b * b * r * r * kCp * kqB) * G}  # (H, L) each
    conj_inv = inv_d.conj()  # (H, L, N)
    grads = {"C": 0, "B": 0, "p": 0, "q": 0}
    dd = np.zeros_like(inv_d)  # (H, L, N) gradient of d = a − b λ
    for (un, vn), u, v in ((("C", "B"), C, B), (("C", "p"), C, p), (("q", "B"), q, B),
                           (("q", "p"), q, p)):
        gk = g[un + vn][..., None]  # (H, L, 1)  fwd: k_uv = Σ_n u v / d
        grads[un] = grads[un] + np.sum(conj_inv * gk, axis=1) * np.conj(v)  # (H, N)
        grads[vn] = grads[vn] + np.sum(conj_inv * gk, axis=1) * np.conj(u)
        dd += np.conj(-(u * v)[:, None, :] * inv_d * inv_d) * gk
    dlam = np.sum(np.conj(-b)[..., None] * dd, axis=1)  # (H, N)  fwd: d = a − b λ
    da = dd.sum(axis=2)  # (H, L)
    # fwd: a = (1 − ω)/Δ
    ddt = np.sum(np.conj(-(1 - omega)[None, :] / dt[:, None] ** 2) * da, axis=1).real  # (H,)
    dp = None if w.p_re is None else grads["p"] + np.conj(grads["q"])  # fwd: q = conj(p)
    return _weights_grads(w, dlam, dp, grads["B"], grads["C"], ddt * dt)  # fwd: Δ = exp(log_dt)


def _weights_grads(w, dlam, dp, dB, dC, dlog_dt):
    """{"w": CauchyWeights of the real and imaginary parts, "log_dt"} in w's dtype."""
    dtype = w.lam_re.dtype
    parts = (dlam, dp, dB, dC)
    out = [None if z is None else z.real.astype(dtype) for z in parts]
    out_im = [None if z is None else z.imag.astype(dtype) for z in parts]
    return {"w": CauchyWeights(out[0], out_im[0], out[1], out_im[1], out[2], out_im[2],
                               out[3], out_im[3]), "log_dt": dlog_dt.astype(dtype)}


def _zoh_backward(G, cache):
    """The zero-order-hold kernel's backward (the module docstring's zoh lines); G = dK̂."""
    w, log_dt, omega, inv_d = cache[:4]
    lam, _, B, C = _complex(w)  # (H, N)
    dt = np.exp(log_dt)[:, None]  # (H, 1)
    Abar = np.exp(dt * lam)  # (H, N)  recomputed: fwd Ā = exp(ΔΛ)
    s = (Abar - 1) / lam  # (H, N)
    Bbar = s * B  # (H, N)
    gsum = np.einsum("hln,hl->hn", inv_d.conj(), G)  # (H, N) Σ_ω conj(1/d) dK̂
    dC = np.conj(Bbar) * gsum  # fwd: K_hat = Σ_n Ĉ B̄ / d
    dBbar = np.conj(C) * gsum
    dd = np.conj(-(C * Bbar)[:, None, :] * inv_d * inv_d) * G[..., None]  # (H, L, N)
    dAbar = np.sum(np.conj(-omega)[None, :, None] * dd, axis=1)  # (H, N) fwd: d = 1 − ω Ā
    dB = np.conj(s) * dBbar  # fwd: B̄ = s B
    ds = np.conj(B) * dBbar
    dAbar = dAbar + np.conj(1 / lam) * ds  # fwd: s = (Ā − 1)/λ
    dlam = np.conj(-(Abar - 1) / lam ** 2) * ds + np.conj(dt * Abar) * dAbar  # fwd: Ā = e^{Δλ}
    ddt = np.sum(np.conj(lam * Abar) * dAbar, axis=1).real  # (H,)
    return _weights_grads(w, dlam, None, dB, dC, ddt * dt[:, 0])  # fwd: Δ = exp(log_dt)
