"""Gradient-check cases of scratchllm.moe: routers (with the routing options of real
checkpoints), experts (SwiGLU, clamped, plain MLP, ReLU), the balance losses (per batch and
per sequence) and the z-loss, the MoE layer, expert choice, Switch's layer and its stack's
router losses. Inputs are drawn away from routing
ties and clamp boundaries, so no finite-difference step flips a decision."""
import numpy as np

from grads.cases._common import case
from grads.check import check


def _routing_inputs(rng, N, D, E, k, score="softmax", bias=False, margin=1e-3):
    """Draw x (N, D), w_router (D, E) [and a selection bias] until every token's top-k choice
    is at least `margin` from a tie, far above what a 1e-5 step can move: no flips in the check."""
    from scratchllm.moe import router_forward, topk_margin
    from scratchllm.specs import RouterSpec
    while True:
        x, w = rng.standard_normal((N, D)), rng.standard_normal((D, E))
        b = 0.05 * rng.standard_normal(E) if bias else None
        _, cache = router_forward(x, w, spec=RouterSpec(E, k, score), selection_bias=b)
        if topk_margin(cache.score_cache.y + (0 if b is None else b), k).min() > margin:
            return x, w, b


@case
def router(rng):
    from scratchllm.moe import router_backward, router_forward
    from scratchllm.specs import RouterSpec
    reports = []
    for score, bias in (("softmax", False), ("sigmoid", True)):
        x, w, b = _routing_inputs(rng, 7, 6, 5, 2, score, bias)
        reports.append(check(router_forward, router_backward, rng=rng, wrt=["x", "w_router"],
                             label=score + (" + bias" if bias else ""), x=x, w_router=w,
                             spec=RouterSpec(5, 2, score), selection_bias=b))
    return reports


ROUTINGS = {  # router options of real checkpoints: score, selection bias?, logit bias?, options
    "gpt-oss: logit bias, softmax over the chosen k (+ clamped experts in moe)": (
        "softmax", False, True, {}),
    "deepseek-v3: sigmoid + bias, groups 4 -> 2, r = 2.5": (
        "sigmoid", True, False, dict(n_group=4, topk_group=2, routed_scaling_factor=2.5)),
    "deepseek-v2: softmax, groups 2 -> 1 by their max, not normalised": (
        "softmax", False, False, dict(n_group=2, topk_group=1, norm_topk_prob=False,
                                      group_top=1)),
}


def _routed_inputs(rng, N, D, E, k, score, bias, logit_bias, options, margin=1e-3):
    """x, w_router (b_router, selection_bias) drawn until every row's choice (groups and
    top-k) is at least `margin` from a tie: no finite-difference step flips a decision."""
    from scratchllm.moe import router_forward, selection_margin
    from scratchllm.specs import RouterSpec
    while True:
        x, w = rng.standard_normal((N, D)), rng.standard_normal((D, E))
        b_r = rng.standard_normal(E) if logit_bias else None
        b = 0.05 * rng.standard_normal(E) if bias else None
        spec = RouterSpec(E, k, score, bias=logit_bias, **options)
        _, cache = router_forward(x, w, b_r, spec=spec, selection_bias=b)
        sel = cache.score_cache.y + (0 if b is None else b)
        if selection_margin(sel, k, spec.n_group, spec.topk_group,
                            spec.group_top).min() > margin:
            return dict(x=x, w_router=w, b_router=b_r, spec=spec, selection_bias=b)


@case
def router_routing(rng):
    from scratchllm.moe import router_backward, router_forward
    return [check(router_forward, router_backward, rng=rng, label=label,
                  wrt=["x", "w_router"] + ["b_router"] * logit_bias,
                  **_routed_inputs(rng, 7, 6, 8, 3, score, bias, logit_bias, options))
            for label, (score, bias, logit_bias, options) in ROUTINGS.items()]


@case
def normalise(rng):
    from scratchllm.moe import normalise_backward, normalise_forward
    return check(normalise_forward, normalise_backward, rng=rng, u=rng.uniform(0.1, 2, (5, 4)))


