"""Fine-grained experts (split_experts / merge_experts) leave the layer unchanged; DeepSeek-V3's
per-sequence balance loss against the Switch loss run on each sequence; the plain MLP experts
against a per-token loop; the chapter's worked routing table from the router."""
import math

import numpy as np
import pytest
from scipy.special import erf

from scratchllm.moe import (MoE, MoEWeights, balance_loss_forward, merge_experts, moe_forward,
                            moe_forward_ref, router_forward, sequence_balance_loss_forward,
                            split_experts)
from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec

D, E, F, K = 6, 4, 6, 2


def _layer(rng, kind, score="softmax", capacity=None, shared=False, router_bias=False):
    ex = {"swiglu": dict(w1=(E, D, F), w3=(E, D, F), w2=(E, F, D)),
          "clamped": dict(gate_up=(E, D, 2 * F), gate_up_b=(E, 2 * F), down=(E, F, D),
                          down_b=(E, D)),
          "mlp": dict(w1=(E, D, F), b1=(E, F), w2=(E, F, D), b2=(E, D))}[kind]
    arrays = {n: rng.normal(0, 0.5, s) for n, s in ex.items()}
    if shared:
        arrays.update(shared_w1=rng.normal(0, 0.5, (D, 3)), shared_w3=rng.normal(0, 0.5, (D, 3)),
                      shared_w2=rng.normal(0, 0.5, (3, D)))
    w = MoEWeights(rng.standard_normal((D, E)), rng.standard_normal(E) if router_bias else None,
                   **arrays)
    spec = MoESpec(RouterSpec(E, K, score, bias=router_bias), ExpertsSpec(kind, F), capacity,
                   3 if shared else 0)
    return w, spec


@pytest.mark.parametrize("kind, score, capacity, shared, bias", [
    ("swiglu", "softmax", None, False, False), ("swiglu", "sigmoid", 0.75, True, False),
    ("clamped", "softmax", None, False, True), ("mlp", "softmax", 1.0, False, False)])
@pytest.mark.parametrize("m", [2, 3])
def test_split_experts_keeps_the_layer(kind, score, capacity, shared, bias, m):
    rng = np.random.default_rng(m)
    w, spec = _layer(rng, kind, score, capacity, shared, bias)
    x = rng.standard_normal((2, 7, D))
    fine_w, fine_spec = split_experts(w, spec, m)
    assert fine_spec.router.n_experts == m * E and fine_spec.router.top_k == m * K
    assert fine_spec.experts.d_ff == F // m
    assert (fine_spec.experts.n_params(D) * m * E == spec.experts.n_params(D) * E
            + (m - 1) * E * D * (kind != "swiglu"))  # only the copied output bias grows
    out, cache = moe_forward(x, w, spec=spec)
    fine, fine_cache = moe_forward(x, fine_w, spec=fine_spec)
    np.testing.assert_allclose(fine.y, out.y, atol=1e-12)
    np.testing.assert_allclose(fine.aux, out.aux, atol=1e-12)  # the balance loss too
    assert fine_cache.n_dropped == m * cache.n_dropped  # the same tokens dropped, m slots each
    np.testing.assert_allclose(fine.z, (np.sqrt(out.z) + math.log(m)) ** 2, rtol=0.2)
    back, back_spec = merge_experts(fine_w, fine_spec, m)
    assert back_spec == spec
    for name in MoEWeights._fields:
        a, b = getattr(w, name), getattr(back, name)
        assert (a is None) == (b is None), name
        if a is not None:
            np.testing.assert_allclose(b, a, rtol=1e-15, atol=0, err_msg=name)


def test_split_experts_refuses():
    w, spec = _layer(np.random.default_rng(0), "swiglu")
    with pytest.raises(ValueError, match="divide d_ff"):
        split_experts(w, spec, 4)
    grouped = MoESpec(RouterSpec(E, K, n_group=2, topk_group=1), ExpertsSpec(d_ff=F))
    with pytest.raises(ValueError, match="group"):
        split_experts(w, grouped, 2)


