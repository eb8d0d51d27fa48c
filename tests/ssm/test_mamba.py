"""Mamba block: gradient checks of the block and its new pairs, decoding == full forward;
Jamba's inner dt/B/C RMSNorms against transformers' JambaMambaMixer transcribed."""
import numpy as np
import pytest

from grads.cases import CASES
from grads.check import check
from scratchllm.specs import MambaSpec
from scratchllm.ssm.mamba import (INNER_NORMS, Mamba, MambaState, MambaWeights,
                                  causal_conv1d_backward, causal_conv1d_forward, mamba_backward,
                                  mamba_forward, mamba_step, softplus_backward, softplus_forward)

Bt, T, Dm, Di, N, R, K = 2, 7, 5, 10, 3, 2, 4
SPEC = MambaSpec(d_state=N, d_conv=K, expand=Di // Dm, dt_rank=R)
JAMBA = MambaSpec(N, K, Di // Dm, R, inner_norms=True)
WEIGHTS = MambaWeights._fields[:9]  # without the inner norms


def weights(rng):
    return MambaWeights(W_in=rng.standard_normal((Dm, 2 * Di)) * 0.5,
                        conv_w=rng.standard_normal((Di, K)) * 0.5,
                        conv_b=rng.standard_normal(Di) * 0.1,
                        W_x=rng.standard_normal((Di, R + 2 * N)) * 0.5,
                        W_dt=rng.standard_normal((R, Di)) * 0.5,
                        b_dt=rng.standard_normal(Di) * 0.5 - 1,
                        A_log=rng.standard_normal((Di, N)) * 0.5, D=rng.standard_normal(Di),
                        W_out=rng.standard_normal((Di, Dm)) * 0.5)


def zero_state():
    return MambaState(np.zeros((Bt, K - 1, Di)), np.zeros((Bt, Di, N)))


def test_block_gradient_check_every_weight():
    rng = np.random.default_rng(0)
    w = weights(rng)
    report = check(mamba_forward, mamba_backward, rng=rng,
                   x=rng.standard_normal((Bt, T, Dm)), w=w, spec=SPEC)
    assert report.ok, "\n" + str(report)
    assert {r.input for r in report.rows} >= {"x", *(f"w.{n}" for n in WEIGHTS)}


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
    out = mamba_forward(x, w, spec=SPEC)[0]
    state, steps = zero_state(), []
    for t in range(T):
        o, state = mamba_step(x[:, t], state, w, spec=SPEC)
        steps.append(o)
    np.testing.assert_allclose(np.stack(steps, axis=1), out, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_module_forward_backward_decode(dtype):
    rng = np.random.default_rng(4)
    m = Mamba(16, MambaSpec(d_state=4), rng=rng, dtype=dtype)
    assert [n for n, _ in m.named_parameters()] == list(WEIGHTS)
    assert m.W_x.data.shape == (32, 1 + 2 * 4)  # R = ceil(16 / 16)
    x = rng.standard_normal((2, 5, 16)).astype(dtype)
    y, cache = m.forward(x)
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = m.backward(dy, cache)
    assert y.dtype == dx.dtype == dtype
    want = mamba_backward(dy, cache)["w"]
    for name, p in m.named_parameters():  # grads are added into Param.grad
        assert p.grad.dtype == dtype and np.array_equal(p.grad, getattr(want, name)), name
    state = m.init_state(2, 5)
    outs = np.stack([m.decode(x[:, t], state, t) for t in range(5)], axis=1)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(outs, y, rtol=tol, atol=tol)


def test_bad_weight_shape_names_it():
    rng = np.random.default_rng(5)
    w = weights(rng)
    with pytest.raises(ValueError, match="mamba: W_x has shape"):
        mamba_forward(rng.standard_normal((Bt, T, Dm)), w._replace(W_x=w.W_x[:, :-1]),
                      spec=SPEC)
    with pytest.raises(ValueError, match=r"mamba: conv_w has shape \(10, 4\), expected "
                                         r"\(10, 5\) \(\(Di, K\), K = spec.d_conv = 5\)"):
        mamba_forward(rng.standard_normal((Bt, T, Dm)), w, spec=MambaSpec(N, K + 1, 2, R))
    with pytest.raises(TypeError, match="mamba: w must be a MambaWeights, got dict"):
        mamba_forward(rng.standard_normal((Bt, T, Dm)), w._asdict(), spec=SPEC)


# ---------------------------------------------------------------------------- Jamba
def test_inner_norms_gradient_check():
    report = CASES["mamba_inner_norms"](np.random.default_rng(0))
    assert report.ok, str(report)
    assert {r.input for r in report.rows} >= {"x", *(f"w.{n}" for n in WEIGHTS + INNER_NORMS)}


def jamba_weights(rng):
    return weights(rng)._replace(dt_norm=1 + 0.3 * rng.standard_normal(R),
                                 B_norm=1 + 0.3 * rng.standard_normal(N),
                                 C_norm=1 + 0.3 * rng.standard_normal(N))


def rms(v, g, eps=1e-6):
    return g * v / np.sqrt((v * v).mean(-1, keepdims=True) + eps)


def hf_jamba_mixer(x, w, eps=1e-6):
    """huggingface/transformers src/transformers/models/jamba/modeling_jamba.py
    JambaMambaMixer.forward without a cache, transcribed: nn.Conv1d(groups=Di, padding=K-1)
    as a loop, the inner norms after x_proj, dt_proj's weight then delta_bias + softplus in
    the scan, y * silu(gate), out_proj. nn.Linear weights are (out, in): ours transposed."""
    w = w._asdict()
    proj = x @ w["W_in"]
    xs, gate = proj[..., :Di], proj[..., Di:]
    conv = np.zeros_like(xs)
    for t in range(T):
        for j in range(K):
            src = t - (K - 1) + j
            if src >= 0:
                conv[:, t] += w["conv_w"][:, j] * xs[:, src]
    hs = conv + w["conv_b"]
    hs = hs / (1 + np.exp(-hs))  # silu
    ssm = hs @ w["W_x"]
    time_step, B, C = ssm[..., :R], ssm[..., R:R + N], ssm[..., R + N:]
    time_step = rms(time_step, w["dt_norm"], eps)
    B, C = rms(B, w["B_norm"], eps), rms(C, w["C_norm"], eps)
    delta = np.log1p(np.exp(time_step @ w["W_dt"] + w["b_dt"]))  # delta_softplus
    A = -np.exp(w["A_log"])
    h = np.zeros((Bt, Di, N))
    ys = []
    for t in range(T):  # selective_scan_ref: h = exp(dA) h + dB x, y = C h + D x
        h = np.exp(delta[:, t, :, None] * A) * h + delta[:, t, :, None] * B[:, t, None] \
            * hs[:, t, :, None]
        ys.append((h * C[:, t, None]).sum(-1) + w["D"] * hs[:, t])
    y = np.stack(ys, axis=1) * gate / (1 + np.exp(-gate))
    return y @ w["W_out"]


def test_block_equals_jamba_mixer():
    rng = np.random.default_rng(1)
    w, x = jamba_weights(rng), rng.standard_normal((Bt, T, Dm))
    out, _ = mamba_forward(x, w, spec=JAMBA)
    np.testing.assert_allclose(out, hf_jamba_mixer(x, w), rtol=1e-12, atol=1e-12)
    plain = w._replace(dt_norm=None, B_norm=None, C_norm=None)
    assert np.abs(mamba_forward(x, plain, spec=SPEC)[0] - out).max() > 1e-3  # the norms act


def test_inner_norms_step_T_times_equals_the_full_forward():
    rng = np.random.default_rng(2)
    w, x = jamba_weights(rng), rng.standard_normal((Bt, T, Dm))
    spec = MambaSpec(N, K, Di // Dm, R, inner_norms=True, norm_eps=1e-5)
    out = mamba_forward(x, w, spec=spec)[0]
    state, steps = zero_state(), []
    for t in range(T):
        o, state = mamba_step(x[:, t], state, w, spec=spec)
        steps.append(o)
    np.testing.assert_allclose(np.stack(steps, axis=1), out, rtol=1e-12, atol=1e-12)


def test_module_with_inner_norms():
    rng = np.random.default_rng(3)
    spec = MambaSpec(d_state=4, inner_norms=True, norm_eps=1e-5)
    m = Mamba(16, spec, rng=rng, dtype=np.float64)
    assert [n for n, _ in m.named_parameters()] == [*WEIGHTS, *INNER_NORMS]
    assert m.dt_norm.data.shape == (1,) and np.all(m.B_norm.data == 1)
    for p in (m.dt_norm, m.B_norm, m.C_norm):
        p.data[:] = 1 + 0.2 * rng.standard_normal(p.data.shape)
    x = rng.standard_normal((2, 5, 16))
    y, cache = m.forward(x)
    w = MambaWeights(**{n: p.data for n, p in m.named_parameters()})
    np.testing.assert_array_equal(y, mamba_forward(x, w, spec=spec)[0])
    dy = rng.standard_normal(y.shape)
    m.backward(dy, cache)
    want = mamba_backward(dy, cache)["w"]
    for name, p in m.named_parameters():
        assert np.array_equal(p.grad, getattr(want, name)), name
    state = m.init_state(2, 5)
    outs = np.stack([m.decode(x[:, t], state, t) for t in range(5)], axis=1)
    np.testing.assert_allclose(outs, y, rtol=1e-12, atol=1e-12)
    assert "dt_norm" not in dict(Mamba(16, MambaSpec(d_state=4), rng=rng).named_parameters())


def test_norms_all_or_none_and_shapes():
    rng = np.random.default_rng(4)
    w, x = jamba_weights(rng), rng.standard_normal((Bt, T, Dm))
    with pytest.raises(ValueError, match=r"mamba: dt_norm, B_norm, C_norm must be given together"):
        mamba_forward(x, w._replace(C_norm=None), spec=JAMBA)
    with pytest.raises(ValueError, match=r"mamba: dt_norm, B_norm, C_norm must be given together"):
        mamba_forward(x, w, spec=SPEC)
    with pytest.raises(ValueError, match=r"mamba: B_norm has shape \(2,\), expected \(3,\)"):
        mamba_forward(x, w._replace(B_norm=np.ones(2)), spec=JAMBA)
    with pytest.raises(ValueError, match="mamba_step: dt_norm, B_norm"):
        mamba_step(x[:, 0], zero_state(), w._replace(dt_norm=None), spec=JAMBA)
