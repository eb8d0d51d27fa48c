"""Tests for scratchllm/ssm/lti.py and s4d.py: ZOH against the exact ODE solution, recurrence ==
direct convolution == FFT convolution, S4D stepping == the convolutional forward, gradients."""
import numpy as np
import pytest
import scipy.fft
from scipy.integrate import solve_ivp
from scipy.linalg import expm

import grads
from scratchllm.ssm import (S4D, fft_conv_backward, fft_conv_forward, fft_conv_forward_ref,
                            fft_len, s4d_backward, s4d_forward, s4d_step, ssm_kernel_backward,
                            ssm_kernel_forward, ssm_kernel_forward_ref, ssm_recurrence,
                            zoh_backward, zoh_forward)
from scratchllm.ssm import lti
from scratchllm.ssm.lti import vandermonde_transpose


def s4d_params(rng, width=3, N=5, dtype=np.float64):
    p = dict(A_log=rng.normal(0, 0.7, (width, N)), B=rng.standard_normal((width, N)),
             C=rng.standard_normal((width, N)), log_dt=rng.uniform(-4, 0, width),
             D=rng.standard_normal(width))
    return {k: v.astype(dtype) for k, v in p.items()}


# ---------------------------------------------------------------------------- ZOH
@pytest.mark.parametrize("a", [-3.0, -0.4, -1e-9, 0.0, 1e-12, 0.7])
def test_zoh_matches_van_loan_matrix_exponential(a):
    # h' = a h + b u with u constant over the step: expm([[aΔ, bΔ], [0, 0]]) = [[Ā, B̄], [0, 1]]
    b, delta = 1.7, 0.3
    E = expm(np.array([[a * delta, b * delta], [0.0, 0.0]]))
    (A_bar, B_bar), _ = zoh_forward(np.array([a]), np.array([b]), np.array(delta))
    np.testing.assert_allclose([A_bar[0], B_bar[0]], [E[0, 0], E[0, 1]], rtol=1e-13, atol=0)


def test_zoh_steps_follow_the_ode_solution():
    # k ZOH steps of h_t = Ā h + B̄ u equal the ODE integrated numerically to t = kΔ
    a, b, u, h0, delta, k = -1.3, 0.8, 2.0, 0.5, 0.25, 8
    sol = solve_ivp(lambda t, h: a * h + b * u, (0, k * delta), [h0], rtol=1e-12, atol=1e-14,
                    t_eval=delta * np.arange(1, k + 1))
    (A_bar, B_bar), _ = zoh_forward(np.array([a]), np.array([b]), np.array(delta))
    h, hs = h0, []
    for _ in range(k):
        h = A_bar[0] * h + B_bar[0] * u
        hs.append(h)
    np.testing.assert_allclose(hs, sol.y[0], rtol=1e-9)


def test_zoh_float32_large_negative_A_has_no_overflow():
    A = -np.array([[1e-3, 1.0, 80.0, 1e4, 1e30]], np.float32)
    B = np.ones_like(A)
    delta = np.array([2.0], np.float32)
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow to 0 is fine
        (A_bar, B_bar), cache = zoh_forward(A, B, delta)
        g = zoh_backward((np.ones_like(A), np.ones_like(A)), cache)
    assert A_bar.dtype == B_bar.dtype == np.float32
    assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in g.values())
    np.testing.assert_allclose(B_bar, np.expm1(2.0 * A.astype(np.float64)) / A, rtol=1e-6)


def test_zoh_limit_at_A_zero_is_delta_B():
    B, delta = np.array([[0.3, -2.0]]), np.array([0.7])
    (A_bar, B_bar), _ = zoh_forward(np.zeros((1, 2)), B, delta)
    np.testing.assert_array_equal(A_bar, 1.0)
    np.testing.assert_allclose(B_bar, delta[:, None] * B, rtol=1e-15)


def test_zoh_gradient_near_A_zero_matches_closed_form():
    # dB̄/dA = Δ² B φ'(ΔA), φ'(0) = 1/2: without the series the difference quotient
    # (exp(z) − φ(z))/z loses every digit at z = 1e-12
    A = np.array([0.0, 1e-12, -1e-9, 1e-4])
    (_, _), cache = zoh_forward(A, np.ones(4), np.array(2.0))
    dA = zoh_backward((np.zeros(4), np.ones(4)), cache)["A"]
    z = 2.0 * A
    dphi = 0.5 + z / 3 + z ** 2 / 8
    np.testing.assert_allclose(dA, 4.0 * dphi, rtol=1e-12)


def test_zoh_rejects_bad_shapes():
    with pytest.raises(ValueError, match="zoh: delta has shape"):
        zoh_forward(np.ones((3, 4)), np.ones((3, 4)), np.ones(4))


