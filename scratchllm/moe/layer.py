"""The top-k Mixture-of-Experts layer as a forward/backward pair, its `_ref` twin, and the
MoE Module: router -> dispatch -> SwiGLU experts -> gated sum, plus shared experts.

Papers: Switch Transformer (arXiv 2101.03961), Mixtral (arXiv 2401.04088), ST-MoE
(arXiv 2202.08906), DeepSeek-V3 (arXiv 2412.19437).

Math (token n):
    (g_n, K_n, p, s) = router(x_n)                                  gates over the chosen k
    y_n = sum_{i in K_n, slot kept} g_ni SwiGLU_i(x_n) + SwiGLU_shared(x_n)
(the experts: SwiGLU (w1, w3, w2), or gpt-oss's clamped SwiGLU with biases (gate_up,
gate_up_b, down, down_b; experts.py))
    aux = E sum_i f_i P_i       z = mean_n logsumexp(s_n)^2          (losses.py)
Capacity C = ceil(c BT k / E) slots per expert; slots are kept in token order and the
overflow is dropped (zero contribution: the caller's residual carries the token).

Glossary: BT tokens (leading axes of x flattened), D model width, E experts, K top-k,
F expert hidden width, Fs shared-expert hidden width, C capacity, M kept slots (<= BT K).
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import fused, ops
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.validate import expect_douts
from scratchllm.moe.experts import (Dispatch, ExpertsCache, capacity_of, check_clamped_layer,
                                    check_layer, clamped_experts_backward,
                                    clamped_experts_forward, clamped_swiglu_forward, dispatch,
                                    experts_backward, experts_forward)
from scratchllm.moe.experts import _swiglu_backward as shared_swiglu_backward
from scratchllm.moe.losses import (BalanceLossCache, ZLossCache, balance_loss_backward,
                                   balance_loss_forward, update_selection_bias, z_loss_backward,
                                   z_loss_forward)
from scratchllm.moe.router import (RouterCache, RouterOut, check_groups, check_k,
                                   router_backward, router_forward)


# ---------------------------------------------------------------------------- moe layer
class MoEOut(NamedTuple):
    """The outputs of moe_forward (and the shape of its backward's dout; None for any output
    that receives no gradient)."""
    y: np.ndarray  # (..., D)
    aux: np.ndarray  # 0-d balance loss
    z: np.ndarray  # 0-d router z-loss


class MoECache(NamedTuple):
    x_shape: tuple
    router: RouterCache
    balance: BalanceLossCache
    z: ZLossCache
    dispatch: Dispatch
    experts: ExpertsCache
    ys: np.ndarray
    gates: np.ndarray
    shared: tuple  # the shared expert's swiglu cache (fused or ops), None without one
    clamped: bool  # gpt-oss's clamped experts (else SwiGLU)

    @property
    def tokens_per_expert(self):
        return self.dispatch.tokens_per_expert

    @property
    def n_dropped(self):
        return self.dispatch.n_dropped


def moe_forward(x, w_router, w1=None, w3=None, w2=None, *, k, capacity_factor=None,
                shared_w1=None, shared_w3=None, shared_w2=None, score="softmax",
                selection_bias=None, b_router=None, n_group=1, topk_group=1,
                norm_topk_prob=True, routed_scaling_factor=1.0, gate_up=None, gate_up_b=None,
                down=None, down_b=None, swiglu_alpha=None, swiglu_limit=None):
    """Top-k MoE of SwiGLU experts with capacity and optional shared experts.

    Inputs:  x (..., D), w_router (D, E), w1/w3 (E, D, F), w2 (E, F, D), k in [1, E],
             capacity_factor c > 0 or None, shared_w1/w3 (D, Fs), shared_w2 (Fs, D) or None,
             score "softmax" | "sigmoid", selection_bias (E,) or None (selects only);
             b_router (E,) or None, n_group, topk_group, norm_topk_prob,
             routed_scaling_factor: router options (router_forward);
             gpt-oss experts instead of w1/w3/w2: gate_up (E, D, 2F) interleaved, gate_up_b
             (E, 2F), down (E, F, D), down_b (E, D), swiglu_alpha, swiglu_limit (default
             1.702, 7.0; clamped_swiglu_forward).
    Returns: MoEOut(y (..., D), aux 0-d balance loss, z 0-d router z-loss).
    Cache:   MoECache; .tokens_per_expert (E,) routed counts, .n_dropped, .dispatch.
    """
    clamped, xf, E = _experts_given("moe", x, w_router, dict(
        w1=w1, w3=w3, w2=w2, gate_up=gate_up, gate_up_b=gate_up_b, down=down, down_b=down_b),
        swiglu_alpha, swiglu_limit)  # (BT, D)
    BT, D = xf.shape
    check_k("moe", k, E)
    C = capacity_of(BT, k, E, capacity_factor)
    (gates, topk_idx, probs, logits), r_cache = router_forward(
        xf, w_router, b_router, k=k, score=score, selection_bias=selection_bias,
        n_group=n_group, topk_group=topk_group, norm_topk_prob=norm_topk_prob,
        routed_scaling_factor=routed_scaling_factor)
    aux, b_cache = balance_loss_forward(probs, topk_idx)
    z, z_cache = z_loss_forward(logits)
    disp = dispatch(topk_idx, E, C)
    xs = xf[disp.slots // k]  # (M, D) kept tokens, grouped by expert
    if clamped:
        ys, e_cache = clamped_experts_forward(xs, disp.bounds, gate_up, gate_up_b, down, down_b,
                                              **_clamp(swiglu_alpha, swiglu_limit))  # (M, D)
    else:
        ys, e_cache = experts_forward(xs, disp.bounds, w1, w3, w2)  # (M, D)
    g = gates.reshape(-1)[disp.slots]  # (M,)
    slot_out = np.zeros((BT * k, D), x.dtype)  # (BTK, D); dropped slots stay 0
    slot_out[disp.slots] = g[:, None] * ys
    y = slot_out.reshape(BT, k, D).sum(axis=1)  # (BT, D)
    s_cache = None
    if _has_shared(shared_w1, shared_w3, shared_w2):
        swiglu = fused.fused_swiglu_forward if fused.use_fused() else ops.swiglu_forward
        y_shared, s_cache = swiglu(xf, shared_w1, shared_w3, shared_w2)  # (BT, D)
        y = y + y_shared  # (BT, D)
    cache = MoECache(x.shape, r_cache, b_cache, z_cache, disp, e_cache, ys, g, s_cache,
                     clamped)
    return MoEOut(y.reshape(x.shape), aux, z), cache


SWIGLU_EXPERTS = ("w1", "w3", "w2")
CLAMPED_EXPERTS = ("gate_up", "gate_up_b", "down", "down_b")


def _experts_given(fn, x, w_router, weights, alpha, limit):
    """Which experts a layer has, checked: SwiGLU (w1, w3, w2) or gpt-oss's clamped SwiGLU
    (gate_up, gate_up_b, down, down_b), one whole set. Returns (clamped, x as (BT, D), E)."""
    given = tuple(n for n, w in weights.items() if w is not None)
    if given == SWIGLU_EXPERTS:
        if alpha is not None or limit is not None:
            raise ValueError(f"{fn}: swiglu_alpha and swiglu_limit apply to gpt-oss experts "
                             f"(gate_up, ...), not to w1, w3, w2")
        return False, *check_layer(fn, x, w_router, *(weights[n] for n in given))
    if given == CLAMPED_EXPERTS:
        return True, *check_clamped_layer(fn, x, w_router, *(weights[n] for n in given))
    raise ValueError(f"{fn}: the experts must be w1, w3, w2 (SwiGLU) or gate_up, gate_up_b, "
                     f"down, down_b (gpt-oss), got {list(given)}")


def _clamp(alpha, limit):
    """clamped_swiglu's hyperparameters, gpt-oss's values by default."""
    return dict(alpha=1.702 if alpha is None else alpha, limit=7.0 if limit is None else limit)


def _has_shared(w1, w3, w2):
    """Whether a shared expert (ops.swiglu on every token, ungated) is given; all three
    weights or none."""
    given = [w is not None for w in (w1, w3, w2)]
    if any(given) and not all(given):
        raise ValueError(f"moe: shared_w1, shared_w3, shared_w2 must be given together, got "
                         f"{['None' if not g else 'array' for g in given]}")
    return all(given)


def moe_backward(dout, cache):
    """Gradients of the MoE layer. dout = MoEOut(dy, daux, dz); any may be None.

    Math: y_n = sum_j g_nj e_nj  ->  de_nj = g_nj dy_n, dg_nj = <dy_n, e_nj> (kept slots; 0 for
    dropped ones), then each expert's swiglu_backward, the router backward with the balance-
    and z-loss gradients on the probabilities and logits, and the shared swiglu_backward.
    Reference: Switch Transformer (arXiv 2101.03961) §2; Mixtral (arXiv 2401.04088) §2.1.
    """
    x_shape, r_cache, b_cache, z_cache, disp, e_cache, ys, g, s_cache, clamped = cache
    expect_douts("moe_backward", dout, {"y": (x_shape, ys.dtype), "aux": ((), ys.dtype),
                                        "z": ((), ys.dtype)})
    dy, daux, dz = dout
    D = x_shape[-1]
    BT, k = r_cache.topk_idx.shape
    dy = np.zeros((BT, D), ys.dtype) if dy is None else dy.reshape(BT, D)  # (BT, D)
    dslot = dy[disp.slots // k]  # (M, D)  fwd: slot_out[slots] = g * ys, y = sum of slots
    dgates = np.zeros(BT * k, ys.dtype)  # (BTK,)
    dgates[disp.slots] = np.einsum("md,md->m", dslot, ys)  # dg = <dy, ys>
    experts_bwd = clamped_experts_backward if clamped else experts_backward
    g_e = experts_bwd(g[:, None] * dslot, e_cache)  # dys = g dy
    dx_slot = np.zeros((BT * k, D), ys.dtype)  # (BTK, D)  fwd: xs = x[slots // k]
    dx_slot[disp.slots] = g_e["xs"]
    dprobs = None if daux is None else balance_loss_backward(daux, b_cache)["probs"]
    dlogits = None if dz is None else z_loss_backward(dz, z_cache)["logits"]
    g_r = router_backward(RouterOut(dgates.reshape(BT, k), None, dprobs, dlogits), r_cache)
    dx = dx_slot.reshape(BT, k, D).sum(axis=1) + g_r["x"]  # (BT, D)
    grads = {"w_router": g_r["w_router"], **{n: v for n, v in g_e.items() if n != "xs"}}
    if "b_router" in g_r:
        grads["b_router"] = g_r["b_router"]
    if s_cache is not None:
        g_s = shared_swiglu_backward(dy, s_cache)  # fwd: y += swiglu(x, shared_w1, ...)
        dx = dx + g_s["x"]
        grads.update(shared_w1=g_s["W1"], shared_w3=g_s["W3"], shared_w2=g_s["W2"])
    return {"x": dx.reshape(x_shape), **grads}


def moe_forward_ref(x, w_router, w1=None, w3=None, w2=None, *, k, capacity_factor=None,
                    shared_w1=None, shared_w3=None, shared_w2=None, score="softmax",
                    selection_bias=None, b_router=None, n_group=1, topk_group=1,
                    norm_topk_prob=True, routed_scaling_factor=1.0, gate_up=None,
                    gate_up_b=None, down=None, down_b=None, swiglu_alpha=None,
                    swiglu_limit=None):
    """The `_ref` twin of moe_forward: y by a plain loop over tokens in order with a per-expert
    slot counter (the capacity rule read literally), no sorting; aux and z from the same
    router outputs. Forward only: returns (MoEOut, None)."""
    clamped, xf, E = _experts_given("moe_ref", x, w_router, dict(
        w1=w1, w3=w3, w2=w2, gate_up=gate_up, gate_up_b=gate_up_b, down=down, down_b=down_b),
        swiglu_alpha, swiglu_limit)  # (BT, D)
    BT = xf.shape[0]
    C = capacity_of(BT, k, E, capacity_factor)

    def expert(i, row):  # one token (D,) through expert i
        if clamped:
            return clamped_swiglu_forward(row, gate_up[i], gate_up_b[i], down[i], down_b[i],
                                          **_clamp(swiglu_alpha, swiglu_limit))[0]
        return ops.swiglu_forward(row, w1[i], w3[i], w2[i])[0]

    (gates, topk_idx, probs, logits), _ = router_forward(
        xf, w_router, b_router, k=k, score=score, selection_bias=selection_bias,
        n_group=n_group, topk_group=topk_group, norm_topk_prob=norm_topk_prob,
        routed_scaling_factor=routed_scaling_factor)
    used = np.zeros(E, int)  # (E,) slots taken so far
    y = np.zeros_like(xf)  # (BT, D)
    for n in range(BT):
        for j in range(k):
            i = topk_idx[n, j]
            if used[i] < C:
                used[i] += 1
                y[n] += gates[n, j] * expert(i, xf[n])
        if shared_w1 is not None:
            y[n] += ops.swiglu_forward(xf[n], shared_w1, shared_w3, shared_w2)[0]
    aux, z = balance_loss_forward(probs, topk_idx)[0], z_loss_forward(logits)[0]
    return MoEOut(y.reshape(x.shape), aux, z), None


# ---------------------------------------------------------------------------- module
SHARED = ("shared_w1", "shared_w3", "shared_w2")


class MoE(Module):
    """A top-k MoE layer: owns the router, stacked expert and shared-expert Params, and the
    selection bias as non-trainable state (a plain array, not a Param).

    forward(x) -> ((y, aux, z), cache); backward((dy, daux, dz), cache) -> dx.
    update_bias(tokens_per_expert, gamma) moves the selection bias towards balance
    (aux-loss-free), in place, so replicas that share the array see it.
    router_bias=True adds a trained logit bias b_router (gpt-oss, zeros at init); n_group,
    topk_group, norm_topk_prob and routed_scaling_factor are router_forward's options.
    experts="clamped" gives gpt-oss's experts (gate_up, gate_up_b, down, down_b; biases zero
    at init) with swiglu_alpha, swiglu_limit instead of SwiGLU's w1, w3, w2.
    """

    def __init__(self, d_model, d_ff, n_experts, k, *, capacity_factor=None, d_shared=0,
                 score="softmax", router_bias=False, n_group=1, topk_group=1,
                 norm_topk_prob=True, routed_scaling_factor=1.0, experts="swiglu",
                 swiglu_alpha=1.702, swiglu_limit=7.0, rng, dtype=np.float32):
        D, F, E = d_model, d_ff, n_experts
        check_k("MoE", k, E)
        check_groups("MoE", E, k, n_group, topk_group)
        self.k, self.capacity_factor, self.score = k, capacity_factor, score
        self.routing = dict(n_group=n_group, topk_group=topk_group,
                            norm_topk_prob=norm_topk_prob,
                            routed_scaling_factor=routed_scaling_factor)
        self.w_router = Param(normal_init(rng, (D, E), D ** -0.5, dtype))
        self.b_router = Param(np.zeros(E, dtype)) if router_bias else None
        self.clamp = {}
        if experts == "swiglu":
            self.w1 = Param(normal_init(rng, (E, D, F), D ** -0.5, dtype))
            self.w3 = Param(normal_init(rng, (E, D, F), D ** -0.5, dtype))
            self.w2 = Param(normal_init(rng, (E, F, D), F ** -0.5, dtype))
        elif experts == "clamped":
            self.gate_up = Param(normal_init(rng, (E, D, 2 * F), D ** -0.5, dtype))
            self.gate_up_b = Param(np.zeros((E, 2 * F), dtype))
            self.down = Param(normal_init(rng, (E, F, D), F ** -0.5, dtype))
            self.down_b = Param(np.zeros((E, D), dtype))
            self.clamp = dict(swiglu_alpha=swiglu_alpha, swiglu_limit=swiglu_limit)
        else:
            raise ValueError(f"MoE: experts must be 'swiglu' or 'clamped', got {experts!r}")
        shapes = {"shared_w1": (D, d_shared), "shared_w3": (D, d_shared),
                  "shared_w2": (d_shared, D)}
        for name, shape in shapes.items():  # None (no Param) without shared experts
            setattr(self, name, Param(normal_init(rng, shape, shape[0] ** -0.5, dtype))
                    if d_shared else None)
        self.selection_bias = np.zeros(E, dtype)

    def _weights(self):
        names = ("w_router", "b_router", *SWIGLU_EXPERTS, *CLAMPED_EXPERTS, *SHARED)
        return {n: getattr(self, n) for n in names if getattr(self, n, None) is not None}

    def forward(self, x):
        return moe_forward(x, **{n: p.data for n, p in self._weights().items()}, k=self.k,
                           capacity_factor=self.capacity_factor, score=self.score,
                           selection_bias=self.selection_bias, **self.routing, **self.clamp)

    def backward(self, dout, cache):
        return self.add_grads(moe_backward(dout, cache))

    def update_bias(self, tokens_per_expert, gamma):
        """b_i += gamma sign(mean load - load_i) from a step's routed counts (E,), in place."""
        self.selection_bias[...] = update_selection_bias(self.selection_bias,
                                                         tokens_per_expert, gamma)