def test_sequence_loss_is_the_switch_loss_per_sequence():
    rng = np.random.default_rng(5)
    B, T = 3, 8
    scores = rng.uniform(0.05, 0.95, (B, T, E))  # sigmoid-like, not normalised
    idx = np.argsort(-scores, axis=-1)[..., :K]  # (B, T, K)
    loss, _ = sequence_balance_loss_forward(scores, idx)
    per_seq = [balance_loss_forward(s / s.sum(-1, keepdims=True), i)[0]
               for s, i in zip(scores, idx)]
    np.testing.assert_allclose(loss, np.mean(per_seq), rtol=1e-13)


def test_balanced_batch_of_unbalanced_sequences():
    """Sequence 0 sends every token to E0, E1; sequence 1 to E2, E3: the batch is balanced
    (the Switch loss over the batch is 1) but each sequence is not (the sequence loss is 2)."""
    T = 6
    probs = np.full((2, T, E), 0.05)
    probs[0, :, :2], probs[1, :, 2:] = 0.45, 0.45
    idx = np.stack([np.tile([0, 1], (T, 1)), np.tile([2, 3], (T, 1))])  # (2, T, 2)
    batch, _ = balance_loss_forward(probs.reshape(-1, E), idx.reshape(-1, K))
    seq, _ = sequence_balance_loss_forward(probs, idx)
    np.testing.assert_allclose(batch, 1.0, rtol=1e-14)
    np.testing.assert_allclose(seq, 2 * 0.9, rtol=1e-14)  # f = 2 on two experts, P = 0.45
    even = np.full((1, 4, E), 0.25)
    assert np.isclose(sequence_balance_loss_forward(even, np.array([[[0, 1], [2, 3], [0, 1],
                                                                     [2, 3]]]))[0], 1.0)


def test_mlp_experts_layer_equals_the_token_loop_and_the_module():
    rng = np.random.default_rng(8)
    w, spec = _layer(rng, "mlp", capacity=0.75)
    x = rng.standard_normal((11, D))
    out, _ = moe_forward(x, w, spec=spec)
    np.testing.assert_allclose(out.y, moe_forward_ref(x, w, spec=spec)[0].y, atol=1e-12)
    (gates, idx, _, _), _ = router_forward(x, w.w_router, spec=spec.router)
    C, used, y = math.ceil(0.75 * 11 * K / E), np.zeros(E, int), np.zeros_like(x)
    for n in range(11):  # written out: gates times GELU(x w1 + b1) w2 + b2 of kept slots
        for j in range(K):
            i = idx[n, j]
            if used[i] < C:
                used[i] += 1
                h = x[n] @ w.w1[i] + w.b1[i]
                y[n] += gates[n, j] * ((0.5 * h * (1 + erf(h / np.sqrt(2)))) @ w.w2[i] + w.b2[i])
    np.testing.assert_allclose(out.y, y, atol=1e-12)
    layer = MoE(D, spec, rng=rng, dtype=np.float64)
    assert {n for n in ("w1", "b1", "w2", "b2") if getattr(layer, n, None) is not None} == \
        {"w1", "b1", "w2", "b2"} and getattr(layer, "w3", None) is None
    assert sum(p.data.size for p in (layer.w1, layer.b1, layer.w2, layer.b2)) == \
        E * spec.experts.n_params(D)


def test_the_chapters_worked_routing_table():
    """Four tokens, four experts, top-2: router probabilities in, choices, gates, loads out."""
    p = np.array([[0.55, 0.05, 0.32, 0.08], [0.10, 0.60, 0.10, 0.20],
                  [0.50, 0.10, 0.30, 0.10], [0.45, 0.05, 0.40, 0.10]])
    (gates, idx, probs, _), _ = router_forward(np.log(p), np.eye(4),
                                                spec=RouterSpec(4, 2))  # logits log p
    np.testing.assert_allclose(probs, p, atol=1e-15)
    assert idx.tolist() == [[0, 2], [1, 3], [0, 2], [0, 2]]
    np.testing.assert_allclose(gates, [[0.55 / 0.87, 0.32 / 0.87], [0.75, 0.25], [0.625, 0.375],
                                       [0.45 / 0.85, 0.40 / 0.85]], rtol=1e-14)
    table = np.array([[0.63, 0.37], [0.75, 0.25], [0.63, 0.37], [0.53, 0.47]])
    assert (np.floor(gates * 100 + 0.5) / 100 == table).all()  # rounded half up, as printed
    assert np.bincount(idx.ravel(), minlength=4).tolist() == [3, 1, 3, 1]