# ---------------------------------------------------------------------------- kernel, convolution
@pytest.mark.parametrize("L", [1, 2, 7, 16, 97, 300])
def test_blocked_kernel_matches_dense_power_matrix(L):
    rng = np.random.default_rng(L)
    A_bar, B_bar, C = rng.uniform(-1, 1, (3, 4, 6)), rng.standard_normal((3, 4, 6)), \
        rng.standard_normal((3, 4, 6))
    K, _ = ssm_kernel_forward(A_bar, B_bar, C, L)
    np.testing.assert_allclose(K, ssm_kernel_forward_ref(A_bar, B_bar, C, L)[0], rtol=0, atol=1e-12)


def test_vandermonde_transpose_is_the_adjoint():
    rng = np.random.default_rng(1)
    A_bar, w = rng.uniform(-1, 1, (2, 5)), rng.standard_normal((2, 5))
    g = rng.standard_normal((2, 23))
    V = A_bar[..., None] ** np.arange(23)  # (2, 5, 23) dense
    np.testing.assert_allclose(vandermonde_transpose(A_bar, g), np.einsum("dnl,dl->dn", V, g),
                               atol=1e-12)
    K, _ = ssm_kernel_forward(A_bar, w, np.ones_like(w), 23)
    assert np.isclose(np.sum(K * g), np.sum(w * vandermonde_transpose(A_bar, g)), rtol=1e-12)


@pytest.mark.parametrize("T", [1, 2, 8, 13, 64, 97, 100])
def test_recurrence_equals_direct_and_fft_convolution(T):
    rng = np.random.default_rng(T)
    width, N = 3, 5
    x = rng.standard_normal((2, T, width))
    (A_bar, B_bar), _ = zoh_forward(-rng.uniform(0.1, 3, (width, N)), rng.standard_normal((width, N)),
                                    rng.uniform(0.01, 0.5, width))
    C, D = rng.standard_normal((width, N)), rng.standard_normal(width)
    y_rec = ssm_recurrence(x, A_bar, B_bar, C, D)
    K, _ = ssm_kernel_forward(A_bar, B_bar, C, T)  # (width, T)
    u = np.swapaxes(x, 1, 2)  # (B, width, T)
    y_direct = np.swapaxes(fft_conv_forward_ref(u, K)[0], 1, 2) + D * x
    y_fft = np.swapaxes(fft_conv_forward(u, K)[0], 1, 2) + D * x
    np.testing.assert_allclose(y_direct, y_rec, rtol=0, atol=1e-10)
    np.testing.assert_allclose(y_fft, y_rec, rtol=0, atol=1e-10)


def test_fft_conv_backward_is_the_flipped_convolution():
    rng = np.random.default_rng(2)
    x, K, dy = (rng.standard_normal((4, 31)) for _ in range(3))
    g = fft_conv_backward(dy, fft_conv_forward(x, K)[1])
    np.testing.assert_allclose(g["x"], fft_conv_forward_ref(dy[:, ::-1], K)[0][:, ::-1], atol=1e-12)
    np.testing.assert_allclose(g["K"], fft_conv_forward_ref(dy[:, ::-1], x)[0][:, ::-1], atol=1e-12)


@pytest.mark.parametrize("T", [1, 2, 5, 97, 1000, 4099])
def test_fft_length_is_at_least_2T_minus_1(T):
    n = fft_conv_forward(np.ones((1, T)), np.ones((1, T)))[1].n
    assert n == fft_len(T) >= 2 * T - 1
    assert n == scipy.fft.next_fast_len(n, real=True)  # a fast size


def test_fft_length_below_2T_minus_1_would_be_caught(monkeypatch):
    # n = T is a circular convolution: the tail wraps onto the head. The equivalence test above
    # uses exactly this comparison, so a wrong length cannot pass it.
    rng = np.random.default_rng(3)
    x, K = rng.standard_normal((2, 13)), rng.standard_normal((2, 13))
    monkeypatch.setattr(lti, "fft_len", lambda T: T)
    wrong = fft_conv_forward(x, K)[0]
    assert np.abs(wrong - fft_conv_forward_ref(x, K)[0]).max() > 0.1
    monkeypatch.setattr(lti, "fft_len", lambda T: 2 * T - 1)  # the smallest exact length
    np.testing.assert_allclose(fft_conv_forward(x, K)[0], fft_conv_forward_ref(x, K)[0], atol=1e-12)


def test_fft_conv_keeps_float32():
    x, K = np.ones((2, 3, 10), np.float32), np.ones((3, 10), np.float32)
    y, cache = fft_conv_forward(x, K)
    g = fft_conv_backward(y, cache)
    assert y.dtype == g["x"].dtype == g["K"].dtype == np.float32
    assert g["K"].shape == (3, 10)


def test_fft_conv_rejects_mismatched_kernel():
    with pytest.raises(ValueError, match="fft_conv: K has length 9"):
        fft_conv_forward(np.ones((2, 10)), np.ones((2, 9)))


