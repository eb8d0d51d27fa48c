"""Fixed sparse patterns (Sparse Transformer strided and fixed, BigBird) against sets built
index by index, the receptive field against a breadth-first search, and document masking: a
packed batch through GQA equals each document run alone."""
import numpy as np
import pytest

from scratchllm.attention import (AttentionWeights, bigbird_mask, causal_mask, document_mask,
                                  document_positions, fixed_mask, gqa_backward, gqa_forward,
                                  make_rope, mask_receptive_field, padding_mask,
                                  sliding_window_mask, strided_mask)
from scratchllm.specs import AttentionSpec, Mask


def _from_sets(T, allowed):
    m = np.zeros((T, T), bool)
    for i in range(T):
        for j in range(i + 1):
            m[i, j] = allowed(i, j)
    return m


def test_strided_and_fixed_equal_their_index_sets():
    T, l, c = 17, 4, 2
    assert (strided_mask(T, l) == _from_sets(T, lambda i, j: i - j < l or (i - j) % l == 0)).all()
    assert (fixed_mask(T, l, c) == _from_sets(
        T, lambda i, j: i // l == j // l or j % l in range(l - c, l))).all()
    assert strided_mask(6, 6).tolist() == causal_mask(6).tolist()


def _bfs_reach(mask, L):
    """Tokens reachable from each query through L hops of mask, by explicit frontier sets."""
    T = len(mask)
    counts = []
    for i in range(T):
        frontier = {i}
        for _ in range(L):
            frontier = {j for q in frontier for j in np.flatnonzero(mask[q])}
        counts.append(len(frontier))
    return np.array(counts)


@pytest.mark.parametrize("L", [1, 2, 3])
def test_mask_receptive_field_equals_a_search(L):
    rng = np.random.default_rng(L)
    for mask in (strided_mask(20, 4), fixed_mask(20, 5), sliding_window_mask(20, 3),
                 bigbird_mask(20, 2, n_random=1, rng=rng)):
        assert (mask_receptive_field(mask, L) == _bfs_reach(mask, L)).all()


def test_mask_receptive_field_counts():
    T, W = 40, 4  # a sliding window grows by W - 1 tokens per layer
    for L in (1, 2, 5):
        assert (mask_receptive_field(sliding_window_mask(T, W), L)
                == np.minimum(np.arange(T) + 1, L * (W - 1) + 1)).all()
    T, l = 64, 8  # strided with l = sqrt(T): every earlier token after two layers, not one
    assert (mask_receptive_field(strided_mask(T, l), 1) < np.arange(T) + 1).any()
    assert (mask_receptive_field(strided_mask(T, l), 2) == np.arange(T) + 1).all()
    assert (mask_receptive_field(fixed_mask(T, l), 2) == np.arange(T) + 1).all()
    assert strided_mask(T, l).sum() <= 2 * T * l < causal_mask(T).sum()  # O(T sqrt T) keys


def test_bigbird_blocks():
    T, b, r = 48, 4, 2
    m = bigbird_mask(T, b, n_random=r, rng=np.random.default_rng(7))
    assert (m == bigbird_mask(T, b, n_random=r, rng=np.random.default_rng(7))).all()
    assert not (m == bigbird_mask(T, b, n_random=r, rng=np.random.default_rng(8))).all()
    blocks = m[::b, ::b]  # (12, 12) one entry per block pair
    assert (m == np.kron(blocks, np.ones((b, b), bool))).all()
    nb = T // b
    for q in range(nb):
        window = {k for k in (q - 1, q, q + 1) if 0 <= k < nb}
        seen = set(np.flatnonzero(blocks[q]))
        if q == 0:  # the global block sees everything, and everything sees it
            assert seen == set(range(nb))
            continue
        assert window | {0} <= seen and len(seen - window - {0}) == r
    causal = bigbird_mask(T, b, n_random=r, rng=np.random.default_rng(7), causal=True)
    assert not np.triu(causal, 1).any() and (np.diag(causal)).all()


def test_document_positions_and_mask():
    doc = np.array([[0, 0, 0, 1, 1, 2, 2, 2], [5, 5, 5, 5, 5, 6, 6, 6]])
    assert document_positions(doc).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2], [0, 1, 2, 3, 4, 0, 1, 2]]
    m = document_mask(doc)
    assert m.shape == (2, 1, 8, 8)
    assert m[0, 0, 4].astype(int).tolist() == [0, 0, 0, 1, 1, 0, 0, 0]
    assert (document_mask(doc[1]) == m[1, 0]).all()
    with pytest.raises(TypeError, match="doc_ids"):
        document_mask(np.zeros(3))


def test_packed_documents_equal_each_document_alone_through_gqa():
    rng = np.random.default_rng(3)
    D, H, Hkv, Dh = 12, 3, 1, 4
    spec = AttentionSpec(n_heads=H, n_kv_heads=Hkv, head_dim=Dh)
    w = AttentionWeights(rng.normal(0, 0.4, (D, H * Dh)), rng.normal(0, 0.4, (D, Hkv * Dh)),
                         rng.normal(0, 0.4, (D, Hkv * Dh)), rng.normal(0, 0.4, (H * Dh, D)))
    lengths = [[3, 5, 2], [6, 4]]  # two packed rows of 10 tokens
    x = rng.standard_normal((2, 10, D))
    doc = np.array([np.repeat(np.arange(len(ls)), ls) for ls in lengths])  # (2, 10)
    rope = make_rope(spec.rope, Dh, document_positions(doc))
    y, cache = gqa_forward(x, w, spec=spec, rope=rope, mask=Mask(array=document_mask(doc)))
    dy = rng.standard_normal(y.shape)
    dx = gqa_backward(dy, cache)["x"]
    for row, ls in enumerate(lengths):
        for start, n in zip(np.cumsum([0] + ls[:-1]), ls):
            part = slice(start, start + n)
            alone, c1 = gqa_forward(x[row:row + 1, part], w, spec=spec)  # positions 0..n-1
            np.testing.assert_allclose(y[row, part], alone[0], atol=1e-12)
            dx_alone = gqa_backward(dy[row:row + 1, part], c1)["x"]
            np.testing.assert_allclose(dx[row, part], dx_alone[0], atol=1e-12)
    plain, _ = gqa_forward(x, w, spec=spec)  # without the mask the documents leak
    assert np.abs(plain[:, 3:] - y[:, 3:]).max() > 1e-3


def test_padding_mask_keeps_each_rows_real_keys_and_the_layers_own_pattern():
    am = np.array([[1, 1, 1], [1, 1, 0]])
    whole = padding_mask(am, Mask(causal=False))
    assert whole.array.shape == (2, 1, 1, 3) and whole.array[1, 0, 0].tolist() == [1, 1, 0]
    causal = padding_mask(am, Mask(), Tq=2)  # the last 2 queries of 3 positions
    assert np.array_equal(causal.array[1, 0], causal_mask(3)[1:] & [True, True, False])
    with pytest.raises(ValueError, match="attention_mask must hold 0/1"):
        padding_mask(am * 2)
    with pytest.raises(ValueError, match=r"attention_mask must have 2 axes"):
        padding_mask(am[0])
