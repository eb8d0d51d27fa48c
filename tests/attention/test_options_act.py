"""Every attention option acts or is an error (none is silently ignored): a window with the
default mask slides (and Attention's rolling decode then equals its forward), a window with an
explicit or no mask is refused, positions / rope_style without RoPE are refused, and T = 0 is
a clear error in gqa, sdpa, mla and the LM."""
import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.attention import (Attention, gqa_forward, mla_forward, rope_frequencies,
                                  sdpa_forward, sliding_window_mask)
from scratchllm.lm import LM

B, T, D, H, HKV, DH = 2, 9, 8, 4, 2, 2


def _setup(seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((D, H * DH)), rng.standard_normal((D, HKV * DH)),
         rng.standard_normal((D, HKV * DH)), rng.standard_normal((H * DH, D)))
    return rng.standard_normal((B, T, D)), w


def test_a_window_with_the_default_mask_slides():
    x, w = _setup()
    kw = dict(n_heads=H, n_kv_heads=HKV, inv_freq=rope_frequencies(DH)[0])
    y, _ = gqa_forward(x, *w, window=4, **kw)
    want, _ = gqa_forward(x, *w, mask=sliding_window_mask(T, 4), **kw)
    causal, _ = gqa_forward(x, *w, **kw)
    np.testing.assert_allclose(y, want, atol=1e-12)
    assert np.abs(y[:, 4:] - causal[:, 4:]).max() > 1e-3  # the window acted


def test_attention_with_a_window_decodes_what_it_forwards():
    """Attention(window=4) used to attend causally in forward but decode through a rolling
    state: max |diff| 1.14. Now both slide."""
    rng = np.random.default_rng(1)
    layer = Attention(D, H, HKV, rng=rng, window=4, dtype=np.float64)
    x = rng.standard_normal((B, T, D))
    y, _ = layer.forward(x)
    state = layer.init_state(B, T)
    y_dec = np.stack([layer.decode(x[:, t], state, t) for t in range(T)], axis=1)
    np.testing.assert_allclose(y_dec, y, atol=1e-12)


@pytest.mark.parametrize("mask", [None, "none", sliding_window_mask(T, 3)])
def test_a_window_with_another_mask_is_an_error(mask):
    x, w = _setup()
    with pytest.raises(ValueError, match=r"^gqa: window=4 has no effect with mask=(None|'none'|"
                                         r"a mask array); give"):
        gqa_forward(x, *w, n_heads=H, n_kv_heads=HKV, mask=mask, window=4)


@pytest.mark.parametrize("kwargs", [dict(positions=np.arange(T)), dict(rope_style="interleaved"),
                                    dict(attention_factor=1.2)])
def test_rope_options_without_rope_are_an_error(kwargs):
    x, w = _setup()
    with pytest.raises(ValueError, match=r"^gqa: positions, rope_style and attention_factor "
                                         r"act only through RoPE"):
        gqa_forward(x, *w, n_heads=H, n_kv_heads=HKV, **kwargs)
    with pytest.raises(ValueError, match=r"^Attention: .* act only through RoPE"):
        Attention(D, H, HKV, rng=np.random.default_rng(0), use_rope=False,
                  rope_style="interleaved")


def test_attention_without_rope_still_runs_and_a_non_causal_one_cannot_decode():
    rng = np.random.default_rng(2)
    layer = Attention(D, H, HKV, rng=rng, use_rope=False, dtype=np.float64)
    x = rng.standard_normal((B, T, D))
    y, _ = layer.forward(x)
    state = layer.init_state(B, T)
    y_dec = np.stack([layer.decode(x[:, t], state, t) for t in range(T)], axis=1)
    np.testing.assert_allclose(y_dec, y, atol=1e-12)
    with pytest.raises(ValueError, match=r"Attention.init_state: decoding is causal"):
        Attention(D, H, HKV, rng=rng, mask="none").init_state(B, T)


def test_zero_time_steps_are_a_clear_error():
    x, w = _setup()
    with pytest.raises(ValueError, match=r"^gqa: x has shape \(2, 0, 8\): no time steps"):
        gqa_forward(x[:, :0], *w, n_heads=H, n_kv_heads=HKV)
    q = np.ones((1, 2, 0, 4))
    with pytest.raises(ValueError, match=r"^sdpa: q has 0 and k has 3 positions"):
        sdpa_forward(q, np.ones((1, 2, 3, 4)), np.ones((1, 2, 3, 4)))
    with pytest.raises(ValueError, match=r"^mla_forward: x has shape \(1, 0, 8\)"):
        mla_forward(np.ones((1, 0, 8)), *[None] * 4, n_heads=2)
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"^LM: ids has shape \(1, 0\): no tokens"):
        model.loss(np.zeros((1, 0), dtype=np.int64), np.zeros((1, 0), dtype=np.int64))
