"""NSA with the paper's MLP compressor over overlapping blocks: equal to the block-by-block,
dense-mask reference; the selection's block importance (the paper's eq. 9) against a loop of
eq. 9 as printed; the compressor
against one block's MLP written out; the key bias's zero gradient."""
import numpy as np
import pytest

from scratchllm.attention import (CompressWeights, NSAWeights, nsa_compress_forward,
                                  nsa_indices, nsa_mlp_backward, nsa_mlp_forward,
                                  nsa_mlp_forward_ref, selection_weights)
from scratchllm.core.gelu import gelu_forward
from scratchllm.specs import NSASpec


def _weights(rng, block, Dh, F=7):
    return CompressWeights(rng.standard_normal((block, Dh)), rng.normal(0, 0.5, (block * Dh, F)),
                           rng.standard_normal(F), rng.normal(0, 0.5, (F, Dh)),
                           rng.standard_normal(Dh))


def _inputs(rng, T, block, B=2, H=4, Hkv=2, Dh=6):
    return dict(q=rng.standard_normal((B, H, T, Dh)), k=rng.standard_normal((B, Hkv, T, Dh)),
                v=rng.standard_normal((B, Hkv, T, Dh)),
                w=NSAWeights(*_weights(rng, block, Dh), *_weights(rng, block, Dh)),
                gates=rng.standard_normal((B, H, T, 3)))


@pytest.mark.parametrize("T, spec", [(17, NSASpec(4, 2, 2, 3)), (20, NSASpec(4, 1, 3, 5)),
                                     (16, NSASpec(4, None, 2, 4)), (9, NSASpec(3, 3, 5, 2))])
def test_nsa_mlp_equals_the_block_by_block_dense_reference(T, spec):
    inp = _inputs(np.random.default_rng(T), T, spec.block)
    o, _ = nsa_mlp_forward(**inp, spec=spec)
    ref, _ = nsa_mlp_forward_ref(**inp, spec=spec)
    np.testing.assert_allclose(o, ref, rtol=0, atol=1e-12)


def test_the_compressor_is_one_mlp_per_overlapping_block():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 10, 3))
    w = _weights(rng, 4, 3)
    y, _ = nsa_compress_forward(x, w, block=4, stride=2)
    assert y.shape == (1, 1, 4, 3)  # blocks start at 0, 2, 4, 6
    z = (x[0, 0, 4:8] + w.pos).reshape(-1)  # the third block, tokens 4..7
    want = gelu_forward(z @ w.w1 + w.b1)[0] @ w.w2 + w.b2
    np.testing.assert_allclose(y[0, 0, 2], want, rtol=0, atol=1e-13)


def _eq9(p_cmp, l, d, l_sel, n_sel):
    """Yuan et al. 2025 (arXiv 2502.11089) eq. 9 as printed, one term at a time:
    p_slc[j] = Σ_{m=0}^{l'/d−1} Σ_{n=0}^{l/d−1} p_cmp[(l'/d) j − m − n], indices < 0 absent."""
    out = np.zeros(n_sel)
    for j in range(n_sel):
        for m in range(l_sel // d):
            for n in range(l // d):
                i = (l_sel // d) * j - m - n
                if 0 <= i < len(p_cmp):
                    out[j] += p_cmp[i]
    return out


@pytest.mark.parametrize("T, l, d", [(16, 4, 2), (24, 6, 2), (12, 4, 1), (12, 3, 3)])
def test_selection_weights_are_eq_9(T, l, d):
    nb = (T - l) // d + 1
    M = selection_weights(T, l, d)
    assert M.shape == (nb, T // l)
    for i in range(nb):  # p_cmp = the i-th unit vector picks row i of M
        np.testing.assert_array_equal(M[i], _eq9(np.eye(nb)[i], l, d, l, T // l))
    if d == l:
        np.testing.assert_array_equal(M, np.eye(nb))
    with pytest.raises(ValueError, match="stride=3 must divide block=4"):
        selection_weights(T, 4, 3)


def test_the_selection_ranks_blocks_by_eq_9():
    """A query keeps its own block and the n − 1 best complete earlier blocks, their
    importance eq. 9 of the compressed attention summed over the heads (l = 4 tokens at
    stride 2)."""
    rng = np.random.default_rng(1)
    B, H, T, Dh, l, d, n = 1, 2, 16, 3, 4, 2, 3
    q = rng.standard_normal((B, H, T, Dh))
    k_cmp = rng.standard_normal((B, 1, 7, Dh))  # blocks at 0, 2, ..., 12
    slc, _ = nsa_indices(q, k_cmp, l, n, 3, d)
    for t in range(T):
        ends = np.arange(7) * d + l - 1
        s = np.array([[q[0, h, t] @ k_cmp[0, 0, i] / np.sqrt(Dh) if ends[i] <= t else -np.inf
                       for i in range(7)] for h in range(H)])  # (H, nb)
        p = np.exp(s - s.max(1, keepdims=True)) if np.isfinite(s).any() else np.zeros_like(s)
        p = (p / np.maximum(p.sum(1, keepdims=True), 1e-300)).sum(0)  # (nb,)
        imp = _eq9(p, l, d, l, T // l)
        done = sorted((j for j in range(T // l) if j * l + l - 1 <= t and j != t // l),
                      key=lambda j: (-imp[j], j))
        keep = {t // l} | set(done[:n - 1])
        want = sorted(s_ for j in keep for s_ in range(j * l, j * l + l) if s_ <= t)
        assert [s_ for s_ in slc[0, t] if s_ >= 0] == want, t
    with pytest.raises(ValueError, match="nsa_indices: stride=3 must divide block=4"):
        nsa_indices(q, k_cmp, 4, n, 3, 3)


def test_the_key_bias_has_no_gradient():
    """b2 of the key MLP adds one vector to every compressed key: q·b is constant along each
    softmax row, so the output does not depend on it (and its gradient is 0)."""
    rng = np.random.default_rng(2)
    inp = _inputs(rng, 13, 4)
    spec = NSASpec(4, 2, 2, 3)
    o, cache = nsa_mlp_forward(**inp, spec=spec)
    g = nsa_mlp_backward(rng.standard_normal(o.shape), cache)
    assert np.abs(g["w"].k_b2).max() < 1e-12 * np.abs(g["w"].v_b2).max()
    moved = inp["w"]._replace(k_b2=inp["w"].k_b2 + 3.0)
    np.testing.assert_allclose(nsa_mlp_forward(**dict(inp, w=moved), spec=spec)[0], o,
                               atol=1e-12)


def test_bad_sizes_are_named():
    rng = np.random.default_rng(3)
    inp = _inputs(rng, 6, 4)
    with pytest.raises(ValueError, match="stride=5 must be at most block=4"):
        NSASpec(4, 5)
    with pytest.raises(ValueError, match="stride=3 must divide block=4"):
        NSASpec(4, 3)
    with pytest.raises(ValueError, match="spec.block=8 is longer than the T=6 tokens"):
        nsa_mlp_forward(**inp, spec=NSASpec(8, 2, 2, 3))
