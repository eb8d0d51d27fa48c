"""GPTQ int4: the Cholesky pass with lazy batches equals the optimal-brain-surgeon loop written
out here (a full inverse Hessian, eliminated row by row), is round-to-nearest when the inputs
are uncorrelated, lowers a layer's output error below round-to-nearest's, and calibrates a
whole LM block by block (the original unchanged)."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM
from scratchllm.serve import gptq_quantize, gptq_weights, quantize, quantize_weights


def scales_of(rows):
    amax = np.abs(rows).max(0)
    return np.where(amax > 0, amax / 7, 1).astype(np.float32).astype(np.float64)


def obs_reference(w, H, g, damp=0.01, act_order=False):
    """Row by row (by decreasing H_ii with act_order, every group's scale then taken from w
    first; else in order, a group's scale fixed at its first row): round row i, move the
    others by −(w_i − q_i) H⁻¹[:, i] / H⁻¹_ii, eliminate i from H⁻¹."""
    H = H + damp * np.mean(np.diag(H)) * np.eye(len(H))
    Hinv, W, out = np.linalg.inv(H), w.copy(), np.zeros_like(w)
    static = [scales_of(w[k:k + g]) for k in range(0, len(w), g)]
    order = np.argsort(-np.diag(H), kind="stable") if act_order else range(len(W))
    for i in order:
        if not act_order and i % g == 0:
            s = scales_of(W[i:i + g])
        elif act_order:
            s = static[i // g]
        out[i] = np.clip(np.rint(W[i] / s), -8, 7) * s
        d = Hinv[i, i]
        W -= np.outer(Hinv[:, i], (W[i] - out[i]) / d)
        Hinv = Hinv - np.outer(Hinv[:, i], Hinv[i, :]) / d
    return out


def correlated(rng, n, d):
    return rng.standard_normal((n, d)) @ rng.standard_normal((d, d)) * 0.3 + \
        rng.standard_normal((n, d))  # (n, d)


@pytest.mark.parametrize("block", [16, 32, 100])
def test_the_cholesky_pass_equals_the_obs_loop(block):
    rng = np.random.default_rng(0)
    w, X = rng.standard_normal((64, 10)), correlated(rng, 400, 64)
    q = gptq_quantize(w, X.T @ X, group_size=16, block=block)
    np.testing.assert_allclose(q.dequantize().T, obs_reference(w, X.T @ X, 16), atol=1e-12)
    assert q.codes.shape == (10, 32) and q.scales.shape == (10, 4) and q.fmt == "int4"
    q = gptq_quantize(w, X.T @ X, group_size=16, block=block, act_order=True)
    np.testing.assert_allclose(q.dequantize().T, obs_reference(w, X.T @ X, 16, act_order=True),
                               atol=1e-12)


def test_uncorrelated_inputs_give_round_to_nearest_and_correlated_ones_gain():
    rng = np.random.default_rng(1)
    w, X = rng.standard_normal((64, 12)), correlated(rng, 400, 64)
    rtn = quantize(w.T.copy(), "int4", group_size=16).dequantize().T
    np.testing.assert_array_equal(gptq_quantize(w, np.eye(64), group_size=16).dequantize().T,
                                  rtn)
    diagonal = np.diag(rng.uniform(1, 2, 64))  # uncorrelated, visited in a shuffled order
    np.testing.assert_array_equal(gptq_quantize(w, diagonal, group_size=16, act_order=True)
                                  .dequantize().T, rtn)
    gptq = gptq_quantize(w, X.T @ X, group_size=16).dequantize().T
    assert np.linalg.norm(X @ (w - gptq)) < 0.85 * np.linalg.norm(X @ (w - rtn))
    assert np.abs(w - gptq).max() > np.abs(w - rtn).max()  # weights move, outputs stay


def test_gptq_weights_calibrates_every_linear_of_a_tiny_lm():
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    rng = np.random.default_rng(2)
    calibration = rng.integers(0, LM_TINY["vocab_size"], (8, 16))
    held_out = rng.integers(0, LM_TINY["vocab_size"], (4, 16))
    q_model, rep = gptq_weights(model, calibration, group_size=4)
    rtn_model, rtn_rep = quantize_weights(model, "int4", group_size=4)
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(p.data, before[n])
    assert rep["gptq"] == rep["params"] == rtn_rep["params"] and rep["rtn"] == 0
    assert rep["quantized_bytes"] == rtn_rep["quantized_bytes"]
    f = model.forward(held_out)[0]
    assert np.linalg.norm(q_model.forward(held_out)[0] - f) < \
        np.linalg.norm(rtn_model.forward(held_out)[0] - f)
    for name in ("moe", "mla"):  # stacked experts: one H per expert, from its own tokens
        other = LM(lm_tiny(name), rng=np.random.default_rng(0), dtype=np.float64)
        q_model, rep = gptq_weights(other, calibration, group_size=2)
        assert rep["gptq"] == rep["params"] and rep["rtn"] == 0
        f = other.forward(held_out)[0]
        assert np.linalg.norm(q_model.forward(held_out)[0] - f) < np.linalg.norm(
            quantize_weights(other, "int4", group_size=2)[0].forward(held_out)[0] - f)


def test_bad_inputs_are_named():
    w = np.zeros((8, 3))
    with pytest.raises(ValueError, match="group_size=3 must be even and divide Din=8"):
        gptq_quantize(w, np.eye(8), group_size=3)
    with pytest.raises(ValueError, match=r"h must be \(Din, Din\) = \(8, 8\)"):
        gptq_quantize(w, np.eye(4), group_size=4)
    with pytest.raises(ValueError, match="damp must be >= 0"):
        gptq_quantize(w, np.eye(8), group_size=4, damp=-1)
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    with pytest.raises((ValueError, TypeError), match="calibration"):
        gptq_weights(model, np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"gptq_weights: layers.0.mixer.wq \(16, 16\): "
                                         r"gptq_quantize: group_size=6"):
        gptq_weights(model, np.zeros((2, 3), int), group_size=6)
