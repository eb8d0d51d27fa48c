"""DeepSeek-V3.2's sparse attention inside MLA: the indexer's choice is topk_select of the
lightning indexer's scores; the training form equals dense MLA under the mask of the chosen
keys; decoding (absorbed and naive, per-row positions) equals the forward's rows; the
indexer's weights get zero gradient."""
import dataclasses

import numpy as np
import pytest

from scratchllm.attention import MLA, LatentKVState, mla_forward
from scratchllm.attention.dsa import IndexedLatentState, indexer_select
from scratchllm.attention.rope import make_rope
from scratchllm.specs import IndexerSpec, Mask, MLASpec, RopeSpec

SPEC = MLASpec(4, 6, 8, 4, 4, 5, rope=RopeSpec(style="interleaved"),
               indexer=IndexerSpec(n_heads=2, head_dim=6, top_k=3))


def _layer(seed=0):
    layer = MLA(12, SPEC, rng=np.random.default_rng(seed), dtype=np.float64)
    layer.idx_k_norm_b.data[...] = 0.1 * np.random.default_rng(seed + 1).standard_normal(6)
    return layer


def test_sparse_form_equals_dense_attention_under_the_chosen_keys():
    layer = _layer()
    x = np.random.default_rng(2).standard_normal((2, 7, 12))
    y, _ = layer.forward(x)
    w = layer._weights()
    idx, _ = indexer_select(x, w, spec=SPEC, rope=make_rope(SPEC.rope, 4, np.arange(7)))
    keep = np.zeros((2, 7, 7), bool)
    for b, t, i in np.ndindex(*idx.shape):
        if idx[b, t, i] >= 0:
            keep[b, t, idx[b, t, i]] = True
    assert keep.sum(-1).tolist() == [[1, 2, 3, 3, 3, 3, 3]] * 2
    plain = dataclasses.replace(SPEC, indexer=None)
    dense, _ = mla_forward(x, w._replace(**{n: None for n in w._fields if n.startswith("idx")}),
                           spec=plain, mask=Mask(array=keep[:, None]))
    np.testing.assert_allclose(y, dense, rtol=0, atol=1e-13)


def test_decoding_equals_the_forward_rows_and_indexer_grads_are_zero():
    layer = _layer(3)
    x = np.random.default_rng(4).standard_normal((2, 8, 12))
    y, cache = layer.forward(x)
    state = layer.init_state(2, 8)
    assert isinstance(state, IndexedLatentState)
    steps = [layer.decode(x[:, t], state, t) for t in range(8)]
    np.testing.assert_allclose(np.stack(steps, 1), y, rtol=0, atol=1e-12)
    fresh = layer.init_state(2, 8)
    layer.prefill(x[:, :5], fresh)
    np.testing.assert_allclose(fresh.index_keys[:, :5], state.index_keys[:, :5], rtol=0,
                               atol=1e-14)
    layer.backward(np.ones_like(y), cache)
    assert not layer.idx_wq.grad.any() and not layer.idx_w.grad.any()
    assert layer.wq_b.grad.any()
    with pytest.raises(ValueError, match="IndexedLatentState"):
        layer.decode(x[:, 0], LatentKVState(2, 8, 8, 4, np.float64), 0)
