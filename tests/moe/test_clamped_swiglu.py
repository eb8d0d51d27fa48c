"""gpt-oss's expert, the clamped SwiGLU with biases: against transformers' GptOssExperts and
GptOssMLP transcribed, the clamps as kinks (zero gradient past them, `kink` exactly at them),
the MoE layer and Module with these experts, bad input."""
import numpy as np
import pytest

from grads.cases import CASES
from grads.check import check
from scratchllm.moe import (MoE, MoEWeights, clamped_experts_forward, clamped_swiglu_backward,
                            clamped_swiglu_forward, dispatch, moe_backward, moe_forward,
                            moe_forward_ref)
from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec


def gpt_oss_spec(E, k, F, alpha=1.702, limit=7.0):
    """gpt-oss's MoE layer: a router with a logit bias, clamped experts of width F."""
    return MoESpec(RouterSpec(E, k, bias=True), ExpertsSpec("clamped", F, alpha, limit))


@pytest.mark.parametrize("name", ["clamped_swiglu", "clamped_experts"])
def test_gradient_check(name):
    report = CASES[name](np.random.default_rng(0))
    assert report.ok, str(report)


def hf_gpt_oss_experts(x, router_indices, routing_weights, gate_up_proj, gate_up_proj_bias,
                       down_proj, down_proj_bias, alpha, limit):
    """huggingface/transformers src/transformers/models/gpt_oss/modeling_gpt_oss.py
    GptOssExperts.forward and _apply_gate, transcribed (weights stored (E, D, 2F), x @ W)."""
    next_states = np.zeros_like(x)
    for e in range(gate_up_proj.shape[0]):
        top_k_pos, token_idx = np.nonzero((router_indices == e).T)
        if token_idx.size == 0:
            continue
        gate_up = x[token_idx] @ gate_up_proj[e] + gate_up_proj_bias[e]
        gate, up = gate_up[..., ::2], gate_up[..., 1::2]
        gate = np.minimum(gate, limit)
        up = np.clip(up, -limit, limit)
        glu = gate / (1 + np.exp(-gate * alpha))
        out = ((up + 1) * glu) @ down_proj[e] + down_proj_bias[e]
        np.add.at(next_states, token_idx, out * routing_weights[token_idx, top_k_pos, None])
    return next_states


