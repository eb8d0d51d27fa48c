"""Attention: masks, sdpa, GQA against independent references, causality, the Module."""
import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import (Attention, attention_sink_mask, block_sparse_mask,
                                  causal_mask, gqa_backward, gqa_forward, gqa_forward_ref,
                                  sdpa_backward, sdpa_forward, sliding_window_mask)
from scratchllm.attention import rope_frequencies


@pytest.mark.parametrize("name", ["sdpa", "gqa"])
def test_gradient_check(name):
    for report in CASES[name](np.random.default_rng(0)):
        assert report.ok, str(report)


def test_masks():
    assert causal_mask(3).tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    sw = sliding_window_mask(5, 2).astype(int)
    assert sw.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0],
                           [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    sink = attention_sink_mask(5, 2, 1).astype(int)
    assert sink.tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0],
                             [1, 0, 1, 1, 0], [1, 0, 0, 1, 1]]
    bs = block_sparse_mask(6, 2, global_tokens=1).astype(int)  # blocks {0,1} {2,3} {4,5}
    assert bs.tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0],
                           [1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 0], [1, 0, 1, 1, 1, 1]]
    assert sliding_window_mask(6, 6).tolist() == causal_mask(6).tolist()


def _sdpa_loop(q, k, v, mask):
    """Independent reference: one query row at a time, explicit exp and sum."""
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    mask = np.broadcast_to(mask, q.shape[:-1] + (k.shape[2],))
    for b, h, i in np.ndindex(*q.shape[:-1]):
        keep = mask[b, h, i]
        if keep.any():
            s = k[b, h, keep] @ q[b, h, i] / np.sqrt(q.shape[-1])
            w = np.exp(s - s.max())
            out[b, h, i] = (w / w.sum()) @ v[b, h, keep]
    return out


def test_sdpa_matches_loop_and_zeroes_fully_masked_rows():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 6, 5)),
               rng.standard_normal((2, 3, 6, 7)))
    mask = rng.random((2, 1, 4, 6)) < 0.5
    mask[1, 0, 3] = False
    out, cache = sdpa_forward(q, k, v, mask)
    np.testing.assert_allclose(out, _sdpa_loop(q, k, v, mask), atol=1e-12)
    assert np.all(out[1, :, 3] == 0) and np.isfinite(out).all()
    g = sdpa_backward(rng.standard_normal(out.shape), cache)
    assert np.all(g["q"][1, :, 3] == 0)
    assert all(np.isfinite(a).all() for a in g.values())
    np.testing.assert_allclose(sdpa_forward(q, k, v, causal_mask(6)[2:])[0],
                               _sdpa_loop(q, k, v, causal_mask(6)[2:]), atol=1e-12)


