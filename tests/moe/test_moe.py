"""Tests of scratchllm.moe (router, losses, experts, layer, expert_choice): gradients, equivalences, the balance
loss's exact values, router collapse and its two cures, capacity, bad input."""
import math

import numpy as np
import pytest

from grads.check import check
from scratchllm.core import ops
from scratchllm.moe import (MoE, MoEWeights, balance_loss_backward, balance_loss_forward,
                            dispatch, expert_choice_backward, expert_choice_forward,
                            moe_backward, moe_forward, moe_forward_ref, router_backward,
                            router_forward, topk_margin, update_selection_bias, z_loss_backward,
                            z_loss_forward)
from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec

H = 1e-5  # the checker's finite-difference step


def routed_inputs(rng, N, D, E, k, score="softmax", bias=False):
    """x, w_router (and a bias) whose top-k choice is >= 1e-3 from a tie in every row."""
    while True:
        x, w = rng.standard_normal((N, D)), rng.standard_normal((D, E))
        b = 0.05 * rng.standard_normal(E) if bias else None
        _, cache = router_forward(x, w, spec=RouterSpec(E, k, score), selection_bias=b)
        if topk_margin(cache.score_cache.y + (0 if b is None else b), k).min() > 1e-3:
            return x, w, b


def assert_selection_stable(select, inputs, names):
    """select(**inputs) -> an int array; it must not change when any element of any input in
    `names` moves by +-H (so the finite differences never cross a routing decision)."""
    base = select(**inputs)
    for name in names:
        for i in range(inputs[name].size):
            for step in (H, -H):
                moved = inputs[name].copy()
                moved.flat[i] += step
                assert np.array_equal(select(**{**inputs, name: moved}), base), (name, i, step)


def experts(rng, E, D, F, dtype=np.float64):
    return {n: rng.standard_normal(s).astype(dtype)
            for n, s in (("w1", (E, D, F)), ("w3", (E, D, F)), ("w2", (E, F, D)))}


def moe_spec(E, k, F, score="softmax", capacity_factor=None, d_shared=0):
    """The MoESpec of a layer of E SwiGLU experts of width F, top-k."""
    return MoESpec(RouterSpec(E, k, score), ExpertsSpec(d_ff=F), capacity_factor, d_shared)


def shared(rng, D, Fs):
    return {"shared_w1": rng.standard_normal((D, Fs)), "shared_w3": rng.standard_normal((D, Fs)),
            "shared_w2": rng.standard_normal((Fs, D))}


# ---------------------------------------------------------------------------- router
@pytest.mark.parametrize("score, bias", [("softmax", False), ("softmax", True), ("sigmoid", True)])
def test_router_gradients(score, bias):
    rng = np.random.default_rng(1)
    x, w, b = routed_inputs(rng, 7, 6, 5, 2, score, bias)
    inputs = dict(x=x, w_router=w, spec=RouterSpec(5, 2, score), selection_bias=b)
    assert_selection_stable(lambda **kw: router_forward(**kw)[0][1], inputs, ["x", "w_router"])
    report = check(router_forward, router_backward, rng=rng, wrt=["x", "w_router"], **inputs)
    assert report.ok, f"\n{report}"


def test_router_gates_are_softmax_over_chosen_logits_and_bias_only_selects():
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((6, 4)), rng.standard_normal((4, 5))
    spec = RouterSpec(5, 3)
    (gates, idx, probs, logits), _ = router_forward(x, w, spec=spec)
    chosen = np.take_along_axis(x @ w, idx, axis=-1)
    assert np.allclose(gates, np.exp(chosen) / np.exp(chosen).sum(-1, keepdims=True))
    assert np.allclose(probs.sum(-1), 1) and np.allclose(logits, x @ w)
    bias = np.array([0.0, 0.0, 0.0, 0.0, 5.0])  # forces expert 4 into every top-k
    (g_b, idx_b, _, _), _ = router_forward(x, w, spec=spec, selection_bias=bias)
    assert (idx_b == 4).any(axis=-1).all() and not (idx == 4).any(axis=-1).all()
    chosen_b = np.take_along_axis(x @ w, idx_b, axis=-1)  # gates from the scores, not the bias
    assert np.allclose(g_b, np.exp(chosen_b) / np.exp(chosen_b).sum(-1, keepdims=True))
    (g_s, idx_s, p_s, _), _ = router_forward(x, w, spec=RouterSpec(5, 3, "sigmoid"))
    sig = 1 / (1 + np.exp(-np.take_along_axis(x @ w, idx_s, axis=-1)))
    assert np.allclose(g_s, sig / sig.sum(-1, keepdims=True))


