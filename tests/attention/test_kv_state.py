"""Decoding states: one token at a time equals the full forward; the rolling state; bytes."""
import numpy as np
import pytest

from scratchllm.attention import Attention, AttentionWeights, gqa_forward
from scratchllm.attention import KVState, RollingKVState, Rope, gqa_decode, rope_frequencies
from scratchllm.specs import AttentionSpec, Mask, RopeSpec

B, T, D, H, HKV, DH = 2, 11, 10, 6, 2, 4


def _setup(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, T, D))
    w = AttentionWeights(rng.standard_normal((D, H * DH)), rng.standard_normal((D, HKV * DH)),
                         rng.standard_normal((D, HKV * DH)), rng.standard_normal((H * DH, D)))
    return x, w


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_decode_equals_full_causal_forward(style):
    x, w = _setup()
    spec = AttentionSpec(H, HKV, head_dim=DH, rope=RopeSpec(style=style))
    rope = Rope(rope_frequencies(DH)[0], style, 1.1, np.arange(T))  # an attention factor
    y_full, _ = gqa_forward(x, w, spec=spec, rope=rope)
    cache = KVState(B, HKV, DH, max_len=T, dtype=np.float64)
    y_dec = np.stack([gqa_decode(x[:, t], w, cache, t, spec=spec,
                                 rope=rope._replace(positions=np.array([t])))
                      for t in range(T)], axis=1)
    np.testing.assert_allclose(y_dec, y_full, rtol=0, atol=1e-12)
    assert cache.length == T


def test_full_cache_raises_clear_error():
    x, w = _setup()
    cache = KVState(B, HKV, DH, max_len=2, dtype=np.float64)
    spec = AttentionSpec(H, HKV, head_dim=DH, rope=None)
    for t in range(2):
        gqa_decode(x[:, t], w, cache, t, spec=spec)
    with pytest.raises(ValueError, match=r"KVState is full.*max_len=2"):
        gqa_decode(x[:, 2], w, cache, 2, spec=spec)
    with pytest.raises(ValueError, match="k has shape"):
        cache.append(np.zeros((B, HKV + 1, 1, DH)), np.zeros((B, HKV + 1, 1, DH)))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cache_bytes_per_token_per_layer(dtype):
    cache = KVState(3, HKV, DH, max_len=50, dtype=dtype)
    per_token = 2 * HKV * DH * np.dtype(dtype).itemsize  # K and V, each Hkv * Dh numbers
    assert cache.nbytes == 3 * 50 * per_token
    rolling = RollingKVState(window=8, n_sink=2, batch=3, n_kv_heads=HKV, head_dim=DH,
                             dtype=dtype)
    before = rolling.nbytes
    rolling.append(np.zeros((3, HKV, 40, DH), dtype), np.zeros((3, HKV, 40, DH), dtype))
    assert rolling.nbytes == before == 3 * (8 + 2) * per_token  # O(window), not O(T)


@pytest.mark.parametrize("window, n_sink", [(4, 2), (3, 0), (5, 1)])
def test_rolling_cache_equals_sink_window_attention(window, n_sink):
    x, w = _setup(1)
    spec = AttentionSpec(H, HKV, head_dim=DH, mask=Mask(window=window, n_sink=n_sink))
    y_full, _ = gqa_forward(x, w, spec=spec)
    cache = RollingKVState(window, n_sink, B, HKV, DH, dtype=np.float64)
    for t in range(T):
        y_t = gqa_decode(x[:, t], w, cache, t, spec=spec)
        np.testing.assert_allclose(y_t, y_full[:, t], rtol=0, atol=1e-12)
        assert cache.kv()[0].shape[2] == min(t + 1, window + n_sink)
    y_causal, _ = gqa_forward(x, w, spec=spec, mask=Mask())
    assert np.abs(y_causal[:, -1] - y_full[:, -1]).max() > 1e-6  # the window does cut


def test_module_decode_matches_forward():
    rng = np.random.default_rng(2)
    layer = Attention(D, AttentionSpec(H, HKV, head_dim=DH), rng=rng, dtype=np.float64)
    x = rng.standard_normal((B, T, D))
    y, _ = layer.forward(x)
    cache = KVState(B, HKV, layer.head_dim, max_len=T, dtype=np.float64)
    y_dec = np.stack([layer.decode(x[:, t], cache, t) for t in range(T)], axis=1)
    np.testing.assert_allclose(y_dec, y, rtol=0, atol=1e-12)
