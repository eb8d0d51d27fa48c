"""Attention with learned per-head sink logits (gpt-oss): sdpa_forward(..., sinks=) against
transformers' eager formula transcribed, an independent identity, the limits, bad input."""
import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import causal_mask, sdpa_backward, sdpa_forward
from scratchllm.specs import Mask


def test_gradient_check():
    for report in CASES["sdpa_sinks"](np.random.default_rng(0)):
        assert report.ok, str(report)


def hf_sink_attention(q, k, v, sinks, mask, scale):
    """huggingface/transformers src/transformers/models/gpt_oss/modeling_gpt_oss.py
    eager_attention_forward, transcribed in NumPy: repeat_kv, an additive mask, the sink
    column concatenated, the row max subtracted, softmax, the sink column dropped."""
    B, H, Tq, _ = q.shape
    G = H // k.shape[1]
    key, value = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)  # repeat_kv
    w = q @ key.transpose(0, 1, 3, 2) * scale
    w = w + np.where(mask, 0.0, -np.inf)
    col = np.broadcast_to(sinks.reshape(1, -1, 1, 1), (B, H, Tq, 1))
    combined = np.concatenate([w, col], axis=-1)
    combined = combined - combined.max(axis=-1, keepdims=True)
    e = np.exp(combined)
    probs = e / e.sum(axis=-1, keepdims=True)
    return probs[..., :-1] @ value


def inputs(rng, B=2, H=6, Hkv=3, Tq=5, Tk=7, Dh=4, Dv=3):
    return (rng.standard_normal((B, H, Tq, Dh)), rng.standard_normal((B, Hkv, Tk, Dh)),
            rng.standard_normal((B, Hkv, Tk, Dv)), rng.standard_normal(H))


def test_equals_transformers_eager_formula():
    rng = np.random.default_rng(1)
    q, k, v, sinks = inputs(rng)
    mask = rng.random((2, 6, 5, 7)) < 0.7
    mask[..., 0] = True  # HF's additive mask needs a live key per row (else NaN)
    out, _ = sdpa_forward(q, k, v, Mask(array=mask), 0.4, sinks=sinks)
    np.testing.assert_allclose(out, hf_sink_attention(q, k, v, sinks, mask, 0.4),
                               rtol=0, atol=1e-14)


def test_sink_scales_plain_attention_by_the_mass_it_leaves():
    """Independent identity: with Z = sum_j exp(S_j), the sink keeps exp(s) / (Z + exp(s)) of the
    mass, so out = sdpa(q, k, v) * sigmoid(logsumexp(S) - s)."""
    rng = np.random.default_rng(2)
    q, k, v, sinks = inputs(rng, Hkv=6)
    plain, _ = sdpa_forward(q, k, v, Mask())
    S = q @ k.transpose(0, 1, 3, 2) * 0.5 + np.where(causal_mask(7)[2:], 0.0, -np.inf)
    lse = np.log(np.exp(S).sum(axis=-1, keepdims=True))  # (B, H, Tq, 1)
    kept = 1 / (1 + np.exp(sinks.reshape(1, -1, 1, 1) - lse))
    out, _ = sdpa_forward(q, k, v, Mask(), sinks=sinks)
    np.testing.assert_allclose(out, plain * kept, rtol=1e-12, atol=1e-14)
    assert np.abs(out - plain).max() > 1e-2  # the sink does take mass


def test_limits_and_fully_masked_rows():
    rng = np.random.default_rng(3)
    q, k, v, sinks = inputs(rng)
    plain, _ = sdpa_forward(q, k, v)
    far, _ = sdpa_forward(q, k, v, sinks=np.full(6, -800.0))  # exp(-800) = 0: no sink
    np.testing.assert_allclose(far, plain, rtol=0, atol=1e-15)
    mask = np.ones((2, 6, 5, 7), bool)
    mask[0, 1, 2] = False
    out, cache = sdpa_forward(q, k, v, Mask(array=mask), sinks=sinks)
    assert np.all(out[0, 1, 2] == 0)  # a fully masked row attends only to its sink
    dout = rng.standard_normal(out.shape)
    g = sdpa_backward(dout, cache)
    assert set(g) == {"q", "k", "v", "sinks"} and g["sinks"].shape == (6,)
    assert np.all(g["q"][0, 1, 2] == 0)
    assert set(sdpa_backward(dout, sdpa_forward(q, k, v)[1])) == {"q", "k", "v"}


def test_sink_gradient_closed_form():
    """dsinks[h] = -sum over (b, t) of P_sink * sum_j P_j dP_j with dP = dout v^T."""
    rng = np.random.default_rng(4)
    q, k, v, sinks = inputs(rng, Hkv=6)
    out, cache = sdpa_forward(q, k, v, sinks=sinks)
    dout = rng.standard_normal(out.shape)
    S = q @ k.transpose(0, 1, 3, 2) * 0.5
    e = np.exp(np.concatenate([S, np.broadcast_to(sinks.reshape(1, -1, 1, 1), S.shape[:3] + (1,))],
                              axis=-1))
    P = e / e.sum(axis=-1, keepdims=True)
    dP = dout @ v.transpose(0, 1, 3, 2)
    want = -(P[..., -1] * (P[..., :-1] * dP).sum(-1)).sum(axis=(0, 2))
    np.testing.assert_allclose(sdpa_backward(dout, cache)["sinks"], want, rtol=1e-12)


def test_float32_and_bad_sinks():
    rng = np.random.default_rng(5)
    q, k, v, sinks = (a.astype(np.float32) for a in inputs(rng))
    out, _ = sdpa_forward(q, k, v, sinks=sinks)
    assert out.dtype == np.float32
    with pytest.raises(ValueError, match=r"sdpa: sinks has shape \(3,\), expected \(6,\)"):
        sdpa_forward(q, k, v, sinks=sinks[:3])
    with pytest.raises(TypeError, match="sdpa: sinks must be a float array"):
        sdpa_forward(q, k, v, sinks=np.arange(6))
