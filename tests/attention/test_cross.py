"""Cross-attention: an independent per-query loop, gradients, padding, the Module."""
import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import (AttentionWeights, CrossAttention, cross_attention_backward,
                                  cross_attention_forward)
from scratchllm.specs import AttentionSpec, Mask


def cross_spec(H, Hkv):
    return AttentionSpec(H, Hkv, rope=None, mask=Mask(causal=False))


def test_gradient_check():
    for report in CASES["cross_attention"](np.random.default_rng(0)):
        assert report.ok, str(report)


def _loop(x, ctx, wq, wk, wv, wo, H, Hkv, keep):
    """Per batch, head and query: explicit softmax over the kept context positions."""
    B, Tq, _ = x.shape
    Dh = wq.shape[1] // H
    heads = np.zeros((B, Tq, H * Dh))
    for b, h, i in np.ndindex(B, H, Tq):
        j = h // (H // Hkv)
        qv = x[b, i] @ wq[:, h * Dh:(h + 1) * Dh]
        K = ctx[b] @ wk[:, j * Dh:(j + 1) * Dh]
        V = ctx[b] @ wv[:, j * Dh:(j + 1) * Dh]
        s = (K @ qv) / np.sqrt(Dh)
        s = np.where(keep[b], s, -np.inf)
        p = np.exp(s - s.max())
        heads[b, i, h * Dh:(h + 1) * Dh] = (p / p.sum()) @ V
    return heads @ wo


def test_matches_a_per_query_loop_with_padding():
    rng = np.random.default_rng(1)
    B, Tq, Tk, D, Dc, H, Hkv = 2, 3, 6, 8, 5, 4, 2
    x, ctx = rng.standard_normal((B, Tq, D)), rng.standard_normal((B, Tk, Dc))
    w = AttentionWeights(rng.standard_normal((D, 8)), rng.standard_normal((Dc, 4)),
                         rng.standard_normal((Dc, 4)), rng.standard_normal((8, D)))
    keep = np.arange(Tk)[None, :] < np.array([[6], [2]])  # (B, Tk): the second is padded
    pad = Mask(array=keep[:, None, None, :])
    y, _ = cross_attention_forward(x, ctx, w, spec=cross_spec(H, Hkv), mask=pad)
    np.testing.assert_allclose(y, _loop(x, ctx, *w[:4], H, Hkv, keep), atol=1e-12)
    ctx2 = ctx.copy()
    ctx2[1, 2:] = 100.0  # padded positions cannot change the output
    y2, _ = cross_attention_forward(x, ctx2, w, spec=cross_spec(H, Hkv), mask=pad)
    np.testing.assert_allclose(y2[1], y[1], atol=1e-12)


def test_module_returns_both_input_gradients_and_adds_param_grads():
    rng = np.random.default_rng(2)
    m = CrossAttention(8, cross_spec(4, 2), d_context=6, rng=rng, dtype=np.float64)
    x, ctx = rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 5, 6))
    y, cache = m.forward(x, ctx)
    dy = rng.standard_normal(y.shape)
    got = m.backward(dy, cache)
    want = cross_attention_backward(dy, cache)
    assert sorted(got) == ["ctx", "x"]
    for name in ("x", "ctx"):
        np.testing.assert_array_equal(got[name], want[name])
    for name in ("wq", "wk", "wv", "wo"):
        np.testing.assert_array_equal(getattr(m, name).grad, getattr(want["w"], name))


def test_a_causal_or_positioned_spec_is_refused():
    with pytest.raises(ValueError, match=r"^CrossAttention: spec.mask=.* is causal; "
                                         r"cross-attention reads the whole context"):
        CrossAttention(8, AttentionSpec(4, 2, rope=None), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"^CrossAttention: spec has rope=RopeSpec"):
        CrossAttention(8, AttentionSpec(4, 2, mask=Mask(causal=False)),
                       rng=np.random.default_rng(0))
