"""DeepSeek-style sparse attention: the indexer against its formula, top-k selection against
a loop, sparse attention == sdpa under the selection mask and == causal attention at k >= T
(both twins), the fused twin == the readable twin (and the same bits on any thread count),
the KL loss's value."""
import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import (attention_distribution, causal_mask,
                                  indexer_kl_loss_backward, indexer_kl_loss_forward,
                                  lightning_indexer_backward, lightning_indexer_forward, sdpa_backward, sdpa_forward,
                                  topk_select, topk_sparse_attention_backward,
                                  topk_sparse_attention_forward)
from scratchllm.attention import sparse as sp
from scratchllm.attention.sparse_kernels import run_strided, sparse_backward_tasks, sparse_forward_tasks
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


@pytest.mark.parametrize("readable", ["0", "1"])
@pytest.mark.parametrize("top_k, block_q", [(3, 4), (5, 1), (11, 64)])
def test_sparse_equals_sdpa_under_the_selection_mask(top_k, block_q, readable, monkeypatch):
    monkeypatch.setenv("SCRATCHLLM_READABLE", readable)
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


@pytest.mark.parametrize("readable", ["0", "1"])
def test_k_at_least_T_is_full_causal_attention(readable, monkeypatch):
    monkeypatch.setenv("SCRATCHLLM_READABLE", readable)
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 4, 9, 4)) for _ in range(3))
    idx = topk_select(rng.standard_normal((1, 9, 9)), 20)
    out, _ = topk_sparse_attention_forward(q, k, v, idx, block_q=4)
    np.testing.assert_allclose(out, sdpa_forward(q, k, v, Mask())[0], rtol=0,
                               atol=1e-12)


def _twin_inputs(rng, B, H, Hkv, Tq, Tk, top_k, dtype):
    """q, k, v (v a strided view), indices with a row of no key and a repeated key, dout."""
    q = rng.standard_normal((B, H, Tq, 4)).astype(dtype)
    k = rng.standard_normal((B, Hkv, Tk, 4)).astype(dtype)
    v = rng.standard_normal((B, Hkv, Tk, 10)).astype(dtype)[..., ::2]  # (B, Hkv, Tk, 5)
    idx = topk_select(rng.standard_normal((B, Tq, Tk)), top_k)  # (B, Tq, K)
    idx[0, 0] = -1  # a query with no key: out 0, no gradient
    idx[-1, -1, 1] = idx[-1, -1, 0]  # a key counted twice (the gather's semantics)
    return q, k, v, idx, rng.standard_normal((B, H, Tq, 5)).astype(dtype)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
@pytest.mark.parametrize("B, H, Hkv, Tq, Tk, top_k", [(2, 6, 3, 11, 11, 4),  # lanes = B*Hkv
                                                      (1, 4, 1, 13, 13, 20),  # query chunks
                                                      (2, 2, 2, 5, 9, 3)])    # Tq < Tk
def test_fused_twin_equals_the_readable_twin(dtype, tol, B, H, Hkv, Tq, Tk, top_k):
    q, k, v, idx, dout = _twin_inputs(np.random.default_rng(Tq), B, H, Hkv, Tq, Tk, top_k, dtype)
    out, cache = sp.fused_topk_sparse_attention_forward(q, k, v, idx, block_q=4)
    want, want_cache = sp.topk_sparse_attention_forward_ref(q, k, v, idx, block_q=4)
    assert out.dtype == dtype and np.all(out[0, :, 0] == 0)
    np.testing.assert_allclose(out, want, rtol=0, atol=tol)
    got = sp.fused_topk_sparse_attention_backward(dout, cache)
    ref = sp.topk_sparse_attention_backward_ref(dout, want_cache)
    for name in "qkv":
        assert got[name].dtype == dtype
        np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=tol * 10, err_msg=name)
    assert np.all(got["q"][0, :, 0] == 0)


def test_the_fused_kernels_give_the_same_bits_on_any_thread_count_and_key_tile():
    B, H, Hkv, Tq, Tk, K = 2, 4, 2, 9, 9, 5
    q, k, v, idx, dout = _twin_inputs(np.random.default_rng(3), B, H, Hkv, Tq, Tk, K,
                                      np.float32)
    idx = np.sort(idx, axis=-1)  # as the fused forward passes them: -1 first
    q3, k3, v3, do3 = (np.ascontiguousarray(a.reshape((-1,) + a.shape[2:]))
                       for a in (q, k, v, dout))  # (B*H | B*Hkv, T, .)
    runs = []
    for threads, tile in ((1, 4), (2, 4), (3, 4), (2, 2), (1, Tk)):  # tile: key rows
        out, lse = np.empty((B * H, Tq, 5), np.float32), np.empty((B * H, Tq), np.float32)
        run_strided(sparse_forward_tasks, (q3, k3, v3, idx, np.float32(0.5), 2), (out, lse),
                  threads)
        grads = (np.empty_like(q3), np.zeros((B * Hkv, Tk, 4), np.float32),
                 np.zeros((B * Hkv, Tk, 5), np.float32))
        run_strided(sparse_backward_tasks, (q3, k3, v3, idx, np.float32(0.5), (out, lse), do3,
                                          (1, tile)), (grads,), threads)
        runs.append((out, lse) + grads)
    assert np.abs(runs[0][3]).max() > 0  # dk
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            np.testing.assert_array_equal(a, b)


def test_the_twin_is_chosen_by_the_forward_and_travels_with_the_cache(monkeypatch):
    rng = np.random.default_rng(4)
    q, k, v, idx, dout = _twin_inputs(rng, 1, 2, 2, 6, 6, 3, np.float64)
    _, fused = topk_sparse_attention_forward(q, k, v, idx)
    monkeypatch.setenv("SCRATCHLLM_READABLE", "1")
    _, readable = topk_sparse_attention_forward(q, k, v, idx)
    assert fused.backward is sp.fused_topk_sparse_attention_backward
    assert readable.backward is sp.topk_sparse_attention_backward_ref
    got = topk_sparse_attention_backward(dout, fused)  # still the fused one's backward
    want = sp.topk_sparse_attention_backward_ref(dout, readable.cache)
    for name in "qkv":
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-13, err_msg=name)


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