@case
def experts(rng):
    from scratchllm.moe import experts_backward, experts_forward
    M, D, E, F = 9, 6, 4, 5  # expert 2 gets no rows
    return check(experts_forward, experts_backward, rng=rng, xs=rng.standard_normal((M, D)),
                 bounds=np.array([0, 3, 7, 7, 9]), w1=rng.standard_normal((E, D, F)),
                 w3=rng.standard_normal((E, D, F)), w2=rng.standard_normal((E, F, D)))


def _far_from_clamps(h, limit, margin=1e-3):
    """Whether every gate (even column) and up (odd column) pre-activation of h lies >= margin
    from its clamp boundary (gate = limit, up = +-limit), with some on each side of them."""
    gate, up = h[..., 0::2], np.abs(h[..., 1::2])
    return bool(min(np.abs(gate - limit).min(), np.abs(up - limit).min()) > margin
                and (gate > limit).any() and (up > limit).any() and (up < limit).any())


@case
def clamped_swiglu(rng):
    from scratchllm.moe import clamped_swiglu_backward, clamped_swiglu_forward
    D, F, limit = 6, 5, 1.5  # a small limit, so that both clamps bind somewhere
    while True:
        x, gu, b = (rng.standard_normal((2, 3, D)), rng.standard_normal((D, 2 * F)),
                    rng.standard_normal(2 * F))
        if _far_from_clamps(x @ gu + b, limit):
            break
    return check(clamped_swiglu_forward, clamped_swiglu_backward, rng=rng, x=x, gate_up=gu,
                 gate_up_b=b, down=rng.standard_normal((F, D)), down_b=rng.standard_normal(D),
                 alpha=1.702, limit=limit)


@case
def clamped_experts(rng):
    from scratchllm.moe import clamped_experts_backward, clamped_experts_forward
    M, D, E, F, limit = 9, 6, 4, 5, 2.0
    bounds = np.array([0, 3, 7, 7, 9])  # expert 2 gets no rows
    while True:
        x, gu, b = (rng.standard_normal((M, D)), rng.standard_normal((E, D, 2 * F)),
                    rng.standard_normal((E, 2 * F)))
        h = np.concatenate([x[bounds[i]:bounds[i + 1]] @ gu[i] + b[i] for i in range(E)])
        if _far_from_clamps(h, limit):
            break
    return check(clamped_experts_forward, clamped_experts_backward, rng=rng, xs=x,
                 bounds=bounds, gate_up=gu, gate_up_b=b, down=rng.standard_normal((E, F, D)),
                 down_b=rng.standard_normal((E, D)), alpha=1.702, limit=limit)


@case
def balance_loss(rng):
    from scratchllm.moe import balance_loss_backward, balance_loss_forward
    from scratchllm.core.ops import softmax_forward
    probs = softmax_forward(rng.standard_normal((9, 5)))[0]
    topk_idx = np.argsort(-probs, axis=-1)[:, :2]
    return check(balance_loss_forward, balance_loss_backward, rng=rng,
                 probs=probs, topk_idx=topk_idx)


@case
def z_loss(rng):
    from scratchllm.moe import z_loss_backward, z_loss_forward
    return check(z_loss_forward, z_loss_backward, rng=rng, logits=3 * rng.standard_normal((9, 5)))


