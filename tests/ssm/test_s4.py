"""S4: the HiPPO-LegS matrix from its formula, its DPLR form (a unitary V instead of the
ill-conditioned eigenvectors of A), and the Cauchy kernel against the kernel of the dense A
(bilinear Ā by scipy solves, then matrix powers) at 1e-10."""
import numpy as np
import pytest
import scipy.linalg

from scratchllm.ssm import CauchyWeights, cauchy_kernel_forward, dplr_legs, hippo_legs


def test_hippo_legs_formula():
    A, B = hippo_legs(5)
    for n in range(5):
        for k in range(5):
            want = (-np.sqrt(2 * n + 1) * np.sqrt(2 * k + 1) if n > k
                    else -(n + 1) if n == k else 0.0)
            assert A[n, k] == pytest.approx(want, abs=1e-15)
    np.testing.assert_allclose(B, np.sqrt(2 * np.arange(5) + 1))


def test_dplr_form_and_the_dense_a_problem():
    N = 32
    A, B = hippo_legs(N)
    d = dplr_legs(N)
    np.testing.assert_allclose(d.V @ np.diag(d.Lambda) @ d.V.conj().T - np.outer(d.P, d.P), A,
                               atol=1e-11)
    np.testing.assert_allclose(d.V.conj().T @ d.V, np.eye(N), atol=1e-12)  # unitary
    np.testing.assert_allclose(d.Lambda.real, -0.5, atol=1e-12)
    np.testing.assert_allclose(d.V @ d.B, B, atol=1e-11)
    # the problem: A's own eigenvectors are numerically useless (condition number ~1e10+)
    assert np.linalg.cond(np.linalg.eig(A)[1]) > 1e9 and np.linalg.cond(d.V) < 1 + 1e-9


def _dense_kernel(A, B, C, dt, L):
    """K_l = C Ā^l B̄ with the bilinear Ā, B̄ of the dense A (scipy solves, matrix powers)."""
    I = np.eye(len(A))
    Abar = scipy.linalg.solve(I - dt / 2 * A, I + dt / 2 * A)
    h = scipy.linalg.solve(I - dt / 2 * A, dt * B)
    return _powers(Abar, h, C, L), Abar


def _powers(Abar, Bbar, C, L):
    """K_l = C Ā^l B̄ for l < L, by matrix powers."""
    K, h = np.empty(L, complex), Bbar
    for l in range(L):
        K[l] = C @ h
        h = Abar @ h
    return K


@pytest.mark.parametrize("N, L, dt", [(16, 64, 0.05), (64, 200, 0.01), (8, 33, 0.3)])
def test_cauchy_kernel_equals_the_dense_hippo_kernel(N, L, dt):
    rng = np.random.default_rng(N)
    A, B = hippo_legs(N)
    C = rng.standard_normal(N)
    K, Abar = _dense_kernel(A, B, C, dt, L)
    d = dplr_legs(N)
    C_hat = C @ (np.eye(N) - np.linalg.matrix_power(Abar, L)) @ d.V  # (N,) S4's Ĉ, V basis
    w = CauchyWeights(*(a[None] for a in (d.Lambda.real, d.Lambda.imag, d.p.real, d.p.imag,
                                          d.B.real, d.B.imag, C_hat.real, C_hat.imag)))
    got, _ = cauchy_kernel_forward(w, np.log([dt]), L=L)
    assert np.abs(got[0] - K.real).max() <= 1e-10 * max(1, np.abs(K).max())


def test_cauchy_kernel_of_random_complex_dplr_matrices():
    rng = np.random.default_rng(1)
    H, N, L = 3, 6, 21
    w = CauchyWeights(-rng.uniform(0.2, 1, (H, N)), rng.normal(0, 3, (H, N)),
                      *(rng.standard_normal((H, N)) for _ in range(6)))
    log_dt = rng.uniform(-3, -1, H)
    got, _ = cauchy_kernel_forward(w, log_dt, L=L)
    for h in range(H):
        lam, p = w.lam_re[h] + 1j * w.lam_im[h], w.p_re[h] + 1j * w.p_im[h]
        A = np.diag(lam) - np.outer(p, p.conj())  # (N, N) complex, in the basis of V
        B, C_hat = w.B_re[h] + 1j * w.B_im[h], w.C_re[h] + 1j * w.C_im[h]
        dt = np.exp(log_dt[h])
        _, Abar = _dense_kernel(A, B, C_hat, dt, L)
        C = C_hat @ np.linalg.inv(np.eye(N) - np.linalg.matrix_power(Abar, L))
        K, _ = _dense_kernel(A, B, C, dt, L)
        np.testing.assert_allclose(got[h], K.real, atol=1e-10 * np.abs(K).max())


def _zoh_expm_kernel(A, B, C, dt, L):
    """K_l = C Ā^l B̄ with the zero-order hold of the dense A: Ā = expm(ΔA) (scipy),
    B̄ = A^-1 (Ā − I) B (a scipy solve), then matrix powers."""
    Abar = scipy.linalg.expm(dt * A)
    Bbar = scipy.linalg.solve(A, (Abar - np.eye(len(A))) @ B)
    return _powers(Abar, Bbar, C, L), Abar


@pytest.mark.parametrize("N, L, dt", [(16, 64, 0.05), (64, 200, 0.01), (8, 33, 0.3)])
def test_zoh_cauchy_kernel_equals_the_expm_kernel_of_the_dense_a(N, L, dt):
    """S4D-LegS (the diagonal Λ of HiPPO-LegS's normal part) under zero-order hold: the Cauchy
    sum in the basis of V against scipy's expm of the dense A = V Λ V* in the original basis."""
    rng = np.random.default_rng(N)
    d = dplr_legs(N)
    A = d.V @ np.diag(d.Lambda) @ d.V.conj().T  # (N, N) dense, complex
    B = d.V @ d.B  # the original B_n = sqrt(2n + 1)
    C = rng.standard_normal(N) + 1j * rng.standard_normal(N)
    K, Abar = _zoh_expm_kernel(A, B, C, dt, L)
    C_hat = C @ (np.eye(N) - np.linalg.matrix_power(Abar, L)) @ d.V  # (N,) in the basis of V
    w = CauchyWeights(d.Lambda.real[None], d.Lambda.imag[None], None, None, d.B.real[None],
                      d.B.imag[None], C_hat.real[None], C_hat.imag[None])
    got, _ = cauchy_kernel_forward(w, np.log([dt]), L=L, discretization="zoh")
    assert np.abs(got[0] - K.real).max() <= 1e-10 * max(1, np.abs(K).max())
    bilinear, _ = cauchy_kernel_forward(w, np.log([dt]), L=L)  # another discretisation:
    assert np.abs(bilinear[0] - K.real).max() > 1e-8 * np.abs(K).max()  # close, not equal


def test_zoh_of_a_dplr_matrix_is_refused():
    d = dplr_legs(4)
    w = CauchyWeights(*(a[None] for a in (d.Lambda.real, d.Lambda.imag, d.p.real, d.p.imag,
                                          d.B.real, d.B.imag, d.B.real, d.B.imag)))
    with pytest.raises(ValueError, match="zoh' needs a diagonal state matrix"):
        cauchy_kernel_forward(w, np.log([0.1]), L=8, discretization="zoh")
    with pytest.raises(ValueError, match="discretization must be 'bilinear' or 'zoh'"):
        cauchy_kernel_forward(w, np.log([0.1]), L=8, discretization="euler")