# ---------------------------------------------------------------------------- balance / z-loss
def test_balance_loss_gradient_and_closed_form():
    rng = np.random.default_rng(3)
    N, E, k = 9, 5, 2
    s = rng.standard_normal((N, E))
    p, sm_cache = ops.softmax_forward(s)
    idx = np.argsort(-p, axis=-1)[:, :k]
    report = check(balance_loss_forward, balance_loss_backward, rng=rng, probs=p, topk_idx=idx)
    assert report.ok, f"\n{report}"
    # dL/ds_nj = (E/N) p_nj (f_j - sum_i f_i p_ni), from the docstring, vs the chained pairs
    f = np.bincount(idx.ravel(), minlength=E) / (N * k)
    closed = (E / N) * p * (f - (p * f).sum(-1, keepdims=True))
    loss, cache = balance_loss_forward(p, idx)
    chained = ops.softmax_backward(balance_loss_backward(1.0, cache)["probs"], sm_cache)["x"]
    assert np.allclose(chained, closed, rtol=1e-12, atol=1e-15)
    assert np.allclose(closed.sum(-1), 0)  # shift invariance
    hf = E * np.sum(np.eye(E)[idx].mean(axis=0) * p.mean(axis=0))  # HF Mixtral's form
    assert np.isclose(hf, k * loss)


def test_balance_loss_is_one_at_balance_and_above_when_skewed():
    N, E, k = 16, 8, 2
    uniform = np.full((N, E), 1 / E)
    round_robin = (np.arange(N * k) % E).reshape(N, k)
    assert balance_loss_forward(uniform, round_robin)[0] == 1.0
    skewed_idx = np.tile([0, 1], (N, 1))  # every token picks experts 0 and 1
    skewed_p = np.full((N, E), 0.05)
    skewed_p[:, :2] = 0.35
    assert balance_loss_forward(skewed_p, skewed_idx)[0] > 1.5
    assert balance_loss_forward(uniform.astype(np.float32), round_robin)[0].dtype == np.float32


def test_z_loss_value_and_gradient():
    rng = np.random.default_rng(4)
    s = 3 * rng.standard_normal((9, 5))
    assert np.isclose(z_loss_forward(s)[0], np.mean(np.log(np.exp(s).sum(-1)) ** 2))
    report = check(z_loss_forward, z_loss_backward, rng=rng, logits=s)
    assert report.ok, f"\n{report}"


# ---------------------------------------------------------------------------- the layer
@pytest.mark.parametrize("score, bias, c, with_shared", [
    ("softmax", False, 0.75, True), ("sigmoid", True, 1.0, True), ("softmax", False, None, False)])
def test_moe_gradients(score, bias, c, with_shared):
    rng = np.random.default_rng(5)
    N, D, E, F, k = 11, 6, 4, 5, 2
    x, w, b = routed_inputs(rng, N, D, E, k, score, bias)
    sh = shared(rng, D, 3) if with_shared else {}
    weights = MoEWeights(w, **experts(rng, E, D, F), **sh)
    spec = moe_spec(E, k, F, score, c, 3 if with_shared else 0)
    inputs = dict(x=x, w=weights, spec=spec, selection_bias=b)
    cache = moe_forward(**inputs)[1]
    if c is not None:
        assert cache.n_dropped > 0  # the check must cover dropped slots
    assert_selection_stable(lambda x, w_router: moe_forward(
        x, weights._replace(w_router=w_router), spec=spec, selection_bias=b)[1].dispatch.slots,
        dict(x=x, w_router=w), ["x", "w_router"])
    report = check(moe_forward, moe_backward, rng=rng, wrt=["x", "w"], **inputs)
    assert report.ok, f"\n{report}"


