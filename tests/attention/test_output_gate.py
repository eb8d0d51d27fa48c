"""Gated attention's output gate (Qwen3-Next): equal to a plain NumPy computation, decoding
equal to the full forward, the Module's gate Param, and clear errors."""
import numpy as np
import pytest

from scratchllm.attention import (Attention, AttentionWeights, KVState, gqa_decode,
                                  gqa_forward, output_gate_forward)
from scratchllm.specs import AttentionSpec, RopeSpec

B, T, D, H, HKV, DH = 2, 6, 10, 4, 2, 4


def _weights(rng, **extra):
    n = lambda *shape: 0.5 * rng.standard_normal(shape)  # noqa: E731
    return AttentionWeights(n(D, H * DH), n(D, HKV * DH), n(D, HKV * DH), n(H * DH, D),
                            wg=n(D, H * DH), **extra)


def test_gated_attention_equals_numpy_written_out():
    """No RoPE, no norms: softmax(q k^T / sqrt(Dh)) v per head (query head h reads KV head
    h // 2), the heads side by side, times sigmoid(x wg), then wo."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((B, T, D)), _weights(rng)
    y, _ = gqa_forward(x, w, spec=AttentionSpec(H, HKV, head_dim=DH, rope=None,
                                                output_gate=True))
    want = np.zeros((B, T, H * DH))
    for b in range(B):
        for h in range(H):
            g = h // (H // HKV)
            q = x[b] @ w.wq[:, h * DH:(h + 1) * DH]
            k, v = (x[b] @ m[:, g * DH:(g + 1) * DH] for m in (w.wk, w.wv))
            s = q @ k.T / np.sqrt(DH) + np.triu(np.full((T, T), -np.inf), 1)
            p = np.exp(s - s.max(-1, keepdims=True))
            want[b, :, h * DH:(h + 1) * DH] = (p / p.sum(-1, keepdims=True)) @ v
    want = (want / (1 + np.exp(-(x @ w.wg)))) @ w.wo
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-12)


def test_gated_decode_equals_the_full_forward():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, T, D))
    w = _weights(rng, q_norm=0.1 * rng.standard_normal(DH), k_norm=0.1 * rng.standard_normal(DH))
    spec = AttentionSpec(H, HKV, head_dim=DH, qk_norm=True, norm_offset=1.0,
                         rope=RopeSpec(partial=0.5), output_gate=True)
    y, _ = gqa_forward(x, w, spec=spec)
    state = KVState(B, HKV, DH, max_len=T, dtype=np.float64)
    steps = np.stack([gqa_decode(x[:, t], w, state, t, spec=spec) for t in range(T)], axis=1)
    np.testing.assert_allclose(steps, y, rtol=0, atol=1e-12)


def test_the_module_owns_the_gate_and_counts_it():
    spec = AttentionSpec(H, HKV, head_dim=DH, qkv_bias=True, output_gate=True)
    m = Attention(D, spec, rng=np.random.default_rng(2), dtype=np.float64)
    assert m.wg.data.shape == (D, H * DH) and m.bg.data.shape == (H * DH,)
    assert sum(p.data.size for p in m.parameters()) == spec.n_params(D)
    y, cache = m.forward(np.ones((1, 3, D)))
    m.backward(np.ones_like(y), cache)
    assert np.abs(m.wg.grad).max() > 0 and np.abs(m.bg.grad).max() > 0
    plain = AttentionSpec(H, HKV, head_dim=DH)
    assert spec.n_params(D) - plain.n_params(D) == D * H * DH + (2 * H + 2 * HKV) * DH  # wg,
    # and the biases bq, bk, bv, bg


def test_a_gate_weight_without_the_option_and_bad_shapes_are_named():
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((B, T, D)), _weights(rng)
    with pytest.raises(ValueError, match=r"spec.output_gate=False, but w.wg is given"):
        gqa_forward(x, w, spec=AttentionSpec(H, HKV, head_dim=DH))
    with pytest.raises(ValueError, match=r"gqa: wg has shape \(10, 15\), expected \(10, 16\)"):
        gqa_forward(x, w._replace(wg=np.ones((D, 15))),
                    spec=AttentionSpec(H, HKV, head_dim=DH, output_gate=True))
    with pytest.raises(ValueError, match=r"output_gate: o has shape \(2, 5, 16\), expected "
                                         r"\(2, 6, \*\)"):
        output_gate_forward(x, np.ones((B, T - 1, H * DH)), w.wg)
    with pytest.raises(ValueError, match="output_gate must be True or False"):
        AttentionSpec(output_gate=1)