def test_experts_equal_gpt_oss():
    rng = np.random.default_rng(1)
    N, D, E, F, k, limit = 13, 6, 5, 4, 2, 7.0
    x = 3 * rng.standard_normal((N, D))  # |h| up to ~20: both clamps bind at limit 7
    idx = np.argsort(rng.random((N, E)), axis=-1)[:, :k]  # distinct experts per token
    weights = rng.random((N, k))
    w = dict(gate_up=rng.standard_normal((E, D, 2 * F)), gate_up_b=rng.standard_normal((E, 2 * F)),
             down=rng.standard_normal((E, F, D)), down_b=rng.standard_normal((E, D)))
    want = hf_gpt_oss_experts(x, idx, weights, *w.values(), alpha=1.702, limit=limit)
    disp = dispatch(idx, E, N * k)
    ys, _ = clamped_experts_forward(x[disp.slots // k], disp.bounds, **w, limit=limit)
    y = np.zeros_like(x)
    np.add.at(y, disp.slots // k, weights.reshape(-1)[disp.slots, None] * ys)
    np.testing.assert_allclose(y, want, rtol=1e-13, atol=1e-13)
    h = x @ w["gate_up"][0]
    assert (h[:, 0::2] > limit).any() and (np.abs(h[:, 1::2]) > limit).any()


def test_no_gradient_past_the_clamps():
    rng = np.random.default_rng(2)
    D, F, limit = 5, 3, 7.0
    x, gu, down = rng.standard_normal((4, D)), rng.standard_normal((D, 2 * F)), \
        rng.standard_normal((F, D))
    b = rng.standard_normal(2 * F)
    b[0] = limit + 100  # gate 0 above the limit on every row
    b[3] = -limit - 100  # up 1 below -limit on every row
    y, cache = clamped_swiglu_forward(x, gu, b, down, None, limit=limit)
    g = clamped_swiglu_backward(rng.standard_normal(y.shape), cache)
    assert g["gate_up_b"][0] == 0 and np.all(g["gate_up"][:, 0] == 0)
    assert g["gate_up_b"][3] == 0 and np.all(g["gate_up"][:, 3] == 0)
    assert np.all(g["gate_up_b"][[1, 2, 4, 5]] != 0)
    assert set(g) == {"x", "gate_up", "gate_up_b", "down"}  # no down_b given, no entry


@pytest.mark.parametrize("column, boundary", [(2, 7.0), (3, 7.0), (3, -7.0)])
def test_checker_reports_kink_exactly_at_a_clamp(column, boundary):
    """A gate (even column) at +limit, or an up (odd column) at +-limit: the one-sided slopes
    differ there, and the checker says `kink` (neither ok nor FAIL)."""
    rng = np.random.default_rng(3)
    D, F = 5, 3
    x, gu = 0.3 * rng.standard_normal((1, D)), 0.3 * rng.standard_normal((D, 2 * F))
    b = 0.3 * rng.standard_normal(2 * F)
    b[column] = boundary - (x @ gu)[0, column]  # h[0, column] = boundary (to round-off)
    inputs = dict(x=x, gate_up=gu, gate_up_b=b, down=rng.standard_normal((F, D)),
                  down_b=rng.standard_normal(D), limit=7.0)
    report = check(clamped_swiglu_forward, clamped_swiglu_backward, rng=rng,
                   wrt=["gate_up_b"], **inputs)
    assert [r.status for r in report.rows] == ["kink"], str(report)
    b[column] += 0.01 if boundary < 0 or column % 2 == 0 else -0.01  # moved inside the clamp
    assert check(clamped_swiglu_forward, clamped_swiglu_backward, rng=rng,
                 wrt=["gate_up_b"], **inputs).ok


def test_float32_and_bad_inputs():
    rng = np.random.default_rng(4)
    x, gu = rng.standard_normal((3, 4)).astype(np.float32), \
        rng.standard_normal((4, 6)).astype(np.float32)
    down = rng.standard_normal((3, 4)).astype(np.float32)
    y, _ = clamped_swiglu_forward(x, gu, np.zeros(6, np.float32), down, None)
    assert y.dtype == np.float32
    with pytest.raises(ValueError, match=r"clamped_swiglu: gate_up has shape \(4, 5\)"):
        clamped_swiglu_forward(x, gu[:, :5], None, down, None)
    with pytest.raises(ValueError, match=r"clamped_swiglu: down has shape \(2, 4\), expected"):
        clamped_swiglu_forward(x, gu, None, down[:2], None)
    with pytest.raises(ValueError, match="clamped_swiglu: limit must be > 0"):
        clamped_swiglu_forward(x, gu, None, down, None, limit=0.0)
    with pytest.raises(TypeError, match="clamped_experts: gate_up_b must be a float array"):
        clamped_experts_forward(x, np.array([0, 3]), gu[None], None, down[None], None)


def test_moe_layer_equals_gpt_oss_mlp():
    """GptOssMLP = GptOssTopKRouter (logits x W^T + b, top-k, softmax over the k) + the
    experts: moe_forward with b_router and the clamped experts, and its _ref twin."""
    rng = np.random.default_rng(5)
    N, D, E, F, k = 12, 6, 5, 4, 2
    x, weight, bias = 3 * rng.standard_normal((N, D)), rng.standard_normal((E, D)), \
        rng.standard_normal(E)
    w = dict(gate_up=rng.standard_normal((E, D, 2 * F)), gate_up_b=rng.standard_normal((E, 2 * F)),
             down=rng.standard_normal((E, F, D)), down_b=rng.standard_normal((E, D)))
    logits = x @ weight.T + bias
    idx = np.argsort(-logits, axis=-1)[:, :k]
    top = np.take_along_axis(logits, idx, axis=-1)
    scores = np.exp(top) / np.exp(top).sum(axis=1, keepdims=True)
    want = hf_gpt_oss_experts(x, idx, scores, *w.values(), alpha=1.702, limit=7.0)
    weights = MoEWeights(weight.T.copy(), bias, **w)
    (y, _, _), _ = moe_forward(x, weights, spec=gpt_oss_spec(E, k, F))
    np.testing.assert_allclose(y, want, rtol=1e-13, atol=1e-13)
    (y_ref, _, _), _ = moe_forward_ref(x, weights, spec=gpt_oss_spec(E, k, F))
    np.testing.assert_allclose(y_ref, want, rtol=1e-13, atol=1e-13)
    (y_lim, _, _), _ = moe_forward(x, weights, spec=gpt_oss_spec(E, k, F, alpha=1.0, limit=3.0))
    want_lim = hf_gpt_oss_experts(x, idx, scores, *w.values(), alpha=1.0, limit=3.0)
    np.testing.assert_allclose(y_lim, want_lim, rtol=1e-13, atol=1e-13)


def test_module_with_clamped_experts():
    rng = np.random.default_rng(6)
    spec = gpt_oss_spec(5, 2, 4, limit=3.0)
    m = MoE(6, spec, rng=rng, dtype=np.float64)
    names = [n for n, _ in m.named_parameters()]
    assert names == ["w_router", "b_router", "gate_up", "gate_up_b", "down", "down_b"]
    assert m.gate_up.data.shape == (5, 6, 8) and np.all(m.down_b.data == 0)
    x = rng.standard_normal((2, 3, 6))
    out, cache = m.forward(x)
    want, _ = moe_forward(x, MoEWeights(**{n: p.data for n, p in m.named_parameters()}),
                          spec=spec, selection_bias=m.selection_bias)
    np.testing.assert_array_equal(out.y, want.y)
    dy = rng.standard_normal(x.shape)
    m.backward((dy, None, None), cache)
    grads = moe_backward((dy, None, None), cache)
    for name, p in m.named_parameters():
        np.testing.assert_array_equal(p.grad, getattr(grads["w"], name))


def test_moe_expert_sets_are_checked():
    rng = np.random.default_rng(7)
    x, w_router = rng.standard_normal((4, 6)), rng.standard_normal((6, 5))
    w = dict(gate_up=rng.standard_normal((5, 6, 8)), gate_up_b=rng.standard_normal((5, 8)),
             down=rng.standard_normal((5, 4, 6)), down_b=rng.standard_normal((5, 6)))
    weights = MoEWeights(w_router, rng.standard_normal(5), **w)
    with pytest.raises(ValueError, match=r"moe: spec.experts.kind 'clamped' takes the experts "
                                         r"\['gate_up', 'gate_up_b', 'down', 'down_b'\], got w "
                                         r"with \['w1', 'gate_up', 'gate_up_b', 'down', "
                                         r"'down_b'\]"):
        moe_forward(x, weights._replace(w1=rng.standard_normal((5, 6, 4))),
                    spec=gpt_oss_spec(5, 2, 4))
    with pytest.raises(ValueError, match=r"moe: down has shape \(5, 3, 6\), expected"):
        moe_forward(x, weights._replace(down=w["down"][:, :3]), spec=gpt_oss_spec(5, 2, 4))
    swiglu = [rng.standard_normal(s) for s in ((5, 6, 4), (5, 6, 4), (5, 4, 6))]
    with pytest.raises(ValueError, match=r"moe: spec.experts.kind 'clamped' takes the experts "
                                         r".* got w with \['w1', 'w3', 'w2'\]"):
        moe_forward(x, MoEWeights(w_router, weights.b_router, *swiglu),
                    spec=gpt_oss_spec(5, 2, 4))
    with pytest.raises(ValueError, match="ExpertsSpec: kind must be one of"):
        ExpertsSpec("tanh")
