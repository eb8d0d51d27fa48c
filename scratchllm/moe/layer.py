"""The top-k Mixture-of-Experts layer as a forward/backward pair, its `_ref` twin, and the
MoE Module: router -> dispatch -> experts -> gated sum, plus a shared expert.

Papers: Switch Transformer (arXiv 2101.03961), Mixtral (arXiv 2401.04088), ST-MoE
(arXiv 2202.08906), DeepSeek-V3 (arXiv 2412.19437).

Math (token n):
    (g_n, K_n, p, s) = router(x_n)                                  gates over the chosen k
    y_n = sum_{i in K_n, slot kept} g_ni expert_i(x_n) + SwiGLU_shared(x_n)
    (spec.gate_input: expert_i(g_ni x_n) instead, the gate on the input: Llama 4;
    spec.shared_gate: sigmoid(x_n . w_gate) SwiGLU_shared(x_n): Qwen2-MoE, Qwen3-Next)
(the experts: SwiGLU (w1, w3, w2), gpt-oss's clamped SwiGLU with biases (gate_up,
gate_up_b, down, down_b), or the plain GELU MLP with biases (w1, b1, w2, b2); experts.py)
    aux = E sum_i f_i P_i       z = mean_n logsumexp(s_n)^2          (losses.py)
Capacity C = ceil(c BT k / E) slots per expert; slots are kept in token order and the
overflow is dropped (zero contribution: the caller's residual carries the token).
One MoESpec (scratchllm.specs: its RouterSpec, ExpertsSpec, capacity_factor, d_shared and the
loss coefficients) travels from the config through the Module into the pair; the arrays of
one layer travel as one MoEWeights.

Glossary: BT tokens (leading axes of x flattened), D model width, E experts, K top-k,
F expert hidden width, Fs shared-expert hidden width, C capacity, M kept slots (<= BT K).
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import fused, ops
from scratchllm.core.gelu import gelu_mlp_forward
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.validate import common_float, expect_douts, expect_instance, expect_shape
from scratchllm.moe.experts import (Dispatch, ExpertsCache, capacity_of, check_clamped_layer,
                                    check_layer, check_mlp_layer, clamped_experts_backward,
                                    clamped_experts_forward, clamped_swiglu_forward, dispatch,
                                    experts_backward, experts_forward, mlp_experts_backward,
                                    mlp_experts_forward)
from scratchllm.moe.losses import (BalanceLossCache, ZLossCache, balance_loss_backward,
                                   balance_loss_forward, update_selection_bias, z_loss_backward,
                                   z_loss_forward)
from scratchllm.moe.router import RouterCache, RouterOut, router_backward, router_forward
from scratchllm.specs import MoESpec


# ---------------------------------------------------------------------------- moe layer
class MoEWeights(NamedTuple):
    """The arrays of one MoE layer (the MoE Module's Param names); None for absent parts."""
    w_router: np.ndarray  # (D, E)
    b_router: np.ndarray = None  # (E,) trained logit bias (gpt-oss), iff spec.router.bias
    w1: np.ndarray = None  # (E, D, F)  SwiGLU experts (spec.experts.kind "swiglu")
    w3: np.ndarray = None  # (E, D, F)
    w2: np.ndarray = None  # (E, F, D)
    gate_up: np.ndarray = None  # (E, D, 2F) gpt-oss experts (kind "clamped"), interleaved
    gate_up_b: np.ndarray = None  # (E, 2F)
    down: np.ndarray = None  # (E, F, D)
    down_b: np.ndarray = None  # (E, D)
    shared_w1: np.ndarray = None  # (D, Fs) the shared expert, iff spec.d_shared = Fs > 0
    shared_w3: np.ndarray = None  # (D, Fs)
    shared_w2: np.ndarray = None  # (Fs, D)
    shared_gate: np.ndarray = None  # (D,) the shared expert's gate, iff spec.shared_gate
    b1: np.ndarray = None  # (E, F)  the plain MLP experts (kind "mlp"): w1 (E, D, F) + b1,
    b2: np.ndarray = None  # (E, D)  w2 (E, F, D) + b2


EXPERTS = {"swiglu": ("w1", "w3", "w2"), "clamped": ("gate_up", "gate_up_b", "down", "down_b"),
           "mlp": ("w1", "b1", "w2", "b2")}
EXPERT_FIELDS = tuple(n for n in MoEWeights._fields if any(n in v for v in EXPERTS.values()))
EXPERTS_PAIRS = {"swiglu": experts_backward, "clamped": clamped_experts_backward,
                 "mlp": mlp_experts_backward}
SHARED = ("shared_w1", "shared_w3", "shared_w2")


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
    shared: tuple  # the shared expert's SWIGLU TwinCache, None without one
    kind: str  # spec.experts.kind: "swiglu", "clamped" (gpt-oss) or "mlp"
    losses: tuple  # (aux, z): the values of MoEOut.aux, MoEOut.z (for MoE.aux_losses)
    xs: np.ndarray = None  # (M, D) the kept tokens before their gate (spec.gate_input)
    shared_gate: tuple = None  # (x (BT, D), w_gate (D,), gate (BT,), shared output (BT, D))
    hook: object = None  # moe_forward's experts= (expert parallel), else None
    balance_hook: object = None  # moe_forward's balance=, else None

    @property
    def tokens_per_expert(self):
        return self.dispatch.tokens_per_expert

    @property
    def n_dropped(self):
        return self.dispatch.n_dropped


def _check_moe(fn, x, w, spec, hook=None):
    """Validate a layer's inputs against its spec; return x flattened to (BT, D). The experts
    are spec.experts.kind's set, whole (a hook checks its own: hook.check(fn, x, w) -> (x
    flattened, E, F)); the shared expert is there exactly when the spec has one; E, F and Fs
    agree with the spec (router_forward checks b_router)."""
    expect_instance(fn, "spec", spec, MoESpec)
    expect_instance(fn, "w", w, MoEWeights)
    if spec.expert_capacity is not None or spec.experts.kind == "relu":
        raise ValueError(f"{fn}: expert_capacity={spec.expert_capacity} and ReLU experts are "
                         f"Switch's layer: moe.switch_moe_forward (SwitchMoE)")
    kind, names = spec.experts.kind, EXPERTS[spec.experts.kind]
    given = tuple(n for n in EXPERT_FIELDS if getattr(w, n) is not None)
    if sorted(given) != sorted(names):
        raise ValueError(f"{fn}: spec.experts.kind {kind!r} takes the experts {list(names)}, "
                         f"got w with {list(given)}")
    if hook is not None:
        xf, E, F = hook.check(fn, x, w)  # (BT, D)
    elif kind == "swiglu":
        xf, E = check_layer(fn, x, w.w_router, w.w1, w.w3, w.w2)  # (BT, D)
        F = w.w1.shape[2]
    elif kind == "mlp":
        xf, E = check_mlp_layer(fn, x, w.w_router, w.w1, w.b1, w.w2, w.b2)  # (BT, D)
        F = w.w1.shape[2]
    else:
        xf, E = check_clamped_layer(fn, x, w.w_router, w.gate_up, w.gate_up_b, w.down, w.down_b)
        F = w.down.shape[1]
    if E != spec.router.n_experts or F != spec.experts.d_ff:
        raise ValueError(f"{fn}: the weights hold E = {E} experts of width F = {F}, expected "
                         f"spec.router.n_experts = {spec.router.n_experts} and "
                         f"spec.experts.d_ff = {spec.experts.d_ff}")
    _check_shared(fn, xf.shape[1], w, spec.d_shared)
    if (w.shared_gate is not None) != spec.shared_gate:
        raise ValueError(f"{fn}: w.shared_gate must be given exactly when spec.shared_gate, "
                         f"got spec.shared_gate={spec.shared_gate} and "
                         f"{'an array' if w.shared_gate is not None else 'None'}")
    if spec.shared_gate:
        expect_shape(fn, "shared_gate", w.shared_gate, (xf.shape[1],), "(D,)")
    return xf


def _check_shared(fn, D, w, Fs):
    """shared_w1, shared_w3 (D, Fs) and shared_w2 (Fs, D) when Fs = spec.d_shared > 0, else
    none of the three."""
    given = [getattr(w, n) is not None for n in SHARED]
    if given != [Fs > 0] * 3:
        raise ValueError(f"{fn}: shared_w1, shared_w3, shared_w2 must be given together exactly "
                         f"when spec.d_shared > 0, got spec.d_shared={Fs} and "
                         f"{['array' if g else 'None' for g in given]}")
    for name, shape in zip(SHARED, ((D, Fs), (D, Fs), (Fs, D))):
        if Fs:
            expect_shape(fn, name, getattr(w, name), shape, f"D = {D}, Fs = spec.d_shared")


def moe_forward(x, w, *, spec, selection_bias=None, experts=None, balance=None):
    """Top-k MoE with capacity and an optional shared expert.

    Inputs:  x (..., D); w MoEWeights: w_router (D, E), b_router (E,) iff spec.router.bias;
             the experts of spec.experts.kind: "swiglu" w1/w3 (E, D, F), w2 (E, F, D), or
             "clamped" (gpt-oss) gate_up (E, D, 2F) interleaved, gate_up_b (E, 2F),
             down (E, F, D), down_b (E, D); shared_w1/w3 (D, Fs), shared_w2 (Fs, D) iff
             spec.d_shared = Fs > 0.  spec: MoESpec (router options: router_forward;
             capacity_factor c or None; the clamped experts' alpha, limit).
             selection_bias (E,) or None: moves the top-k choice only.
             experts: None, or a hook running the experts in w's place (expert
             parallelism: train/parallel_expert.py): check(fn, x, w) -> (x (BT, D), E, F),
             forward(xs, bounds) -> (ys, cache), backward(dys, cache) -> {"xs", its arrays'
             gradients}; w then holds this rank's experts.
             balance: None, or a pair in balance_loss_forward's place (forward(probs,
             topk_idx) -> (aux, cache), backward(daux, cache) -> {"probs"}): the balance
             loss of every data-parallel rank's tokens (train/parallel_moe.py).
    Returns: MoEOut(y (..., D), aux 0-d balance loss, z 0-d router z-loss).
    Cache:   MoECache; .tokens_per_expert (E,) routed counts, .n_dropped, .dispatch.
    """
    x, w = common_float(x, w)
    xf = _check_moe("moe", x, w, spec, experts)  # (BT, D)
    BT, D = xf.shape
    E, k = spec.router.n_experts, spec.router.top_k
    C = capacity_of(BT, k, E, spec.capacity_factor)
    (gates, topk_idx, probs, logits), r_cache = router_forward(
        xf, w.w_router, w.b_router, spec=spec.router, selection_bias=selection_bias)
    aux, b_cache = (balance_loss_forward if balance is None else balance.forward)(probs,
                                                                                 topk_idx)
    z, z_cache = z_loss_forward(logits)
    disp = dispatch(topk_idx, E, C)
    xs = xf[disp.slots // k]  # (M, D) kept tokens, grouped by expert
    g = gates.reshape(-1)[disp.slots]  # (M,)
    x_in = g[:, None] * xs if spec.gate_input else xs  # (M, D) what the experts read
    kind = spec.experts.kind
    if experts is not None:  # fwd: the hook's experts (on other ranks too)
        ys, e_cache = experts.forward(x_in, disp.bounds)  # (M, D)
    elif kind == "mlp":
        ys, e_cache = mlp_experts_forward(x_in, disp.bounds, w.w1, w.b1, w.w2, w.b2)  # (M, D)
    elif kind == "clamped":
        ys, e_cache = clamped_experts_forward(x_in, disp.bounds, w.gate_up, w.gate_up_b, w.down,
                                              w.down_b, alpha=spec.experts.alpha,
                                              limit=spec.experts.limit)  # (M, D)
    else:
        ys, e_cache = experts_forward(x_in, disp.bounds, w.w1, w.w3, w.w2)  # (M, D)
    slot_out = np.zeros((BT * k, D), x.dtype)  # (BTK, D); dropped slots stay 0
    slot_out[disp.slots] = ys if spec.gate_input else g[:, None] * ys
    y = slot_out.reshape(BT, k, D).sum(axis=1)  # (BT, D)
    s_cache = None
    if spec.d_shared:
        y_shared, s_cache = fused.SWIGLU.forward(xf, w.shared_w1, w.shared_w3, w.shared_w2)
    gated = None
    if spec.shared_gate:  # y_shared *= sigmoid(x . w_gate)
        sg = ops.sigmoid_forward(xf @ w.shared_gate)[0]  # (BT,)
        gated, y_shared = (xf, w.shared_gate, sg, y_shared), sg[:, None] * y_shared
    if spec.d_shared:
        y = y + y_shared  # (BT, D)
    cache = MoECache(x.shape, r_cache, b_cache, z_cache, disp, e_cache, ys, g, s_cache,
                     kind, (aux, z), xs if spec.gate_input else None, gated, experts, balance)
    return MoEOut(y.reshape(x.shape), aux, z), cache


def moe_backward(dout, cache):
    """Gradients of the MoE layer. dout = MoEOut(dy, daux, dz); any may be None.

    Math: y_n = sum_j g_nj e_nj  ->  de_nj = g_nj dy_n, dg_nj = <dy_n, e_nj> (kept slots; 0 for
    dropped ones); with the gate on the input, y_n = sum_j e_j(g_nj x_n) -> the expert's
    backward on dy_n gives du_nj, then dg_nj = <du_nj, x_n> and dx_n += g_nj du_nj; then each
    expert's backward, the router backward with the balance- and
    z-loss gradients on the probabilities and logits, and the shared expert's backward (with
    spec.shared_gate, y += s y_sh, s = sigmoid(x . w_g): dy_sh = s dy, and with
    dz = <dy, y_sh> s (1 - s): dw_g = sum_n dz_n x_n, dx += dz w_g).
    Returns: {"x": dx (..., D), "w": MoEWeights of the gradients (None where w had None)}.
    Reference: Switch Transformer (arXiv 2101.03961) §2; Mixtral (arXiv 2401.04088) §2.1.
    """
    x_shape, r_cache, b_cache, z_cache, disp, e_cache, ys, g, s_cache, kind, _, xs, gated, \
        hook, balance = cache
    expect_douts("moe_backward", dout, {"y": (x_shape, ys.dtype), "aux": ((), ys.dtype),
                                        "z": ((), ys.dtype)})
    dy, daux, dz = dout
    D = x_shape[-1]
    BT, k = r_cache.topk_idx.shape
    dy = np.zeros((BT, D), ys.dtype) if dy is None else dy.reshape(BT, D)  # (BT, D)
    dslot = dy[disp.slots // k]  # (M, D)  fwd: slot_out[slots] = g * ys, y = sum of slots
    dgates = np.zeros(BT * k, ys.dtype)  # (BTK,)
    dx_slot = np.zeros((BT * k, D), ys.dtype)  # (BTK, D)  fwd: xs = x[slots // k]
    experts_back = EXPERTS_PAIRS[kind] if hook is None else hook.backward
    if xs is None:  # fwd: slot_out = g * ys
        dgates[disp.slots] = np.einsum("md,md->m", dslot, ys)  # dg = <dy, ys>
        g_e = experts_back(g[:, None] * dslot, e_cache)  # dys = g dy
        dx_slot[disp.slots] = g_e.pop("xs")
    else:  # fwd: ys = experts(g * xs), slot_out = ys
        g_e = experts_back(dslot, e_cache)  # dys = dy
        du = g_e.pop("xs")  # (M, D) d/d(g xs)
        dgates[disp.slots] = np.einsum("md,md->m", du, xs)  # dg = <du, xs>
        dx_slot[disp.slots] = g[:, None] * du  # dxs = g du
    b_back = balance_loss_backward if balance is None else balance.backward
    dprobs = None if daux is None else b_back(daux, b_cache)["probs"]
    dlogits = None if dz is None else z_loss_backward(dz, z_cache)["logits"]
    g_r = router_backward(RouterOut(dgates.reshape(BT, k), None, dprobs, dlogits), r_cache)
    dx = dx_slot.reshape(BT, k, D).sum(axis=1) + g_r["x"]  # (BT, D)
    shared = {}
    d_shared = dy  # (BT, D)
    if gated is not None:  # fwd: y += sg * y_sh, sg = sigmoid(x . w_gate)
        xg, w_gate, sg, y_sh = gated
        dz = np.einsum("nd,nd->n", dy, y_sh) * sg * (1 - sg)  # d(x . w_gate)  (BT,)
        dx = dx + np.outer(dz, w_gate)  # (BT, D)
        shared["shared_gate"] = dz @ xg  # (D,)
        d_shared = sg[:, None] * dy  # d y_sh
    if s_cache is not None:  # fwd: y += swiglu(x, shared_w1, shared_w3, shared_w2)
        g_s = fused.SWIGLU.backward(d_shared, s_cache)
        dx = dx + g_s["x"]  # (BT, D)
        shared.update(shared_w1=g_s["W1"], shared_w3=g_s["W3"], shared_w2=g_s["W2"])
    dw = MoEWeights(g_r["w_router"], g_r.get("b_router"), **g_e, **shared)
    return {"x": dx.reshape(x_shape), "w": dw}


def moe_forward_ref(x, w, *, spec, selection_bias=None, experts=None, balance=None):
    """The `_ref` twin of moe_forward: y by a plain loop over tokens in order with a per-expert
    slot counter (the capacity rule read literally), no sorting; aux and z from the same
    router outputs (balance: moe_forward's). Forward only: returns (MoEOut, None). It runs
    w's experts: experts (the expert-parallel hook) must be None."""
    if experts is not None:
        raise ValueError("moe_ref: the reference loops over w's experts; experts= (a hook) "
                         "is moe_forward's")
    xf = _check_moe("moe_ref", x, w, spec)  # (BT, D)
    BT = xf.shape[0]
    E, k = spec.router.n_experts, spec.router.top_k
    C = capacity_of(BT, k, E, spec.capacity_factor)

    def expert(i, row):  # one token (D,) through expert i
        if spec.experts.kind == "clamped":
            return clamped_swiglu_forward(row, w.gate_up[i], w.gate_up_b[i], w.down[i],
                                          w.down_b[i], alpha=spec.experts.alpha,
                                          limit=spec.experts.limit)[0]
        if spec.experts.kind == "mlp":
            return gelu_mlp_forward(row, w.w1[i], w.b1[i], w.w2[i], w.b2[i],
                                    approximate="none")[0]
        return ops.swiglu_forward(row, w.w1[i], w.w3[i], w.w2[i])[0]

    (gates, topk_idx, probs, logits), _ = router_forward(
        xf, w.w_router, w.b_router, spec=spec.router, selection_bias=selection_bias)
    used = np.zeros(E, int)  # (E,) slots taken so far
    y = np.zeros_like(xf)  # (BT, D)
    for n in range(BT):
        for j in range(k):
            i = topk_idx[n, j]
            if used[i] < C and spec.gate_input:
                used[i] += 1
                y[n] += expert(i, gates[n, j] * xf[n])
            elif used[i] < C:
                used[i] += 1
                y[n] += gates[n, j] * expert(i, xf[n])
        if spec.d_shared:
            gate = 1 / (1 + np.exp(-xf[n] @ w.shared_gate)) if spec.shared_gate else 1
            y[n] += gate * ops.swiglu_forward(xf[n], w.shared_w1, w.shared_w3, w.shared_w2)[0]
    aux = (balance_loss_forward if balance is None else balance.forward)(probs, topk_idx)[0]
    z = z_loss_forward(logits)[0]
    return MoEOut(y.reshape(x.shape), aux, z), None


# ---------------------------------------------------------------------------- module
class MoE(Module):
    """A top-k MoE layer of an MoESpec: owns the router, stacked expert and shared-expert
    Params (the names of MoEWeights' fields), and the selection bias as non-trainable state (a
    plain array, not a Param).

    forward(x) -> (MoEOut(y, aux, z), cache); backward(MoEOut(dy, daux, dz), cache) -> dx.
    aux_losses(cache) -> (("balance", balance_coef aux), ("z", z_coef z)): the terms a model
    adds to its loss; aux_dout(dy, dloss) -> the MoEOut that backward then takes.
    update_bias(tokens_per_expert, gamma) moves the selection bias towards balance
    (aux-loss-free), in place, so replicas that share the array see it.
    Init: w_router, w1, w3, gate_up, shared_w1/w3 ~ N(0, 1/D); w2, down, shared_w2 ~ N(0, 1/F)
    (1/Fs); the biases b_router, gate_up_b, down_b, b1, b2 and the shared gate zero.
    """

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        expect_instance("MoE", "spec", spec, MoESpec)
        D, E, F, Fs = d_model, spec.router.n_experts, spec.experts.d_ff, spec.d_shared
        self.spec = spec
        self.w_router = Param(normal_init(rng, (D, E), D ** -0.5, dtype))
        self.b_router = Param(np.zeros(E, dtype)) if spec.router.bias else None
        if spec.experts.kind == "swiglu":
            self.w1 = Param(normal_init(rng, (E, D, F), D ** -0.5, dtype))
            self.w3 = Param(normal_init(rng, (E, D, F), D ** -0.5, dtype))
            self.w2 = Param(normal_init(rng, (E, F, D), F ** -0.5, dtype))
        elif spec.experts.kind == "mlp":
            self.w1 = Param(normal_init(rng, (E, D, F), D ** -0.5, dtype))
            self.b1 = Param(np.zeros((E, F), dtype))
            self.w2 = Param(normal_init(rng, (E, F, D), F ** -0.5, dtype))
            self.b2 = Param(np.zeros((E, D), dtype))
        else:
            self.gate_up = Param(normal_init(rng, (E, D, 2 * F), D ** -0.5, dtype))
            self.gate_up_b = Param(np.zeros((E, 2 * F), dtype))
            self.down = Param(normal_init(rng, (E, F, D), F ** -0.5, dtype))
            self.down_b = Param(np.zeros((E, D), dtype))
        for name, shape in zip(SHARED, ((D, Fs), (D, Fs), (Fs, D))):  # None without one
            setattr(self, name, Param(normal_init(rng, shape, shape[0] ** -0.5, dtype))
                    if Fs else None)
        self.shared_gate = Param(np.zeros(D, dtype)) if spec.shared_gate else None
        self.selection_bias = np.zeros(E, dtype)

    def weights(self):
        """The Params' arrays as one MoEWeights (None for the parts this layer lacks)."""
        return MoEWeights(**{n: getattr(self, n).data for n in MoEWeights._fields
                             if getattr(self, n, None) is not None})

    def forward(self, x):
        return moe_forward(x, self.weights(), spec=self.spec, selection_bias=self.selection_bias)

    def backward(self, dout, cache):
        g = moe_backward(dout, cache)
        return self.add_grads({**g["w"]._asdict(), "x": g["x"]})

    def aux_losses(self, cache):
        """The auxiliary loss terms of a forward, weighted by the spec's coefficients:
        (("balance", balance_coef * aux), ("z", z_coef * z)), 0-d arrays."""
        aux, z = cache.losses
        return (("balance", self.spec.balance_coef * aux), ("z", self.spec.z_coef * z))

    def aux_dout(self, dy, dloss=1.0):
        """backward's dout when the loss adds aux_losses' terms, the whole loss scaled by
        dloss: MoEOut(dy, dloss balance_coef, dloss z_coef), in dy's dtype."""
        dt = dy.dtype
        return MoEOut(dy, np.asarray(dloss * self.spec.balance_coef, dt),
                      np.asarray(dloss * self.spec.z_coef, dt))

    def update_bias(self, tokens_per_expert, gamma):
        """b_i += gamma sign(mean load - load_i) from a step's routed counts (E,), in place."""
        self.selection_bias[...] = update_selection_bias(self.selection_bias,
                                                         tokens_per_expert, gamma)