def test_grouped_sdpa_equals_repeated_kv():
    """K/V with Hkv = 2 heads for H = 6 queries == each KV head copied 3 times (per-head mask)."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 6, 4, 5)), rng.standard_normal((2, 2, 6, 5)),
               rng.standard_normal((2, 2, 6, 3)))
    mask = rng.random((2, 6, 4, 6)) < 0.6
    out, cache = sdpa_forward(q, k, v, mask)
    k3, v3 = np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1)
    np.testing.assert_allclose(out, _sdpa_loop(q, k3, v3, mask), atol=1e-12)
    dout = rng.standard_normal(out.shape)
    g, g3 = sdpa_backward(dout, cache), sdpa_backward(dout, sdpa_forward(q, k3, v3, mask)[1])
    np.testing.assert_allclose(g["q"], g3["q"], atol=1e-12)
    for name in ("k", "v"):
        np.testing.assert_allclose(g[name], g3[name].reshape(2, 2, 3, 6, -1).sum(2), atol=1e-12)


def test_gqa_fast_path_equals_ref():
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((2, 7, 9)), _weights(rng, 9, 6, 2, 4)
    kw = dict(n_heads=6, n_kv_heads=2, inv_freq=rope_frequencies(4)[0],
              mask=attention_sink_mask(7, 3, 1))
    y, cache = gqa_forward(x, *w, **kw)
    y_ref, cache_ref = gqa_forward_ref(x, *w, **kw)
    np.testing.assert_allclose(y, y_ref, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    g, g_ref = gqa_backward(dy, cache), gqa_backward(dy, cache_ref)
    for name in ("x", "wq", "wk", "wv", "wo"):
        np.testing.assert_allclose(g[name], g_ref[name], atol=1e-10)


def test_sdpa_bad_inputs():
    q = np.zeros((1, 2, 3, 4))
    with pytest.raises(TypeError, match="bool"):
        sdpa_forward(q, q, q, mask=np.ones((3, 3)))
    with pytest.raises(ValueError, match="mask has shape"):
        sdpa_forward(q, q, q, mask=np.ones((4, 3), bool))
    with pytest.raises(ValueError, match="k has shape"):
        sdpa_forward(q, np.zeros((1, 2, 3, 5)), q)
    with pytest.raises(ValueError, match="Hkv dividing H"):
        sdpa_forward(np.zeros((1, 3, 3, 4)), q, q)


def _weights(rng, D, H, Hkv, Dh):
    return (rng.standard_normal((D, H * Dh)), rng.standard_normal((D, Hkv * Dh)),
            rng.standard_normal((D, Hkv * Dh)), rng.standard_normal((H * Dh, D)))


def _mha_reference(x, wq, wk, wv, wo, H, Hkv, inv_freq):
    """Independent per-head loop: complex (Meta-style) rotary, head h reads kv head h*Hkv//H,
    explicit causal softmax."""
    B, T, D = x.shape
    Dh = wq.shape[1] // H
    rot = np.exp(1j * np.outer(np.arange(T), inv_freq))  # (T, Dh/2)

    def rope(t):  # (T, Dh), pairs (2i, 2i+1) as complex numbers
        z = (t[:, 0::2] + 1j * t[:, 1::2]) * rot
        return np.stack([z.real, z.imag], -1).reshape(T, Dh)

    y = np.zeros_like(x)
    for b in range(B):
        heads = []
        for h in range(H):
            j = h * Hkv // H
            q = rope(x[b] @ wq[:, h * Dh:(h + 1) * Dh])
            k = rope(x[b] @ wk[:, j * Dh:(j + 1) * Dh])
            v = x[b] @ wv[:, j * Dh:(j + 1) * Dh]
            s = q @ k.T / np.sqrt(Dh) + np.triu(np.full((T, T), -np.inf), 1)
            p = np.exp(s - s.max(1, keepdims=True))
            heads.append((p / p.sum(1, keepdims=True)) @ v)
        y[b] = np.concatenate(heads, axis=1) @ wo
    return y


@pytest.mark.parametrize("H, Hkv", [(4, 4), (4, 1), (6, 2)])  # MHA, MQA, GQA
def test_gqa_matches_independent_reference(H, Hkv):
    rng = np.random.default_rng(2)
    B, T, D, Dh = 2, 7, 9, 6
    x, w = rng.standard_normal((B, T, D)), _weights(rng, D, H, Hkv, Dh)
    inv_freq, _ = rope_frequencies(Dh, base=100.0)
    y, _ = gqa_forward(x, *w, n_heads=H, n_kv_heads=Hkv, inv_freq=inv_freq,
                       rope_style="interleaved")
    np.testing.assert_allclose(y, _mha_reference(x, *w, H, Hkv, inv_freq), atol=1e-10)


def test_gqa_equals_explicit_expansion():
    """Hkv = 2 of 6 equals MHA whose K/V weights repeat each KV head's columns G = 3 times."""
    rng = np.random.default_rng(3)
    B, T, D, H, Hkv, Dh = 2, 5, 7, 6, 2, 4
    x = rng.standard_normal((B, T, D))
    wq, wk, wv, wo = _weights(rng, D, H, Hkv, Dh)
    expand = lambda w: np.repeat(w.reshape(D, Hkv, 1, Dh), 3, axis=2).reshape(D, H * Dh)  # noqa
    inv_freq, _ = rope_frequencies(Dh)
    kw = dict(n_heads=H, inv_freq=inv_freq, mask="sliding", window=3)
    y, cache = gqa_forward(x, wq, wk, wv, wo, n_kv_heads=Hkv, **kw)
    y_full, cache_full = gqa_forward(x, wq, expand(wk), expand(wv), wo, n_kv_heads=H, **kw)
    np.testing.assert_allclose(y, y_full, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    g, g_full = gqa_backward(dy, cache), gqa_backward(dy, cache_full)
    for name in ("x", "wq", "wo"):
        np.testing.assert_allclose(g[name], g_full[name], atol=1e-10)
    # the shared weight's gradient is the sum over the G copies
    group_sum = g_full["wk"].reshape(D, Hkv, 3, Dh).sum(axis=2).reshape(D, Hkv * Dh)
    np.testing.assert_allclose(g["wk"], group_sum, atol=1e-10)


@pytest.mark.parametrize("mask, window", [("causal", None), ("sliding", 2)])
def test_causality(mask, window):
    rng = np.random.default_rng(4)
    B, T, D, H, Hkv, Dh = 2, 8, 6, 4, 2, 4
    x, w = rng.standard_normal((B, T, D)), _weights(rng, D, H, Hkv, Dh)
    kw = dict(n_heads=H, n_kv_heads=Hkv, inv_freq=rope_frequencies(Dh)[0], mask=mask,
              window=window)
    y, _ = gqa_forward(x, *w, **kw)
    x2 = x.copy()
    x2[:, 5] += 1.0  # change a future token
    y2, _ = gqa_forward(x2, *w, **kw)
    np.testing.assert_array_equal(y[:, :5], y2[:, :5])
    assert np.abs(y[:, 5:] - y2[:, 5:]).max() > 1e-3
    y_open, _ = gqa_forward(x2, *w, **{**kw, "mask": None, "window": None})
    assert np.abs(y_open[:, :5] - y[:, :5]).max() > 1e-3  # without a mask the past does change


def test_gqa_bad_inputs_and_float32():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 4)).astype(np.float32)
    w = [a.astype(np.float32) for a in _weights(rng, 4, 4, 2, 2)]
    y, cache = gqa_forward(x, *w, n_heads=4, n_kv_heads=2, inv_freq=rope_frequencies(2)[0])
    assert y.dtype == np.float32
    assert all(a.dtype == np.float32 for a in gqa_backward(y, cache).values())
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        gqa_forward(x, *w, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="wk has shape"):
        gqa_forward(x, w[0], w[0], w[2], w[3], n_heads=4, n_kv_heads=2)
    with pytest.raises(ValueError, match="window"):
        gqa_forward(x, *w, n_heads=4, n_kv_heads=2, mask="sliding")


def test_attention_module_calls_the_pair():
    rng = np.random.default_rng(6)
    layer = Attention(8, 4, 2, rng=rng, dtype=np.float64,
                      rope_scaling={"rope_type": "linear", "factor": 2.0})
    assert [n for n, _ in layer.named_parameters()] == ["wq", "wk", "wv", "wo"]
    x, dy = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    y, cache = layer.forward(x)
    inv_freq, _ = rope_frequencies(2, scaling={"rope_type": "linear", "factor": 2.0})
    want, want_cache = gqa_forward(x, layer.wq.data, layer.wk.data, layer.wv.data,
                                   layer.wo.data, n_heads=4, n_kv_heads=2, inv_freq=inv_freq)
    np.testing.assert_array_equal(y, want)
    g = gqa_backward(dy, want_cache)
    for _ in range(2):  # gradients accumulate
        dx = layer.backward(dy, cache)
    np.testing.assert_array_equal(dx, g["x"])
    np.testing.assert_allclose(layer.wk.grad, 2 * g["wk"])