@case
def moe(rng):
    from scratchllm.moe import MoEWeights, moe_backward, moe_forward
    from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec
    N, D, E, F, Fs, k = 11, 6, 4, 5, 3, 2
    reports = []
    variants = (("softmax", False, 0.75), ("sigmoid", True, 1.0), ("softmax", True, None),
                ("sigmoid", False, "input"),  # the gate on the experts' input (Llama 4)
                ("softmax", False, "shared gate"))  # a gate on the shared expert (Qwen3-Next)
    for score, bias, c in variants:
        gate_input, shared_gate = c == "input", c == "shared gate"
        c = None if isinstance(c, str) else c
        x, w, b = _routing_inputs(rng, N, D, E, k, score, bias)
        experts = dict(w1=rng.standard_normal((E, D, F)), w3=rng.standard_normal((E, D, F)),
                       w2=rng.standard_normal((E, F, D)))
        shared = dict(shared_w1=rng.standard_normal((D, Fs)), shared_w3=rng.standard_normal(
            (D, Fs)), shared_w2=rng.standard_normal((Fs, D))) if c is not None or gate_input \
            or shared_gate else {}
        if shared_gate:
            shared["shared_gate"] = rng.standard_normal(D)
        label = f"{score}{' + bias' if bias else ''}, capacity {c}{', shared' if shared else ''}"
        label += ", gate on the input" if gate_input else ", gated" if shared_gate else ""
        spec = MoESpec(RouterSpec(E, k, score, norm_topk_prob=not gate_input),
                       ExpertsSpec(d_ff=F), c, Fs if shared else 0, gate_input=gate_input,
                       shared_gate=shared_gate)
        reports.append(check(moe_forward, moe_backward, rng=rng, label=label, wrt=["x", "w"],
                             x=x, w=MoEWeights(w, **experts, **shared), spec=spec,
                             selection_bias=b))
    return reports


def _gpt_oss_experts(rng, x, E, F, limit):
    """gpt-oss expert weights (E, D, 2F), (E, 2F), (E, F, D), (E, D) whose gate/up
    pre-activations on every row of x lie away from the clamps (_far_from_clamps)."""
    D = x.shape[-1]
    while True:
        gu, b = rng.standard_normal((E, D, 2 * F)), rng.standard_normal((E, 2 * F))
        if all(_far_from_clamps(x @ gu[i] + b[i], limit) for i in range(E)):
            return dict(gate_up=gu, gate_up_b=b, down=rng.standard_normal((E, F, D)),
                        down_b=rng.standard_normal((E, D)))


@case
def moe_routing(rng):
    from scratchllm.moe import MoEWeights, moe_backward, moe_forward
    from scratchllm.specs import ExpertsSpec, MoESpec
    N, D, E, F, Fs, k = 11, 6, 8, 5, 3, 3
    reports = []
    for label, (score, bias, logit_bias, options) in ROUTINGS.items():
        r = _routed_inputs(rng, N, D, E, k, score, bias, logit_bias, options)
        experts = dict(w1=rng.standard_normal((E, D, F)), w3=rng.standard_normal((E, D, F)),
                       w2=rng.standard_normal((E, F, D)))
        kind = ExpertsSpec(d_ff=F)
        if logit_bias:  # gpt-oss: its clamped experts too, every pre-activation off the clamps
            experts = _gpt_oss_experts(rng, r["x"], E, F, limit=2.5)
            kind = ExpertsSpec("clamped", F, limit=2.5)
        shared = dict(shared_w1=rng.standard_normal((D, Fs)), shared_w3=rng.standard_normal(
            (D, Fs)), shared_w2=rng.standard_normal((Fs, D)))
        w = MoEWeights(r["w_router"], r["b_router"], **experts, **shared)
        reports.append(check(moe_forward, moe_backward, rng=rng, label=label, max_full=100,
                             wrt=["x", "w"], x=r["x"], w=w,
                             spec=MoESpec(r["spec"], kind, d_shared=Fs),
                             selection_bias=r["selection_bias"]))
    return reports


@case
def expert_choice(rng):
    from scratchllm.moe import expert_choice_backward, expert_choice_forward
    from scratchllm.moe import topk_margin
    from scratchllm.core.ops import softmax_forward
    N, D, E, F = 9, 6, 4, 5
    while True:  # each expert's top-C token choice far from a tie (C = ceil(2 * 9 / 4) = 5)
        x, w = rng.standard_normal((N, D)), rng.standard_normal((D, E))
        if topk_margin(softmax_forward(x @ w)[0].T, 5).min() > 1e-3:
            break
    return check(expert_choice_forward, expert_choice_backward, rng=rng, x=x, w_router=w,
                 w1=rng.standard_normal((E, D, F)), w3=rng.standard_normal((E, D, F)),
                 w2=rng.standard_normal((E, F, D)), capacity_factor=2.0)


