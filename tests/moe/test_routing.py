"""Routing of real checkpoints: gpt-oss's biased router (softmax over the chosen k) and
DeepSeek-V3's group-limited sigmoid routing (correction bias for selection only,
norm_topk_prob, routed_scaling_factor), against transformers' routers transcribed in NumPy."""
import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.core.ops import silu_forward
from scratchllm.moe import (MoE, MoEWeights, moe_backward, moe_forward, router_backward,
                            router_forward, select_topk, selection_margin)
from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec


@pytest.mark.parametrize("name", ["router_routing", "moe_routing"])
def test_gradient_check(name):
    for report in CASES[name](np.random.default_rng(0)):
        assert report.ok, str(report)


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def hf_deepseek_v3_router(x, weight, bias, top_k, n_group, topk_group, norm_topk_prob, rsf):
    """huggingface/transformers src/transformers/models/deepseek_v3/modeling_deepseek_v3.py
    DeepseekV3TopkRouter.forward, transcribed (weight is nn.Linear's (E, D))."""
    E = weight.shape[0]
    router_logits = x @ weight.T
    scores = sigmoid(router_logits)
    choice = scores + bias
    group_scores = np.sort(choice.reshape(-1, n_group, E // n_group), axis=-1)[..., -2:].sum(-1)
    group_idx = np.argsort(-group_scores, axis=-1)[:, :topk_group]
    group_mask = np.zeros_like(group_scores)
    np.put_along_axis(group_mask, group_idx, 1, axis=1)
    score_mask = np.repeat(group_mask[..., None], E // n_group, axis=-1).reshape(-1, E)
    choice = np.where(score_mask.astype(bool), choice, -np.inf)
    topk_indices = np.argsort(-choice, axis=-1)[:, :top_k]
    topk_weights = np.take_along_axis(scores, topk_indices, axis=1)
    if norm_topk_prob:
        topk_weights = topk_weights / (topk_weights.sum(axis=-1, keepdims=True) + 1e-20)
    return router_logits, topk_weights * rsf, topk_indices


def by_index(idx, weights):
    """Rows sorted by expert id (HF's topk(sorted=False) order is unspecified)."""
    order = np.argsort(idx, axis=-1)
    return np.take_along_axis(idx, order, -1), np.take_along_axis(weights, order, -1)


@pytest.mark.parametrize("n_group, topk_group, norm, rsf", [
    (4, 2, True, 2.5), (8, 3, True, 1.0), (2, 1, False, 16.0), (1, 1, True, 1.0)])
def test_group_limited_router_equals_deepseek_v3(n_group, topk_group, norm, rsf):
    rng = np.random.default_rng(1)
    N, D, E, k = 13, 6, 16, 4
    x, weight, bias = rng.standard_normal((N, D)), rng.standard_normal((E, D)), \
        0.1 * rng.standard_normal(E)
    spec = RouterSpec(E, k, "sigmoid", n_group=n_group, topk_group=topk_group,
                      norm_topk_prob=norm, routed_scaling_factor=rsf)
    (gates, idx, _, logits), _ = router_forward(x, weight.T.copy(), spec=spec,
                                                selection_bias=bias)
    hf_logits, hf_w, hf_idx = hf_deepseek_v3_router(x, weight, bias, k, n_group, topk_group,
                                                    norm, rsf)
    np.testing.assert_allclose(logits, hf_logits, rtol=0, atol=1e-14)
    got_idx, got_w = by_index(idx, gates)
    want_idx, want_w = by_index(hf_idx, hf_w)
    np.testing.assert_array_equal(got_idx, want_idx)
    np.testing.assert_allclose(got_w, want_w, rtol=1e-14)


def test_group_limit_binds_and_its_margin():
    # groups {0,1}: 0.9+0.1=1.0, {2,3}: 0.8+0.75=1.55, {4,5}: 0.3, {6,7}: 0.3+0.3=0.6
    sel = np.array([[0.9, 0.1, 0.8, 0.75, 0.2, 0.1, 0.3, 0.3]])
    assert select_topk(sel, 2).tolist() == [[0, 2]]
    assert select_topk(sel, 2, n_group=4, topk_group=1).tolist() == [[2, 3]]
    assert select_topk(sel, 2, n_group=4, topk_group=2).tolist() == [[0, 2]]
    assert selection_margin(sel, 2, 4, 1) == pytest.approx([0.55])  # group gap; k fills it
    assert selection_margin(sel, 1, 4, 1) == pytest.approx([0.05])  # 0.8 vs 0.75 inside
    assert selection_margin(sel, 2, 4, 2) == pytest.approx([0.05])  # groups 0.4; 0.8 vs 0.75
    assert selection_margin(sel, 2) == pytest.approx([0.05])  # plain top-k: 0.8 vs 0.75
    # DeepSeek-V2's group_limited_greedy scores a group by its max (group_top=1): {0,1}
    # 0.9 beats {2,3} 0.8, where the top-2 sums (V3) chose {2,3}
    assert select_topk(sel, 2, n_group=4, topk_group=1, group_top=1).tolist() == [[0, 1]]
    assert selection_margin(sel, 2, 4, 1, group_top=1) == pytest.approx([0.1])  # 0.9 vs 0.8


def test_gpt_oss_router_equals_transformers():
    """GptOssTopKRouter: logits = x W^T + b, top-k on the logits (sorted), softmax over the
    chosen k. Here: score "softmax" with b_router; its renormalised gates are that softmax."""
    rng = np.random.default_rng(2)
    N, D, E, k = 11, 7, 8, 4
    x, weight, bias = rng.standard_normal((N, D)), rng.standard_normal((E, D)), \
        rng.standard_normal(E)
    router_logits = x @ weight.T + bias
    hf_idx = np.argsort(-router_logits, axis=-1)[:, :k]  # torch.topk: sorted, descending
    top = np.take_along_axis(router_logits, hf_idx, axis=-1)
    e = np.exp(top - top.max(axis=1, keepdims=True))
    hf_scores = e / e.sum(axis=1, keepdims=True)
    (gates, idx, _, logits), _ = router_forward(x, weight.T.copy(), bias,
                                                spec=RouterSpec(E, k, bias=True))
    np.testing.assert_array_equal(idx, hf_idx)
    np.testing.assert_allclose(logits, router_logits, rtol=0, atol=1e-14)
    np.testing.assert_allclose(gates, hf_scores, rtol=1e-14)


def test_logit_bias_gradient_is_the_row_sum():
    rng = np.random.default_rng(3)
    x, w, b = rng.standard_normal((9, 5)), rng.standard_normal((5, 6)), rng.standard_normal(6)
    out, cache = router_forward(x, w, b, spec=RouterSpec(6, 2, bias=True))
    dlogits = rng.standard_normal((9, 6))
    g = router_backward((rng.standard_normal((9, 2)), None, None, dlogits), cache)
    g0 = router_backward((np.zeros((9, 2)), None, None, dlogits), cache)
    np.testing.assert_allclose(g0["b_router"], dlogits.sum(axis=0), rtol=1e-14)
    assert set(g) == {"x", "w_router", "b_router"}
    assert set(router_backward((out.gates, None, None, None),
                               router_forward(x, w, spec=RouterSpec(6, 2))[1])) == {
        "x", "w_router"}


def hf_deepseek_v3_moe(x, weight, bias, gate_up_proj, down_proj, shared, **routing):
    """DeepseekV3MoE.forward (DeepseekV3Experts loop + DeepseekV3MLP shared experts),
    transcribed; gate_up_proj (E, 2F, D), down_proj (E, D, F) as nn.functional.linear uses."""
    _, w, idx = hf_deepseek_v3_router(x, weight, bias, **routing)
    F = down_proj.shape[2]
    out = np.zeros_like(x)
    for n in range(x.shape[0]):
        for j in range(idx.shape[1]):
            gate_up = gate_up_proj[idx[n, j]] @ x[n]
            h = silu_forward(gate_up[:F])[0] * gate_up[F:]
            out[n] += (down_proj[idx[n, j]] @ h) * w[n, j]
    gate, up, down = shared
    return out + (silu_forward(x @ gate.T)[0] * (x @ up.T)) @ down.T


def test_moe_layer_equals_deepseek_v3_moe():
    rng = np.random.default_rng(4)
    N, D, E, F, Fs, k = 10, 6, 8, 5, 3, 3
    x, weight = rng.standard_normal((N, D)), rng.standard_normal((E, D))
    bias = 0.1 * rng.standard_normal(E)
    gate_up, down = rng.standard_normal((E, 2 * F, D)), rng.standard_normal((E, D, F))
    shared = rng.standard_normal((Fs, D)), rng.standard_normal((Fs, D)), \
        rng.standard_normal((D, Fs))
    routing = dict(n_group=4, topk_group=2, norm_topk_prob=True, rsf=2.5)
    want = hf_deepseek_v3_moe(x, weight, bias, gate_up, down, shared, top_k=k, **routing)
    w = MoEWeights(weight.T.copy(), None, gate_up[:, :F].transpose(0, 2, 1).copy(),
                   gate_up[:, F:].transpose(0, 2, 1).copy(), down.transpose(0, 2, 1).copy(),
                   shared_w1=shared[0].T.copy(), shared_w3=shared[1].T.copy(),
                   shared_w2=shared[2].T.copy())
    spec = MoESpec(RouterSpec(E, k, "sigmoid", n_group=4, topk_group=2,
                              routed_scaling_factor=2.5), ExpertsSpec(d_ff=F), d_shared=Fs)
    (y, _, _), _ = moe_forward(x, w, spec=spec, selection_bias=bias)
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-12)


def test_module_owns_the_logit_bias_and_passes_the_options():
    rng = np.random.default_rng(5)
    spec = MoESpec(RouterSpec(8, 2, "sigmoid", bias=True, n_group=4, topk_group=2,
                              routed_scaling_factor=2.0), ExpertsSpec(d_ff=5))
    m = MoE(6, spec, rng=rng, dtype=np.float64)
    assert [n for n, _ in m.named_parameters()][:2] == ["w_router", "b_router"]
    m.b_router.data[:] = rng.standard_normal(8)
    x = rng.standard_normal((2, 3, 6))
    out, cache = m.forward(x)
    want, _ = moe_forward(x, MoEWeights(**{n: p.data for n, p in m.named_parameters()}),
                          spec=spec, selection_bias=m.selection_bias)
    np.testing.assert_array_equal(out.y, want.y)
    dy = rng.standard_normal(x.shape)
    m.backward((dy, None, None), cache)
    np.testing.assert_array_equal(m.b_router.grad,
                                  moe_backward((dy, None, None), cache)["w"].b_router)
    assert MoE(6, MoESpec(RouterSpec(8, 2), ExpertsSpec(d_ff=5)), rng=rng).b_router is None


def test_bad_routing_options():
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((4, 5)), rng.standard_normal((5, 8))
    with pytest.raises(ValueError, match=r"RouterSpec: n_group=3 must divide n_experts=8"):
        RouterSpec(8, 2, n_group=3)
    with pytest.raises(ValueError, match=r"RouterSpec: n_group=8 .* groups of >= 2 experts"):
        RouterSpec(8, 2, n_group=8)
    with pytest.raises(ValueError, match=r"RouterSpec: topk_group=5 must be <= n_group=4"):
        RouterSpec(8, 2, n_group=4, topk_group=5)
    with pytest.raises(ValueError, match=r"its groups must hold >= top_k=5 experts"):
        RouterSpec(8, 5, n_group=4, topk_group=2)
    with pytest.raises(ValueError, match="RouterSpec: topk_group must be an integer >= 1"):
        RouterSpec(8, 2, n_group=4, topk_group=0)
    with pytest.raises(ValueError, match=r"router: b_router has shape \(7,\), expected \(8,\)"):
        router_forward(x, w, np.zeros(7), spec=RouterSpec(8, 2, bias=True))
    with pytest.raises(ValueError, match="router: b_router must be given exactly when spec.bias"):
        router_forward(x, w, np.zeros(8), spec=RouterSpec(8, 2))
    with pytest.raises(ValueError, match=r"router: w_router has shape \(5, 8\), expected "
                                         r"\(5, 6\)"):
        router_forward(x, w, spec=RouterSpec(6, 2))
    with pytest.raises(TypeError, match="router: spec must be a RouterSpec, got MoESpec"):
        router_forward(x, w, spec=MoESpec())
