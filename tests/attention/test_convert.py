"""mha_to_gqa: the pooled heads are the group means, and the output test catches the wrong
grouping (tile instead of repeat_interleave)."""
import numpy as np
import pytest

from scratchllm.attention import AttentionWeights, gqa_forward, mha_to_gqa
from scratchllm.specs import AttentionSpec

B, T, D, H, Hkv, Dh = 2, 7, 10, 6, 2, 4


def _pool_tiled(w):
    """The wrong grouping: KV head j pools heads j, j + Hkv, j + 2 Hkv, ..."""
    return w.reshape(D, H // Hkv, Hkv, Dh).mean(axis=1).reshape(D, Hkv * Dh)


def test_pooled_head_is_the_mean_of_its_group():
    rng = np.random.default_rng(0)
    wk, wv = rng.standard_normal((D, H * Dh)), rng.standard_normal((D, H * Dh))
    gk, gv = mha_to_gqa(wk, wv, H, Hkv)
    assert gk.shape == gv.shape == (D, Hkv * Dh)
    G = H // Hkv
    for j in range(Hkv):
        heads = [slice(h * Dh, (h + 1) * Dh) for h in range(j * G, (j + 1) * G)]
        np.testing.assert_allclose(gk[:, j * Dh:(j + 1) * Dh],
                                   sum(wk[:, s] for s in heads) / G, rtol=1e-14)
        np.testing.assert_allclose(gv[:, j * Dh:(j + 1) * Dh],
                                   sum(wv[:, s] for s in heads) / G, rtol=1e-14)


def test_output_detects_the_wrong_grouping():
    """An MHA model whose heads are already equal within each group: pooling is lossless,
    so the GQA model must reproduce the MHA output; the tiled grouping does not."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, T, D))
    wq, wo = rng.standard_normal((D, H * Dh)), rng.standard_normal((H * Dh, D))
    base_k, base_v = rng.standard_normal((D, Hkv, Dh)), rng.standard_normal((D, Hkv, Dh))
    wk = np.repeat(base_k, H // Hkv, axis=1).reshape(D, H * Dh)  # head h = KV head h // G
    wv = np.repeat(base_v, H // Hkv, axis=1).reshape(D, H * Dh)
    mha, _ = gqa_forward(x, AttentionWeights(wq, wk, wv, wo),
                         spec=AttentionSpec(H, H, head_dim=Dh, rope=None))
    gk, gv = mha_to_gqa(wk, wv, H, Hkv)
    gqa_spec = AttentionSpec(H, Hkv, head_dim=Dh, rope=None)
    gqa, _ = gqa_forward(x, AttentionWeights(wq, gk, gv, wo), spec=gqa_spec)
    np.testing.assert_allclose(gqa, mha, rtol=0, atol=1e-12)
    wrong, _ = gqa_forward(x, AttentionWeights(wq, _pool_tiled(wk), _pool_tiled(wv), wo),
                           spec=gqa_spec)
    assert np.abs(wrong - mha).max() > 1e-2


def test_bad_grouping_is_an_error():
    w = np.zeros((D, H * Dh))
    with pytest.raises(ValueError, match="mha_to_gqa: n_heads=6 must be a multiple"):
        mha_to_gqa(w, w, H, 4)