@case
def mlp_experts(rng):
    from scratchllm.moe import mlp_experts_backward, mlp_experts_forward
    M, D, E, F = 9, 6, 4, 5  # expert 2 gets no rows
    return check(mlp_experts_forward, mlp_experts_backward, rng=rng,
                 xs=rng.standard_normal((M, D)), bounds=np.array([0, 3, 7, 7, 9]),
                 w1=rng.standard_normal((E, D, F)), b1=rng.standard_normal((E, F)),
                 w2=rng.standard_normal((E, F, D)), b2=rng.standard_normal((E, D)))


@case
def sequence_balance_loss(rng):
    from scratchllm.moe import sequence_balance_loss_backward, sequence_balance_loss_forward
    B, T, E, K = 3, 5, 7, 2
    topk_idx = np.stack([[rng.choice(E, K, replace=False) for _ in range(T)]
                         for _ in range(B)])  # (B, T, K)
    e = np.exp(rng.standard_normal((B, T, E)))  # (B, T, E)
    return [check(sequence_balance_loss_forward, sequence_balance_loss_backward, rng=rng,
                  label=label, scores=scores, topk_idx=topk_idx)
            for label, scores in (("sigmoid scores", rng.uniform(0.05, 0.95, (B, T, E))),
                                  ("softmax probabilities", e / e.sum(-1, keepdims=True)))]


@case
def moe_mlp_experts(rng):
    from scratchllm.moe import MoEWeights, moe_backward, moe_forward
    from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec
    N, D, E, F, k = 11, 6, 4, 5, 2
    x, w, _ = _routing_inputs(rng, N, D, E, k)
    weights = MoEWeights(w, w1=rng.standard_normal((E, D, F)), b1=rng.standard_normal((E, F)),
                         w2=rng.standard_normal((E, F, D)), b2=rng.standard_normal((E, D)))
    return check(moe_forward, moe_backward, rng=rng, label="plain MLP experts, capacity 0.75",
                 wrt=["x", "w"], x=x, w=weights,
                 spec=MoESpec(RouterSpec(E, k), ExpertsSpec("mlp", F), 0.75))


@case
def relu_experts(rng):
    from scratchllm.moe import relu_experts_backward, relu_experts_forward
    M, D, E, F = 9, 6, 4, 5  # expert 2 gets no rows
    return check(relu_experts_forward, relu_experts_backward, rng=rng,
                 xs=rng.standard_normal((M, D)), bounds=np.array([0, 3, 7, 7, 9]),
                 w1=rng.standard_normal((E, D, F)), w2=rng.standard_normal((E, F, D)))


@case
def switch_moe(rng):
    """Switch's layer on (2, 7) tokens, 4 experts of capacity 1 per sequence (3 or more
    tokens of each sequence dropped), the router logits' gradient included."""
    from scratchllm.moe import MoEWeights, switch_moe_backward, switch_moe_forward
    from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec
    B, T, D, E, F = 2, 7, 6, 4, 5
    x, w, _ = _routing_inputs(rng, B * T, D, E, 1)
    spec = MoESpec(RouterSpec(E, 1, norm_topk_prob=False), ExpertsSpec("relu", F),
                   expert_capacity=1)
    weights = MoEWeights(w, w1=rng.standard_normal((E, D, F)), w2=rng.standard_normal((E, F, D)))
    return check(switch_moe_forward, switch_moe_backward, rng=rng, wrt=["x", "w"],
                 x=x.reshape(B, T, D), w=weights, spec=spec)


@case
def router_losses(rng):
    """Switch's stack losses (z and sequence balance) over 3 layers' logits (3, 2, 5, 4)."""
    from scratchllm.moe import router_losses_backward, router_losses_forward
    return check(router_losses_forward, router_losses_backward, rng=rng,
                 logits=2 * rng.standard_normal((3, 2, 5, 4)))
