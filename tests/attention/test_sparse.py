"""DeepSeek-style sparse attention: the indexer against its formula, top-k selection against
a loop, sparse attention == sdpa under the selection mask and == causal attention at k >= T,
the KL loss's value."""
import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import (attention_distribution, causal_mask,
                                  indexer_kl_loss_backward, indexer_kl_loss_forward,
                                  lightning_indexer_backward, lightning_indexer_forward, sdpa_backward, sdpa_forward,
                                  topk_select, topk_sparse_attention_backward,
                                  topk_sparse_attention_forward)
from scratchllm.specs import Mask


def test_gradient_check():
    for report in CASES["sparse_attention"](np.random.default_rng(0)):
        assert report.ok, str(report)


def test_indexer_matches_its_formula():
    rng = np.random.default_rng(1)
    q, k, w = (rng.standard_normal((2, 4, 3, 5)), rng.standard_normal((2, 6, 5)),
               rng.standard_normal((2, 4, 3)))
    got, _ = lightning_indexer_forward(q, k, w)
    for b, t, s in np.ndindex(2, 4, 6):
        want = sum(w[b, t, j] * max(q[b, t, j] @ k[b, s], 0.0) for j in range(3))
        assert got[b, t, s] == pytest.approx(want, abs=1e-12)


def test_topk_select_matches_a_loop():
    rng = np.random.default_rng(2)
    scores = rng.standard_normal((2, 7, 7))
    got = topk_select(scores, 3)
    for b, t in np.ndindex(2, 7):
        causal = np.arange(t + 1)
        best = sorted(causal[np.argsort(-scores[b, t, :t + 1])[:3]])
        assert got[b, t].tolist() == best + [-1] * (3 - len(best))


def _selection_mask(indices, Tk):
    """(B, 1, Tq, Tk) bool: key s is among query t's selected keys."""
    B, Tq, K = indices.shape
    mask = np.zeros((B, Tq, Tk + 1), bool)
    np.put_along_axis(mask, np.where(indices < 0, Tk, indices), True, axis=-1)
    return mask[:, None, :, :Tk]


@pytest.mark.parametrize("top_k, block_q", [(3, 4), (5, 1), (11, 64)])
def test_sparse_equals_sdpa_under_the_selection_mask(top_k, block_q):
    rng = np.random.default_rng(top_k)
    B, H, Hkv, T, Dh = 2, 6, 3, 11, 4
    q, k, v = (rng.standard_normal((B, H, T, Dh)), rng.standard_normal((B, Hkv, T, Dh)),
               rng.standard_normal((B, Hkv, T, 5)))
    idx = topk_select(rng.standard_normal((B, T, T)), top_k)
    out, cache = topk_sparse_attention_forward(q, k, v, idx, block_q=block_q)
    want, want_cache = sdpa_forward(q, k, v, Mask(array=_selection_mask(idx, T)))
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    dout = rng.standard_normal(out.shape)
    got, ref = topk_sparse_attention_backward(dout, cache), sdpa_backward(dout, want_cache)
    for name in "qkv":
        np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=1e-12, err_msg=name)


def test_k_at_least_T_is_full_causal_attention():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 4, 9, 4)) for _ in range(3))
    idx = topk_select(rng.standard_normal((1, 9, 9)), 20)
    out, _ = topk_sparse_attention_forward(q, k, v, idx, block_q=4)
    np.testing.assert_allclose(out, sdpa_forward(q, k, v, Mask())[0], rtol=0,
                               atol=1e-12)


def test_kl_loss_value_and_target():
    rng = np.random.default_rng(6)
    B, H, T, Dh = 2, 4, 5, 3
    q, k = rng.standard_normal((B, H, T, Dh)), rng.standard_normal((B, 2, T, Dh))
    allowed = causal_mask(T)
    p = attention_distribution(q, k, allowed)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-12)
    dense = np.zeros((B, T, T))
    for b, h, t in np.ndindex(B, H, T):
        e = np.exp(k[b, h // 2, :t + 1] @ q[b, h, t] / np.sqrt(Dh))
        dense[b, t, :t + 1] += e / e.sum() / H  # heads averaged
    np.testing.assert_allclose(p, dense, rtol=1e-12)
    scores = rng.standard_normal((B, T, T))
    loss, _ = indexer_kl_loss_forward(scores, p, allowed)
    want = 0.0
    for b, t in np.ndindex(B, T):
        s = scores[b, t, :t + 1]
        log_q = s - np.log(np.exp(s).sum())
        want += np.sum(p[b, t, :t + 1] * (np.log(p[b, t, :t + 1]) - log_q))
    assert float(loss) == pytest.approx(want / (B * T), rel=1e-12)
    assert float(indexer_kl_loss_forward(np.log(p + 1e-300), p, allowed)[0]) == \
        pytest.approx(0.0, abs=1e-12)


def test_indexer_trained_on_its_kl_loss_learns_the_dense_attention_ranking():
    """Gradient descent through indexer_kl_loss_backward and lightning_indexer_backward: the
    KL to the dense attention distribution falls, and the indexer's top-4 keys come to cover
    most of dense attention's mass."""
    rng = np.random.default_rng(8)
    B, H, T, Dh, HI, DI = 2, 4, 16, 8, 2, 8
    q, k = 2 * rng.standard_normal((B, H, T, Dh)), 2 * rng.standard_normal((B, 1, T, Dh))
    allowed = causal_mask(T)
    target = attention_distribution(q, k, allowed)  # (B, T, T)
    params = dict(q_idx=0.3 * rng.standard_normal((B, T, HI, DI)),
                  k_idx=0.3 * rng.standard_normal((B, T, DI)), w=np.ones((B, T, HI)))

    def step():
        scores, c_idx = lightning_indexer_forward(**params)
        loss, c_kl = indexer_kl_loss_forward(scores, target, allowed)
        grads = lightning_indexer_backward(indexer_kl_loss_backward(1.0, c_kl)["index_scores"],
                                           c_idx)
        for name in params:
            params[name] -= 2.0 * grads[name]
        return float(loss), scores

    first, _ = step()
    for _ in range(300):
        last, scores = step()
    covered = np.take_along_axis(target, np.maximum(topk_select(scores, 4), 0), -1).sum(-1)
    assert last < 0.5 * first
    assert covered[:, 4:].mean() > 0.7  # rows with more than 4 keys to choose from
