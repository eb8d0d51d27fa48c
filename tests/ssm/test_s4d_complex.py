"""Complex S4D: kernel == the explicit power sum, convolution == the complex recurrence
(decoding), the real special case == real S4D, the S4D-Lin / S4D-Inv values, gradients on the
real parameter pairs, float32 over a long T."""
import numpy as np
import pytest

from grads.check import check
from scratchllm.ssm import hippo_legs
from scratchllm.ssm import (S4DComplex, S4DComplexWeights, s4d_complex_backward,
                            s4d_complex_forward, s4d_complex_step, s4d_forward, s4d_init)


def rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def params(rng, width=3, N=4, init="lin"):
    p = s4d_init(width, N, init, rng=rng)
    return p._replace(B_im=rng.standard_normal(p.B_im.shape),  # a general complex B too
                      log_dt=rng.uniform(-3, -1, width))


def test_output_equals_the_explicit_kernel_sum_and_the_recurrence():
    rng = np.random.default_rng(0)
    p = params(rng)
    x = rng.standard_normal((2, 11, 3))
    A = -np.exp(p.A_log_re) + 1j * p.A_im  # (D, N)
    dt = np.exp(p.log_dt)[:, None]  # (D, 1)
    B_bar = (np.exp(dt * A) - 1) / A * (p.B_re + 1j * p.B_im)  # (D, N)
    l = np.arange(11)
    K = 2 * np.einsum("dn,dnl->dl", (p.C_re + 1j * p.C_im) * B_bar,
                      np.exp(dt[..., None] * A[..., None] * l)).real  # (D, T)
    want = p.D * x
    for t in range(11):
        for s in range(t + 1):
            want[:, t] += K[:, s] * x[:, t - s]
    y = s4d_complex_forward(x, p)[0]
    assert y.dtype == np.float64 and rel(y, want) < 1e-12
    state, outs = None, []
    for t in range(11):
        y_t, state = s4d_complex_step(x[:, t], state, p)
        outs.append(y_t)
    assert rel(np.stack(outs, axis=1), want) < 1e-12


def test_real_A_B_C_is_real_S4D_with_C_doubled():
    rng = np.random.default_rng(1)
    p = params(rng)
    for name in ("A_im", "B_im", "C_im"):
        getattr(p, name)[:] = 0.0
    x = rng.standard_normal((2, 9, 3))
    want = s4d_forward(x, p.A_log_re, p.B_re, 2 * p.C_re, p.log_dt, p.D)[0]
    assert rel(s4d_complex_forward(x, p)[0], want) < 1e-12


def test_initialisations():
    rng = np.random.default_rng(2)
    lin, inv = s4d_init(2, 4, "lin", rng=rng), s4d_init(2, 4, "inv", rng=rng)
    assert np.allclose(-np.exp(lin.A_log_re), -0.5)
    assert np.allclose(lin.A_im[0], np.pi * np.arange(4))
    assert np.allclose(inv.A_im[0], 8 / np.pi * (8 / np.array([1, 3, 5, 7]) - 1))
    legs = s4d_init(2, 4, "legs", rng=rng)  # the normal part's eigenvalues, by a dense eig
    A, _ = hippo_legs(8)
    P = np.sqrt(np.arange(8) + 0.5)
    eig = np.linalg.eigvals(A + np.outer(P, P))  # (8,) -1/2 + i mu, in conjugate pairs
    assert np.allclose(eig.real, -0.5) and np.allclose(-np.exp(legs.A_log_re), -0.5)
    assert np.allclose(legs.A_im[1], np.sort(eig.imag)[4:], atol=1e-12)
    with pytest.raises(ValueError, match="s4d_init: init must be"):
        s4d_init(2, 4, "hippo", rng=rng)


@pytest.mark.parametrize("init", ["lin", "inv", "legs"])
def test_gradients_of_every_real_parameter(init):
    rng = np.random.default_rng(3)
    p = S4DComplexWeights(*(v + rng.normal(0, 0.1, v.shape) for v in params(rng, init=init)))
    report = check(s4d_complex_forward, s4d_complex_backward, rng=rng,
                   x=rng.standard_normal((2, 7, 3)), w=p)
    assert report.ok, report
    assert {r.input for r in report.rows} == {"x"} | {f"w.{n}" for n in p._fields}


def test_module_float32_long_sequence_and_decoding():
    rng = np.random.default_rng(4)
    m = S4DComplex(4, 8, init="inv", rng=rng)
    x = rng.standard_normal((1, 2048, 4)).astype(np.float32)
    y, cache = m.forward(x)
    dx = m.backward(rng.standard_normal(y.shape).astype(np.float32), cache)
    assert y.dtype == np.float32 and np.all(np.isfinite(y)) and np.all(np.isfinite(dx))
    p64 = S4DComplexWeights(*(a.astype(np.float64) for a in m.weights()))
    assert rel(y, s4d_complex_forward(x.astype(np.float64), p64)[0]) < 1e-4
    state = m.init_state(1)
    outs = [m.decode(x[:, t], state) for t in range(16)]
    assert rel(np.stack(outs, axis=1), y[:, :16]) < 1e-4