# ---------------------------------------------------------------------------- S4D
def test_s4d_stepping_equals_convolutional_forward():
    rng = np.random.default_rng(4)
    p = s4d_params(rng)
    x = rng.standard_normal((2, 17, 3))
    y, _ = s4d_forward(x, **p)
    state, steps = None, []
    for t in range(17):
        y_t, state = s4d_step(x[:, t], state, **p)
        steps.append(y_t)
    np.testing.assert_allclose(np.stack(steps, 1), y, rtol=0, atol=1e-10)


def test_s4d_module_accumulates_grads_and_steps_like_forward():
    rng = np.random.default_rng(5)
    layer = S4D(4, 6, rng=rng, dtype=np.float64)
    x, dy = rng.standard_normal((2, 9, 4)), rng.standard_normal((2, 9, 4))
    y, cache = layer.forward(x)
    dx = layer.backward(dy, cache)
    layer.backward(dy, cache)  # a second call adds
    g = s4d_backward(dy, cache)
    np.testing.assert_allclose(dx, g["x"])
    for name, p in layer.named_parameters():
        np.testing.assert_allclose(p.grad, 2 * g[name])
    y0, state = layer.step(x[:, 0])
    np.testing.assert_allclose(y0, y[:, 0], atol=1e-12)
    assert state.shape == (2, 4, 6)


def test_s4d_float32_stays_float32_and_close_to_float64():
    rng = np.random.default_rng(6)
    layer = S4D(8, 16, rng=rng)
    x = rng.standard_normal((2, 300, 8)).astype(np.float32)
    y, cache = layer.forward(x)
    g = s4d_backward(np.ones_like(y), cache)
    assert y.dtype == np.float32 and all(v.dtype == np.float32 for v in g.values())
    p64 = {n: p.data.astype(np.float64) for n, p in layer.named_parameters()}
    y64, _ = s4d_forward(x.astype(np.float64), **p64)
    np.testing.assert_allclose(y, y64, rtol=0, atol=1e-4 * np.abs(y64).max())


def test_s4d_rejects_bad_parameter_shape():
    rng = np.random.default_rng(7)
    p = s4d_params(rng)
    p["log_dt"] = np.zeros(4)
    with pytest.raises(ValueError, match="s4d: log_dt has shape"):
        s4d_forward(np.ones((1, 5, 3)), **p)


# ---------------------------------------------------------------------------- gradients
def test_gradients_of_every_pair():
    rng = np.random.default_rng(8)
    reports = [
        grads.check(zoh_forward, zoh_backward, rng=rng, label="zoh near 0",
                    A=np.array([[0.0, 1e-12, -1e-7, 0.05], [0.1001, -0.0999, -4.0, 1.5]]),
                    B=rng.standard_normal((2, 4)), delta=np.array([1.0, 0.9])),
        grads.check(ssm_kernel_forward, ssm_kernel_backward, rng=rng, label="kernel",
                    A_bar=rng.uniform(-0.9, 0.9, (3, 5)), B_bar=rng.standard_normal((3, 5)),
                    C=rng.standard_normal((3, 5)), L=13),
        grads.check(fft_conv_forward, fft_conv_backward, rng=rng, label="fft_conv",
                    x=rng.standard_normal((2, 3, 11)), K=rng.standard_normal((3, 11))),
        grads.check(s4d_forward, s4d_backward, rng=rng, label="s4d",
                    x=rng.standard_normal((2, 7, 3)), **s4d_params(rng)),
    ]
    for r in reports:
        assert r.ok, f"\n{r}"


def test_s4d_gradient_with_A_near_zero():
    rng = np.random.default_rng(9)
    p = s4d_params(rng)
    p["A_log"][0] = [-40.0, -25.0, -8.0, -30.0, 0.0]  # A = −exp(A_log) ≈ 0: series region
    r = grads.check(s4d_forward, s4d_backward, rng=rng, x=rng.standard_normal((2, 7, 3)), **p)
    assert r.ok, f"\n{r}"


def test_zoh_gradient_at_a_huge_step_is_the_limits():
    # Δ → ∞ with A < 0: B̄ → −B/A, so dB̄/dA → B/A² and dB̄/dB → −1/A, while Ā → 0 and every
    # derivative in Δ → 0. Δ² φ'(ΔA) underflowed to 0 here (dA = 0) before
    A, B = np.array([-1.0, -2.0, -0.5]), np.array([3.0, 1.0, -2.0])
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        (A_bar, B_bar), cache = zoh_forward(A, B, np.array(1e300))
        g = zoh_backward((np.ones(3), np.ones(3)), cache)
    np.testing.assert_array_equal(A_bar, 0.0)
    np.testing.assert_allclose(B_bar, -B / A, rtol=1e-15)
    np.testing.assert_allclose(g["A"], B / A ** 2, rtol=1e-15)
    np.testing.assert_allclose(g["B"], -1 / A, rtol=1e-15)
    assert g["delta"] == 0.0
