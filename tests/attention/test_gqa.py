"""Attention: masks, sdpa, GQA against independent references, causality, the Module."""
import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import (Attention, AttentionWeights, attention_sink_mask,
                                  block_sparse_mask, causal_mask, gqa_backward, gqa_forward,
                                  gqa_forward_ref, make_rope, mask_array, sdpa_backward,
                                  sdpa_forward, sliding_window_mask)
from scratchllm.attention import rope_frequencies
from scratchllm.specs import AttentionSpec, Mask, RopeSpec


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


def test_mask_array_builds_each_named_mask_for_the_last_queries():
    assert mask_array(None, 3, 5) is None and mask_array(Mask(causal=False), 3, 5) is None
    keep = np.ones((2, 1, 3, 5), bool)
    assert mask_array(Mask(array=keep), 3, 5) is keep
    for mask, full in [(Mask(), causal_mask(6)), (Mask(window=2), sliding_window_mask(6, 2)),
                       (Mask(window=2, n_sink=1), attention_sink_mask(6, 2, 1)),
                       (Mask(block=2, n_global=1), block_sparse_mask(6, 2, 1))]:
        np.testing.assert_array_equal(mask_array(mask, 6, 6), full)
        np.testing.assert_array_equal(mask_array(mask, 2, 6), full[4:])  # queries at 4, 5
    with pytest.raises(TypeError, match=r"^sdpa: mask must be a Mask or None, got ndarray; "
                                        r"an explicit boolean array goes in as Mask\(array"):
        mask_array(causal_mask(3), 3, 3, "sdpa")
    with pytest.raises(ValueError, match=r"needs Tq <= Tk; got Tq=4, Tk=3"):
        mask_array(Mask(), 4, 3)


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
    out, cache = sdpa_forward(q, k, v, Mask(array=mask))
    np.testing.assert_allclose(out, _sdpa_loop(q, k, v, mask), atol=1e-12)
    assert np.all(out[1, :, 3] == 0) and np.isfinite(out).all()
    g = sdpa_backward(rng.standard_normal(out.shape), cache)
    assert np.all(g["q"][1, :, 3] == 0)
    assert all(np.isfinite(a).all() for a in g.values())
    np.testing.assert_allclose(sdpa_forward(q, k, v, Mask())[0],  # queries at positions 2..5
                               _sdpa_loop(q, k, v, causal_mask(6)[2:]), atol=1e-12)


def test_grouped_sdpa_equals_repeated_kv():
    """K/V with Hkv = 2 heads for H = 6 queries == each KV head copied 3 times (per-head mask)."""
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 6, 4, 5)), rng.standard_normal((2, 2, 6, 5)),
               rng.standard_normal((2, 2, 6, 3)))
    mask = Mask(array=rng.random((2, 6, 4, 6)) < 0.6)
    out, cache = sdpa_forward(q, k, v, mask)
    k3, v3 = np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1)
    np.testing.assert_allclose(out, _sdpa_loop(q, k3, v3, mask.array), atol=1e-12)
    dout = rng.standard_normal(out.shape)
    g, g3 = sdpa_backward(dout, cache), sdpa_backward(dout, sdpa_forward(q, k3, v3, mask)[1])
    np.testing.assert_allclose(g["q"], g3["q"], atol=1e-12)
    for name in ("k", "v"):
        np.testing.assert_allclose(g[name], g3[name].reshape(2, 2, 3, 6, -1).sum(2), atol=1e-12)