def test_moe_k_equals_E_is_the_dense_mixture():
    rng = np.random.default_rng(6)
    N, D, E, F = 8, 5, 4, 7
    x, w, ex = rng.standard_normal((2, 4, D)), rng.standard_normal((D, E)), experts(rng, E, D, F)
    (y, _, _), _ = moe_forward(x, MoEWeights(w, **ex), spec=moe_spec(E, E, F))
    p = np.exp(x @ w) / np.exp(x @ w).sum(-1, keepdims=True)  # (2, 4, E)
    dense = sum(p[..., i:i + 1] * ops.swiglu_forward(x, ex["w1"][i], ex["w3"][i], ex["w2"][i])[0]
                for i in range(E))
    assert y.shape == x.shape and np.allclose(y, dense, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("c, with_shared, score", [
    (None, False, "softmax"), (0.5, True, "softmax"), (1.25, False, "sigmoid")])
def test_moe_matches_token_loop_reference(c, with_shared, score):
    rng = np.random.default_rng(7)
    N, D, E, F, k = 40, 6, 8, 5, 3
    x, w = rng.standard_normal((N, D)), rng.standard_normal((D, E))
    w[:, 0] += 1.0  # skew so that capacity bites
    weights = MoEWeights(w, **experts(rng, E, D, F), **(shared(rng, D, 4) if with_shared else {}))
    spec = moe_spec(E, k, F, score, c, 4 if with_shared else 0)
    (y, _, _), cache = moe_forward(x, weights, spec=spec)
    (y_ref, _, _), _ = moe_forward_ref(x, weights, spec=spec)
    assert np.allclose(y, y_ref, rtol=1e-12, atol=1e-12)
    assert c is None or cache.n_dropped > 0


def test_capacity_is_never_exceeded_and_drops_the_latest_tokens():
    rng = np.random.default_rng(8)
    idx = np.argsort(rng.standard_normal((50, 6)), axis=-1)[:, :2]
    d = dispatch(idx, 6, math.ceil(0.8 * 50 * 2 / 6))
    assert d.capacity == 14 and (d.kept_per_expert <= 14).all()
    assert d.n_dropped == (d.tokens_per_expert - d.kept_per_expert).sum() > 0
    # hand-made: 5 tokens, k=2, E=3, capacity ceil(1.0 * 5 * 2 / 3) = 4
    idx = np.array([[0, 1], [0, 2], [1, 0], [0, 2], [0, 1]])  # expert 0 gets all 5 tokens
    d = dispatch(idx, 3, math.ceil(5 * 2 / 3))
    assert d.capacity == 4 and d.n_dropped == 1
    assert d.tokens_per_expert.tolist() == [5, 3, 2] and d.kept_per_expert.tolist() == [4, 3, 2]
    assert (d.slots // 2).tolist() == [0, 1, 2, 3, 0, 2, 4, 1, 3]  # token 4 lost expert 0
    assert d.bounds.tolist() == [0, 4, 7, 9]


def test_float32_stays_float32():
    rng = np.random.default_rng(9)
    N, D, E, F = 6, 4, 3, 5
    x, w = rng.standard_normal((N, D)).astype(np.float32), rng.standard_normal((D, E)).astype(
        np.float32)
    ex = experts(rng, E, D, F, np.float32)
    out, cache = moe_forward(x, MoEWeights(w, **ex), spec=moe_spec(E, 2, F, "sigmoid", 1.0),
                             selection_bias=np.zeros(E, np.float32))
    assert all(o.dtype == np.float32 for o in out)
    g = moe_backward((np.ones_like(x), np.float32(1), np.float32(1)), cache)
    assert g["x"].dtype == np.float32
    assert all(v.dtype == np.float32 for v in g["w"] if v is not None)


def test_bad_input_raises():
    rng = np.random.default_rng(10)
    D, E, F = 4, 3, 5
    x, w, ex = rng.standard_normal((6, D)), rng.standard_normal((D, E)), experts(rng, E, D, F)
    weights, spec = MoEWeights(w, **ex), moe_spec(E, 2, F)
    with pytest.raises(ValueError, match="top_k=4 must be <= n_experts=3"):
        moe_spec(E, 4, F)
    for c in (0, -1.0):
        with pytest.raises(ValueError, match="capacity_factor"):
            moe_spec(E, 2, F, capacity_factor=c)
    with pytest.raises(ValueError, match="w2"):
        moe_forward(x, weights._replace(w2=ex["w2"][:, :, :3]), spec=spec)
    with pytest.raises(ValueError, match="w1"):
        moe_forward(x, weights._replace(w_router=rng.standard_normal((D, E + 1))), spec=spec)
    with pytest.raises(ValueError, match="w_router"):
        moe_forward(x, weights._replace(w_router=rng.standard_normal((D + 1, E))), spec=spec)
    with pytest.raises(ValueError, match="shared"):
        moe_forward(x, weights._replace(shared_w1=rng.standard_normal((D, 2))), spec=spec)
    with pytest.raises(ValueError, match="shared"):
        moe_forward(x, weights, spec=moe_spec(E, 2, F, d_shared=2))
    with pytest.raises(ValueError, match=r"E = 3 experts of width F = 5, expected "
                                         r"spec.router.n_experts = 4 and spec.experts.d_ff = 5"):
        moe_forward(x, weights, spec=moe_spec(4, 2, F))
    with pytest.raises(TypeError, match="moe: spec must be a MoESpec, got RouterSpec"):
        moe_forward(x, weights, spec=RouterSpec(E, 2))
    with pytest.raises(ValueError, match="score"):
        RouterSpec(E, 1, "relu")
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_choice_forward(x, w, **ex, capacity_factor=0)


# ---------------------------------------------------------------------------- collapse
def collapsed_router(N=512, D=16, E=8):
    """Tokens with a constant feature and a router whose column 0 loves it: expert 0 takes
    about a third of the slots (balance is 1/E = 12.5%)."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((N, D))
    x[:, 0] = 1.0
    w = 0.3 * rng.standard_normal((D, E))
    w[0, 0] = 1.5
    return x, w


def slot_shares(x, w, k, score="softmax", selection_bias=None):
    spec = RouterSpec(w.shape[1], k, score)
    (_, idx, _, _), cache = router_forward(x, w, spec=spec, selection_bias=selection_bias)
    return np.bincount(idx.ravel(), minlength=w.shape[1]) / idx.size, cache


def test_balance_loss_gradient_descent_cures_router_collapse():
    x, w = collapsed_router()
    E, k = w.shape[1], 2
    assert slot_shares(x, w, k)[0].max() > 2 / E
    for _ in range(300):
        (_, idx, probs, _), r_cache = router_forward(x, w, spec=RouterSpec(E, k))
        _, b_cache = balance_loss_forward(probs, idx)
        dprobs = balance_loss_backward(1.0, b_cache)["probs"]
        w = w - 1.0 * router_backward((None, None, dprobs, None), r_cache)["w_router"]
    assert slot_shares(x, w, k)[0].max() < 2 / E


@pytest.mark.parametrize("score", ["softmax", "sigmoid"])
def test_aux_loss_free_bias_cures_router_collapse(score):
    x, w = collapsed_router()
    E, k = w.shape[1], 2
    bias = np.zeros(E)
    assert slot_shares(x, w, k, score=score)[0].max() > 2 / E
    for _ in range(300):
        shares, cache = slot_shares(x, w, k, score=score, selection_bias=bias)
        bias = update_selection_bias(bias, np.bincount(cache.topk_idx.ravel(), minlength=E),
                                     1e-3)
    assert slot_shares(x, w, k, score=score, selection_bias=bias)[0].max() < 2 / E


def test_update_selection_bias_raises_underloaded_experts():
    bias = np.zeros(4, np.float32)
    new = update_selection_bias(bias, np.array([10, 2, 4, 4]), 0.5)
    assert new.tolist() == [-0.5, 0.5, 0.5, 0.5] and new.dtype == np.float32
    assert bias.tolist() == [0, 0, 0, 0]  # pure


# ---------------------------------------------------------------------------- expert choice
def test_expert_choice_gradients_and_balance():
    rng = np.random.default_rng(12)
    N, D, E, F = 9, 6, 4, 5
    while True:
        x, w = rng.standard_normal((N, D)), rng.standard_normal((D, E))
        if topk_margin(ops.softmax_forward(x @ w)[0].T, 5).min() > 1e-3:
            break
    inputs = dict(x=x, w_router=w, capacity_factor=2.0, **experts(rng, E, D, F))
    cache = expert_choice_forward(**inputs)[1]
    assert cache.token_idx.shape == (E, 5)  # every expert takes exactly C = ceil(2 * 9 / 4)
    assert cache.experts_per_token.sum() == E * 5
    assert_selection_stable(lambda **kw: expert_choice_forward(**kw)[1].token_idx, inputs,
                            ["x", "w_router"])
    report = check(expert_choice_forward, expert_choice_backward, rng=rng, **inputs)
    assert report.ok, f"\n{report}"


def test_expert_choice_matches_direct_sum():
    rng = np.random.default_rng(13)
    N, D, E, F = 10, 4, 3, 5
    x, w, ex = rng.standard_normal((N, D)), rng.standard_normal((D, E)), experts(rng, E, D, F)
    y, _ = expert_choice_forward(x, w, **ex, capacity_factor=1.0)
    S = np.exp(x @ w) / np.exp(x @ w).sum(-1, keepdims=True)
    C = math.ceil(N / E)
    direct = np.zeros_like(x)
    for e in range(E):
        for n in np.argsort(-S[:, e])[:C]:
            direct[n] += S[n, e] * ops.swiglu_forward(x[n], ex["w1"][e], ex["w3"][e],
                                                      ex["w2"][e])[0]
    assert np.allclose(y, direct, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------- module
def test_moe_module_calls_the_pair_and_keeps_the_bias_as_state():
    rng = np.random.default_rng(14)
    layer = MoE(6, moe_spec(4, 2, 5, "sigmoid", 1.0, 3), rng=rng, dtype=np.float64)
    names = [n for n, _ in layer.named_parameters()]
    assert names == ["w_router", "w1", "w3", "w2", "shared_w1", "shared_w3", "shared_w2"]
    x = rng.standard_normal((2, 5, 6))
    (y, aux, z), cache = layer.forward(x)
    dout = (rng.standard_normal(y.shape), 0.3, 0.1)
    dx = layer.backward(dout, cache)
    layer.backward(dout, cache)  # grads accumulate
    g = moe_backward(dout, cache)
    assert np.allclose(dx, g["x"]) and np.allclose(layer.w1.grad, 2 * g["w"].w1)
    assert np.allclose(layer.shared_w2.grad, 2 * g["w"].shared_w2)
    plain = MoE(6, moe_spec(4, 2, 5), rng=rng)  # no shared experts, float32
    assert [n for n, _ in plain.named_parameters()] == ["w_router", "w1", "w3", "w2"]
    (y32, _, _), c32 = plain.forward(x.astype(np.float32))
    assert y32.dtype == np.float32 and plain.backward((y32, None, None), c32).shape == x.shape
    shared_bias = layer.selection_bias
    layer.update_bias(cache.tokens_per_expert, 0.01)
    assert layer.selection_bias is shared_bias  # in place: data-parallel replicas share it
    assert np.abs(layer.selection_bias).max() == 0.01 and layer.n_params() == sum(
        p.data.size for p in layer.parameters())


def test_moe_module_aux_losses_are_the_weighted_terms_and_aux_dout_their_gradient():
    rng = np.random.default_rng(15)
    spec = MoESpec(RouterSpec(4, 2), ExpertsSpec(d_ff=5), balance_coef=0.02, z_coef=0.003)
    layer = MoE(6, spec, rng=rng, dtype=np.float64)
    x = rng.standard_normal((2, 5, 6))
    (y, aux, z), cache = layer.forward(x)
    (name_b, balance), (name_z, zl) = layer.aux_losses(cache)
    assert (name_b, name_z) == ("balance", "z")
    assert balance == 0.02 * aux and zl == 0.003 * z
    dy = rng.standard_normal(y.shape)
    dout = layer.aux_dout(dy, 0.5)
    assert dout.y is dy and dout.aux == 0.5 * 0.02 and dout.z == 0.5 * 0.003
    assert dout.aux.dtype == np.float64
