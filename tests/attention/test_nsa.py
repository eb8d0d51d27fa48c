"""Native sparse attention: equal to the masked dense reference, its block choice equal to a
per-query loop, and full causal attention when every block and the whole window are kept."""
import numpy as np
import pytest

from scratchllm.attention import (compress_matrix, nsa_forward, nsa_forward_ref, nsa_indices,
                                  sdpa_forward)
from scratchllm.specs import Mask


def _inputs(rng, B=2, H=4, Hkv=2, T=17, Dh=5, block=4):
    return dict(q=rng.standard_normal((B, H, T, Dh)), k=rng.standard_normal((B, Hkv, T, Dh)),
                v=rng.standard_normal((B, Hkv, T, Dh)), phi=rng.standard_normal(block),
                gates=rng.standard_normal((B, H, T, 3)))


@pytest.mark.parametrize("Hkv, T, block, n_select, window", [
    (2, 17, 4, 2, 5), (1, 24, 3, 3, 4), (4, 9, 2, 1, 1), (2, 16, 16, 2, 16)])
def test_equals_the_masked_dense_reference(Hkv, T, block, n_select, window):
    rng = np.random.default_rng(T)
    inp = _inputs(rng, Hkv=Hkv, T=T, block=block)
    o, _ = nsa_forward(**inp, block=block, n_select=n_select, window=window)
    o_ref, _ = nsa_forward_ref(**inp, block=block, n_select=n_select, window=window)
    np.testing.assert_allclose(o, o_ref, atol=1e-12)


def test_block_choice_equals_a_loop():
    rng = np.random.default_rng(1)
    inp = _inputs(rng, T=21, block=3)
    q, k, phi = inp["q"], inp["k"], inp["phi"]
    B, H, T, Dh = q.shape
    k_cmp = np.einsum("jt,bhtd->bhjd", compress_matrix(phi, T), k)  # (B, Hkv, 7, Dh)
    slc, win = nsa_indices(q, k_cmp, 3, 3, 4)
    for b in range(B):
        for t in range(T):
            seen = [j for j in range(7) if 3 * j + 2 <= t]  # complete blocks before t
            score = np.zeros(7)
            for h in range(H):
                s = np.array([q[b, h, t] @ k_cmp[b, h // 2, j] / np.sqrt(Dh) for j in seen])
                if len(seen):
                    score[seen] += np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            others = sorted((j for j in seen if j != t // 3), key=lambda j: -score[j])[:2]
            want = sorted(s for j in [t // 3] + others for s in range(3 * j, 3 * j + 3) if s <= t)
            assert [s for s in slc[b, t] if s >= 0] == want
            assert [s for s in win[b, t] if s >= 0] == list(range(max(0, t - 3), t + 1))


def test_keeping_everything_is_causal_attention():
    rng = np.random.default_rng(2)
    inp = _inputs(rng, T=12, block=3)
    inp["gates"][..., 0] = -60.0  # the compressed branch off (sigmoid(-60) ~ 1e-26)
    o, _ = nsa_forward(**inp, block=3, n_select=4, window=12)
    causal, _ = sdpa_forward(inp["q"], inp["k"], inp["v"], Mask())
    g = 1 / (1 + np.exp(-inp["gates"][..., 1:]))  # (B, H, T, 2)
    np.testing.assert_allclose(o, g.sum(-1, keepdims=True) * causal, atol=1e-12)


def test_errors():
    inp = _inputs(np.random.default_rng(3))
    with pytest.raises(ValueError, match="phi"):
        nsa_forward(**inp, block=3, n_select=2, window=4)
    with pytest.raises(ValueError, match="gates"):
        nsa_forward(**{**inp, "gates": inp["gates"][..., :2]}, block=4, n_select=2, window=4)