def test_gqa_fast_path_equals_ref():
    rng = np.random.default_rng(8)
    x, w = rng.standard_normal((2, 7, 9)), _weights(rng, 9, 6, 2, 4)
    kw = dict(spec=AttentionSpec(6, 2, head_dim=4), mask=Mask(array=attention_sink_mask(7, 3, 1)))
    y, cache = gqa_forward(x, w, **kw)
    y_ref, cache_ref = gqa_forward_ref(x, w, **kw)
    np.testing.assert_allclose(y, y_ref, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    g, g_ref = gqa_backward(dy, cache), gqa_backward(dy, cache_ref)
    np.testing.assert_allclose(g["x"], g_ref["x"], atol=1e-10)
    for name in ("wq", "wk", "wv", "wo"):
        np.testing.assert_allclose(getattr(g["w"], name), getattr(g_ref["w"], name), atol=1e-10)


def test_sdpa_bad_inputs():
    q = np.zeros((1, 2, 3, 4))
    with pytest.raises(TypeError, match="bool"):
        sdpa_forward(q, q, q, mask=Mask(array=np.ones((3, 3))))
    with pytest.raises(TypeError, match="Mask"):
        sdpa_forward(q, q, q, mask=np.ones((3, 3), bool))
    with pytest.raises(ValueError, match="mask.array has shape"):
        sdpa_forward(q, q, q, mask=Mask(array=np.ones((4, 3), bool)))
    with pytest.raises(ValueError, match="k has shape"):
        sdpa_forward(q, np.zeros((1, 2, 3, 5)), q)
    with pytest.raises(ValueError, match="Hkv dividing H"):
        sdpa_forward(np.zeros((1, 3, 3, 4)), q, q)


def _weights(rng, D, H, Hkv, Dh):
    return AttentionWeights(rng.standard_normal((D, H * Dh)), rng.standard_normal((D, Hkv * Dh)),
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
    spec = AttentionSpec(H, Hkv, head_dim=Dh, rope=RopeSpec(100.0, style="interleaved"))
    y, _ = gqa_forward(x, w, spec=spec)
    np.testing.assert_allclose(y, _mha_reference(x, *w[:4], H, Hkv, inv_freq), atol=1e-10)


def test_gqa_equals_explicit_expansion():
    """Hkv = 2 of 6 equals MHA whose K/V weights repeat each KV head's columns G = 3 times."""
    rng = np.random.default_rng(3)
    B, T, D, H, Hkv, Dh = 2, 5, 7, 6, 2, 4
    x = rng.standard_normal((B, T, D))
    w = _weights(rng, D, H, Hkv, Dh)
    expand = lambda w: np.repeat(w.reshape(D, Hkv, 1, Dh), 3, axis=2).reshape(D, H * Dh)  # noqa
    spec = AttentionSpec(H, Hkv, head_dim=Dh, mask=Mask(window=3))
    y, cache = gqa_forward(x, w, spec=spec)
    y_full, cache_full = gqa_forward(x, w._replace(wk=expand(w.wk), wv=expand(w.wv)),
                                     spec=AttentionSpec(H, H, head_dim=Dh, mask=Mask(window=3)))
    np.testing.assert_allclose(y, y_full, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    g, g_full = gqa_backward(dy, cache), gqa_backward(dy, cache_full)
    np.testing.assert_allclose(g["x"], g_full["x"], atol=1e-10)
    for name in ("wq", "wo"):
        np.testing.assert_allclose(getattr(g["w"], name), getattr(g_full["w"], name), atol=1e-10)
    # the shared weight's gradient is the sum over the G copies
    group_sum = g_full["w"].wk.reshape(D, Hkv, 3, Dh).sum(axis=2).reshape(D, Hkv * Dh)
    np.testing.assert_allclose(g["w"].wk, group_sum, atol=1e-10)


@pytest.mark.parametrize("mask", [Mask(), Mask(window=2)])
def test_causality(mask):
    rng = np.random.default_rng(4)
    B, T, D, H, Hkv, Dh = 2, 8, 6, 4, 2, 4
    x, w = rng.standard_normal((B, T, D)), _weights(rng, D, H, Hkv, Dh)
    spec = AttentionSpec(H, Hkv, head_dim=Dh, mask=mask)
    y, _ = gqa_forward(x, w, spec=spec)
    x2 = x.copy()
    x2[:, 5] += 1.0  # change a future token
    y2, _ = gqa_forward(x2, w, spec=spec)
    np.testing.assert_array_equal(y[:, :5], y2[:, :5])
    assert np.abs(y[:, 5:] - y2[:, 5:]).max() > 1e-3
    y_open, _ = gqa_forward(x2, w, spec=spec, mask=Mask(causal=False))
    assert np.abs(y_open[:, :5] - y[:, :5]).max() > 1e-3  # without a mask the past does change


def test_gqa_bad_inputs_and_float32():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 3, 4)).astype(np.float32)
    w = AttentionWeights(*(a.astype(np.float32) for a in _weights(rng, 4, 4, 2, 2)[:4]))
    spec = AttentionSpec(4, 2, head_dim=2)
    y, cache = gqa_forward(x, w, spec=spec)
    assert y.dtype == np.float32
    g = gqa_backward(y, cache)
    assert g["x"].dtype == np.float32 and all(a.dtype == np.float32 for a in g["w"][:4])
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        AttentionSpec(4, 3)
    with pytest.raises(ValueError, match="wk has shape"):
        gqa_forward(x, w._replace(wk=w.wq), spec=spec)
    with pytest.raises(ValueError, match=r"^gqa: spec.qkv_bias=False, but w.bq is given"):
        gqa_forward(x, w._replace(bq=np.zeros(8, np.float32)), spec=spec)
    with pytest.raises(TypeError, match=r"^gqa: w must be an AttentionWeights, got tuple"):
        gqa_forward(x, tuple(w), spec=spec)


def test_attention_module_calls_the_pair():
    rng = np.random.default_rng(6)
    spec = AttentionSpec(4, 2, rope=RopeSpec(scaling={"rope_type": "linear", "factor": 2.0}))
    layer = Attention(8, spec, rng=rng, dtype=np.float64)
    assert [n for n, _ in layer.named_parameters()] == ["wq", "wk", "wv", "wo"]
    assert layer.spec is spec
    x, dy = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 5, 8))
    y, cache = layer.forward(x)
    rope = make_rope(spec.rope, 2, np.arange(5))
    np.testing.assert_array_equal(rope.inv_freq, rope_frequencies(
        2, scaling={"rope_type": "linear", "factor": 2.0})[0])
    w = AttentionWeights(layer.wq.data, layer.wk.data, layer.wv.data, layer.wo.data)
    want, want_cache = gqa_forward(x, w, spec=spec, rope=rope)
    np.testing.assert_array_equal(y, want)
    g = gqa_backward(dy, want_cache)
    for _ in range(2):  # gradients accumulate
        dx = layer.backward(dy, cache)
    np.testing.assert_array_equal(dx, g["x"])
    np.testing.assert_allclose(layer.wk.grad, 2 * g["w"].wk)
