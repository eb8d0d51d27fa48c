"""Llama 4's attention options: the chunked causal mask (keys of the query's own chunk only),
its decoding (per-row positions included), and the weightless L2 QK-norm (no Params; the
same before or after RoPE)."""
import numpy as np
import pytest

from scratchllm.attention import (Attention, KVState, chunked_causal_mask, flash_sdpa_forward,
                                  make_rope, mask_array, rope_forward)
from scratchllm.specs import AttentionSpec, Mask, RopeSpec, ScoresSpec


def test_chunked_mask():
    m = chunked_causal_mask(5, 2).astype(int)  # chunks {0, 1} {2, 3} {4}
    assert m.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0],
                          [0, 0, 1, 1, 0], [0, 0, 0, 0, 1]]
    np.testing.assert_array_equal(mask_array(Mask(chunk=2), 2, 5), m[3:])
    for bad in (dict(chunk=2, window=3), dict(chunk=2, causal=False), dict(chunk=0)):
        with pytest.raises(ValueError, match="chunk"):
            Mask(**bad)
    with pytest.raises(ValueError, match="impl='sdpa', and so do chunks"):
        AttentionSpec(mask=Mask(chunk=2), scores=ScoresSpec("flash"))
    q = np.zeros((1, 1, 3, 4))
    with pytest.raises(ValueError, match="sdpa_forward, and so do chunks"):
        flash_sdpa_forward(q, q, q, mask=Mask(chunk=2))


def test_chunked_decoding_equals_the_forward_rows():
    """Decoding token by token (one int position, then per-row positions of rows that
    started at different steps) gives the full forward's rows."""
    rng = np.random.default_rng(0)
    spec = AttentionSpec(4, 2, qk_norm="l2", rope=RopeSpec(style="interleaved"),
                         mask=Mask(chunk=3))
    layer = Attention(8, spec, rng=rng, dtype=np.float64)
    x = rng.standard_normal((2, 7, 8))
    full, _ = layer.forward(x)
    state = layer.init_state(2, 7)
    assert isinstance(state, KVState)
    steps = [layer.decode(x[:, t], state, t) for t in range(7)]
    np.testing.assert_allclose(np.stack(steps, 1), full, rtol=0, atol=1e-12)
    state = layer.init_state(2, 7)  # row 1 starts two steps later
    for t in range(7):
        pos = np.array([t, max(t - 2, 0)])
        y = layer.decode(np.stack([x[0, t], x[1, max(t - 2, 0)]]), state, pos)
        np.testing.assert_allclose(y[0], full[0, t], rtol=0, atol=1e-12)
        np.testing.assert_allclose(y[1], full[1, max(t - 2, 0)], rtol=0, atol=1e-12)


def test_l2_qk_norm_has_no_params_and_commutes_with_rope():
    rng = np.random.default_rng(1)
    spec = AttentionSpec(4, 2, qk_norm="l2", rope=RopeSpec(style="interleaved"))
    layer = Attention(8, spec, rng=rng, dtype=np.float64)
    assert [n for n, _ in layer.named_parameters()] == ["wq", "wk", "wv", "wo"]
    assert spec.n_params(8) == 4 * 8 * 8 - 2 * 8 * 4  # wq, wo (8x8), wk, wv (8x4)
    q = rng.standard_normal((1, 2, 5, 6))
    rope = make_rope(spec.rope, 6, np.arange(5))
    rms = lambda a: a / np.sqrt(np.mean(a * a, -1, keepdims=True) + 1e-6)  # noqa: E731
    np.testing.assert_allclose(rope_forward(rms(q), rope)[0], rms(rope_forward(q, rope)[0]),
                               rtol=0, atol=1e-14)
    y, cache = layer.forward(rng.standard_normal((2, 5, 8)))
    layer.backward(np.ones_like(y), cache)  # no gain gradients to accumulate
    assert layer.wq.grad is not None
