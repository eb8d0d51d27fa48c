"""Every attention option acts or is an error (none is silently ignored): a window in the mask
slides (and Attention's rolling decode then equals its forward), a window or sinks beside a
mask that would ignore them are refused, a Rope or positions without RoPE are refused, and
T = 0 is a clear error in gqa, sdpa, mla and the LM."""
import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.attention import (Attention, AttentionWeights, MLAWeights, gqa_forward,
                                  make_rope, mla_forward, sdpa_forward, sliding_window_mask)
from scratchllm.lm import LM
from scratchllm.specs import AttentionSpec, Mask, MLASpec, RopeSpec

B, T, D, H, HKV, DH = 2, 9, 8, 4, 2, 2


def _setup(seed=0):
    rng = np.random.default_rng(seed)
    w = AttentionWeights(rng.standard_normal((D, H * DH)), rng.standard_normal((D, HKV * DH)),
                         rng.standard_normal((D, HKV * DH)), rng.standard_normal((H * DH, D)))
    return rng.standard_normal((B, T, D)), w


def test_a_window_in_the_mask_slides():
    x, w = _setup()
    y, _ = gqa_forward(x, w, spec=AttentionSpec(H, HKV, mask=Mask(window=4)))
    want, _ = gqa_forward(x, w, spec=AttentionSpec(H, HKV),
                          mask=Mask(array=sliding_window_mask(T, 4)))
    causal, _ = gqa_forward(x, w, spec=AttentionSpec(H, HKV))
    np.testing.assert_allclose(y, want, atol=1e-12)
    assert np.abs(y[:, 4:] - causal[:, 4:]).max() > 1e-3  # the window acted


def test_attention_with_a_window_decodes_what_it_forwards():
    """Attention(window=4) used to attend causally in forward but decode through a rolling
    state: max |diff| 1.14. Now both slide."""
    rng = np.random.default_rng(1)
    layer = Attention(D, AttentionSpec(H, HKV, mask=Mask(window=4)), rng=rng, dtype=np.float64)
    x = rng.standard_normal((B, T, D))
    y, _ = layer.forward(x)
    state = layer.init_state(B, T)
    y_dec = np.stack([layer.decode(x[:, t], state, t) for t in range(T)], axis=1)
    np.testing.assert_allclose(y_dec, y, atol=1e-12)


@pytest.mark.parametrize("kwargs, match", [
    (dict(causal=False, window=4), r"^Mask: window=4 needs causal=True"),
    (dict(array=sliding_window_mask(T, 3), window=4), r"^Mask: array excludes window"),
    (dict(n_sink=2), r"^Mask: n_sink=2 keeps sink tokens beside a window")])
def test_a_window_or_sinks_another_mask_would_ignore_are_an_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Mask(**kwargs)


def test_rope_without_a_rope_spec_is_an_error():
    x, w = _setup()
    rope = make_rope(RopeSpec(), DH, np.arange(T))
    with pytest.raises(ValueError, match=r"^gqa: rope is given, but spec.rope is None"):
        gqa_forward(x, w, spec=AttentionSpec(H, HKV, rope=None), rope=rope)
    layer = Attention(D, AttentionSpec(H, HKV, rope=None), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"^Attention.forward: positions act only through RoPE"):
        layer.forward(x.astype(np.float32), positions=np.arange(T))


def test_attention_without_rope_still_runs_and_a_non_causal_one_cannot_decode():
    rng = np.random.default_rng(2)
    layer = Attention(D, AttentionSpec(H, HKV, rope=None), rng=rng, dtype=np.float64)
    x = rng.standard_normal((B, T, D))
    y, _ = layer.forward(x)
    state = layer.init_state(B, T)
    y_dec = np.stack([layer.decode(x[:, t], state, t) for t in range(T)], axis=1)
    np.testing.assert_allclose(y_dec, y, atol=1e-12)
    with pytest.raises(ValueError, match=r"Attention.init_state: decoding keeps the keys of a "
                                         r"causal mask"):
        Attention(D, AttentionSpec(H, HKV, mask=Mask(causal=False)),
                  rng=rng).init_state(B, T)


def test_zero_time_steps_are_a_clear_error():
    x, w = _setup()
    with pytest.raises(ValueError, match=r"^gqa: x has shape \(2, 0, 8\): no time steps"):
        gqa_forward(x[:, :0], w, spec=AttentionSpec(H, HKV))
    q = np.ones((1, 2, 0, 4))
    with pytest.raises(ValueError, match=r"^sdpa: q has 0 and k has 3 positions"):
        sdpa_forward(q, np.ones((1, 2, 3, 4)), np.ones((1, 2, 3, 4)))
    with pytest.raises(ValueError, match=r"^mla_forward: x has shape \(1, 0, 8\)"):
        mla_forward(np.ones((1, 0, 8)), MLAWeights(*[None] * 4), spec=MLASpec(n_heads=2))
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"^LM: ids has shape \(1, 0\): no tokens"):
        model.loss(np.zeros((1, 0), dtype=np.int64), np.zeros((1, 0), dtype=np.int64))
