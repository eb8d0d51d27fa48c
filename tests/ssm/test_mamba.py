"""Mamba block: gradient checks of the block and its new pairs, decoding == full forward."""
import numpy as np
import pytest

from grads.check import check
from scratchllm.ssm.mamba import (WEIGHTS, Mamba, causal_conv1d_backward, causal_conv1d_forward,
                              mamba_backward, mamba_forward, mamba_step, softplus_backward,
                              softplus_forward)

Bt, T, Dm, Di, N, R, K = 2, 7, 5, 9, 3, 2, 4


def weights(rng):
    return dict(W_in=rng.standard_normal((Dm, 2 * Di)) * 0.5,
                conv_w=rng.standard_normal((Di, K)) * 0.5, conv_b=rng.standard_normal(Di) * 0.1,
                W_x=rng.standard_normal((Di, R + 2 * N)) * 0.5,
                W_dt=rng.standard_normal((R, Di)) * 0.5, b_dt=rng.standard_normal(Di) * 0.5 - 1,
                A_log=rng.standard_normal((Di, N)) * 0.5, D=rng.standard_normal(Di),
                W_out=rng.standard_normal((Di, Dm)) * 0.5)


def test_block_gradient_check_every_weight():
    rng = np.random.default_rng(0)
    w = weights(rng)
    report = check(mamba_forward, mamba_backward, rng=rng,
                   x=rng.standard_normal((Bt, T, Dm)), **w)
    assert report.ok, "\n" + str(report)
    assert {r.input for r in report.rows} >= {"x", *WEIGHTS}


def test_conv1d_and_softplus_gradient_checks():
    rng = np.random.default_rng(1)
    r1 = check(causal_conv1d_forward, causal_conv1d_backward, rng=rng,
               x=rng.standard_normal((2, 6, 3)), w=rng.standard_normal((3, 4)),
               b=rng.standard_normal(3))
    r2 = check(softplus_forward, softplus_backward, rng=rng, x=4 * rng.standard_normal((3, 5)))
    assert r1.ok and r2.ok, f"\n{r1}\n{r2}"


def test_conv1d_is_torch_conv1d_padding_k_minus_1_first_T_outputs():
    # Independent: np.convolve (true convolution, flipped kernel) per channel, first T kept.
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((2, 6, 3)), rng.standard_normal((3, 4)), rng.standard_normal(3)
    y = causal_conv1d_forward(x, w, b)[0]
    for i in range(2):
        for c in range(3):
            want = np.convolve(x[i, :, c], w[c, ::-1])[:6] + b[c]
            np.testing.assert_allclose(y[i, :, c], want, rtol=1e-13, atol=1e-13)


def test_softplus_float32_does_not_overflow():
    y = softplus_forward(np.array([-200.0, 0.0, 200.0], np.float32))[0]
    assert y.dtype == np.float32 and np.all(np.isfinite(y))
    np.testing.assert_allclose(y, [0.0, np.log(2.0), 200.0], rtol=1e-6)


def test_step_T_times_equals_the_full_forward():
    rng = np.random.default_rng(3)
    w, x = weights(rng), rng.standard_normal((Bt, T, Dm))
    out = mamba_forward(x, **w)[0]
    conv, h = np.zeros((Bt, K - 1, Di)), np.zeros((Bt, Di, N))
    steps = []
    for t in range(T):
        o, (conv, h) = mamba_step(x[:, t], conv, h, **w)
        steps.append(o)
    np.testing.assert_allclose(np.stack(steps, axis=1), out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_module_forward_backward_decode(dtype):
    rng = np.random.default_rng(4)
    m = Mamba(16, d_state=4, rng=rng, dtype=dtype)
    assert [n for n, _ in m.named_parameters()] == list(WEIGHTS)
    assert m.W_x.data.shape == (32, 1 + 2 * 4)  # R = ceil(16 / 16)
    x = rng.standard_normal((2, 5, 16)).astype(dtype)
    y, cache = m.forward(x)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = m.backward(dy, cache)
    assert y.dtype == dx.dtype == dtype
    want = mamba_backward(dy, cache)
    for name, p in m.named_parameters():  # grads are added into Param.grad
        assert p.grad.dtype == dtype and np.array_equal(p.grad, want[name]), name
    state = m.init_state(2, 5)
    outs = np.stack([m.decode(x[:, t], state, t) for t in range(5)], axis=1)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(outs, y, rtol=tol, atol=tol)


def test_bad_weight_shape_names_it():
    rng = np.random.default_rng(5)
    w = weights(rng)
    with pytest.raises(ValueError, match="mamba: W_x has shape"):
        mamba_forward(rng.standard_normal((Bt, T, Dm)), **{**w, "W_x": w["W_x"][:, :-1]})
