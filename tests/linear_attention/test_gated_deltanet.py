"""Qwen3-Next's gated DeltaNet layer: equal to a plain loop written from transformers'
Qwen3NextGatedDeltaNet (its torch_recurrent_gated_delta_rule, one token, one head at a time),
in the chunked and one-chunk forms; decoding token by token equals the full forward, and a
prefill leaves the state decoding would; the Module's sizes; clear errors."""
import numpy as np
import pytest

from grads.cases.gated import _gdn_inputs
from scratchllm.linear_attention import (GatedDeltaNet, delta_rule_final_state,
                                         delta_rule_forward, delta_rule_recurrent,
                                         gated_deltanet_forward, gated_deltanet_step)
from scratchllm.specs import GatedDeltaNetSpec

SPEC = GatedDeltaNetSpec(n_k_heads=2, n_v_heads=4, k_head_dim=3, v_head_dim=5, d_conv=3,
                         chunk=4)


def _loop(x, w, spec):
    """transformers' layer written out: conv over [q | k | v] with SiLU, l2 norms (eps 1e-6
    inside the root), q / sqrt(dk), value head h reads query/key head h // r, the recurrence
    S = exp(g) S; S += k (β (v - S^T k))^T; o = S^T q, then RMSNormGated and out_proj."""
    B, T, D = x.shape
    Hk, Hv, dk, dv, K = (spec.n_k_heads, spec.n_v_heads, spec.k_head_dim, spec.v_head_dim,
                         spec.d_conv)
    mixed = np.concatenate([x @ w.Wq, x @ w.Wk, x @ w.Wv], -1)  # (B, T, C)
    padded = np.concatenate([np.zeros((B, K - 1, mixed.shape[-1])), mixed], 1)
    conv = np.stack([(padded[:, t:t + K] * w.conv_w.T).sum(1) for t in range(T)], 1)
    conv = conv / (1 + np.exp(-conv))
    kd = Hk * dk
    q = conv[..., :kd].reshape(B, T, Hk, dk)
    k = conv[..., kd:2 * kd].reshape(B, T, Hk, dk)
    v = conv[..., 2 * kd:].reshape(B, T, Hv, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    beta = 1 / (1 + np.exp(-(x @ w.Wb)))  # (B, T, Hv)
    g = -np.exp(w.A_log) * np.log1p(np.exp(x @ w.Wa + w.dt_bias))  # (B, T, Hv)
    z = (x @ w.Wz).reshape(B, T, Hv, dv)
    out = np.zeros((B, T, Hv, dv))
    for b in range(B):
        for h in range(Hv):
            S, j = np.zeros((dk, dv)), h // (Hv // Hk)
            for t in range(T):
                S = S * np.exp(g[b, t, h])
                S = S + np.outer(k[b, t, j], beta[b, t, h] * (v[b, t, h] - S.T @ k[b, t, j]))
                o = S.T @ q[b, t, j]
                o = o / np.sqrt((o * o).mean() + spec.norm_eps) * w.norm
                out[b, t, h] = o * z[b, t, h] / (1 + np.exp(-z[b, t, h]))
    return out.reshape(B, T, -1) @ w.Wout


@pytest.mark.parametrize("chunk", [4, 64])  # 9 = 4 + 4 + 1 steps, or one chunk
def test_equals_transformers_layer_written_out(chunk):
    spec = GatedDeltaNetSpec(**{**SPEC.__dict__, "chunk": chunk})
    x, w = _gdn_inputs(np.random.default_rng(0), spec, D=6, T=9)
    out, _ = gated_deltanet_forward(x, w, spec=spec)
    want = _loop(x, w, spec)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12 * np.abs(want).max())


def test_decoding_token_by_token_equals_the_forward():
    layer = GatedDeltaNet(6, SPEC, rng=np.random.default_rng(1), dtype=np.float64)
    x = np.random.default_rng(2).standard_normal((2, 9, 6))
    full, _ = layer.forward(x)
    state = layer.init_state(2)
    steps = np.stack([layer.decode(x[:, t], state) for t in range(9)], axis=1)
    np.testing.assert_allclose(steps, full, rtol=0, atol=1e-12)
    assert sum(a.size for a in state) == 2 * SPEC.state_per_sequence(6)
    assert sum(p.data.size for p in layer.parameters()) == SPEC.n_params(6)


@pytest.mark.parametrize("T", [1, 2, 9])  # shorter than the conv's K - 1 = 2; 4 + 4 + 1
def test_prefill_leaves_the_state_decoding_leaves(T):
    layer = GatedDeltaNet(6, SPEC, rng=np.random.default_rng(6), dtype=np.float64)
    x = np.random.default_rng(7).standard_normal((2, T + 3, 6))
    stepped, filled = layer.init_state(2), layer.init_state(2)
    want = [layer.decode(x[:, t], stepped) for t in range(T)]
    y = layer.prefill(x[:, :T], filled)
    np.testing.assert_allclose(y, np.stack(want, 1), rtol=0, atol=1e-12)
    for a, b in zip(filled, stepped):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    for t in range(T, T + 3):  # and decoding goes on from it
        np.testing.assert_allclose(layer.decode(x[:, t], filled), layer.decode(x[:, t], stepped),
                                   rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="the state is not fresh"):
        layer.prefill(x, filled)


@pytest.mark.parametrize("form, chunk", [("recurrent", 64), ("chunked", 3), ("parallel", 64)])
def test_the_final_state_of_each_form(form, chunk):
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((2, 3, 7, d)) for d in (4, 4, 5))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    beta, g = rng.uniform(0.1, 0.9, (2, 3, 7)), np.log(rng.uniform(0.5, 1.0, (2, 3, 7)))
    cache = delta_rule_forward(q, k, v, beta, g, form=form, chunk=chunk)[1]
    want = delta_rule_recurrent(q, k, v, beta, g)[1]
    np.testing.assert_allclose(delta_rule_final_state(cache), want, rtol=0, atol=1e-12)


def test_float32_stays_float32():
    layer = GatedDeltaNet(6, SPEC, rng=np.random.default_rng(4), dtype=np.float32)
    x = np.random.default_rng(5).standard_normal((2, 5, 6)).astype(np.float32)
    out, cache = layer.forward(x)
    dx = layer.backward(np.ones_like(out), cache)
    assert out.dtype == dx.dtype == layer.Wq.grad.dtype == np.float32
    assert layer.decode(x[:, 0], layer.init_state(2)).dtype == np.float32


def test_bad_inputs_are_named():
    x, w = _gdn_inputs(np.random.default_rng(3), SPEC, D=6)
    with pytest.raises(ValueError, match=r"gated_deltanet: Wb has shape \(6, 3\), expected "
                                         r"\(6, 4\)"):
        gated_deltanet_forward(x, w._replace(Wb=np.ones((6, 3))), spec=SPEC)
    state = GatedDeltaNet(6, SPEC, rng=np.random.default_rng(0)).init_state(1)
    with pytest.raises(ValueError, match=r"state.conv has shape \(1, 2, 32\), expected "
                                         r"\(2, 2, 32\)"):
        gated_deltanet_step(x[:, 0], state, w, spec=SPEC)
    with pytest.raises(ValueError, match="n_v_heads=3 must be a multiple of n_k_heads=2"):
        GatedDeltaNetSpec(n_k_heads=2, n_v_heads=3)
