"""Switch Transformers' sparse FFN (Fedus et al. 2021, arXiv 2101.03961) as a forward/backward
pair: a top-1 softmax router, a fixed expert capacity per sequence, ReLU experts; and the
router losses of a stack of such layers, as transformers computes them.

Math (token t of sequence b; x (B, T, D)):
    s = x W_r (+ b_r);  p = softmax(s);  i = argmax p;  g = p_i           (no renormalising)
    the tokens routed to expert i are taken in order along the sequence; the first C of each
    sequence (C = MoESpec.expert_capacity) are kept, the rest dropped
    y = g relu(x w1_i) w2_i for a kept token,  y = 0 for a dropped one (the block's residual
    then passes the token through unchanged)
The layer returns its router logits s beside y: the router losses are functions of the logits
of all the sparse layers of a stack together (router_losses_forward), so their gradient comes
back to each layer as the logits' dout. In decoding x_t (B, D) each token routes alone.
Stack losses (transformers' SwitchTransformersForConditionalGeneration with
output_router_logits), over the stack's sparse layers l, concatenated along the sequence:
    z   = mean over every (b, l, t) of logsumexp(s)^2                       (ST-MoE z-loss)
    aux = mean_b E sum_e f_be P_be,  f_be = E/(L T) #{(l, t): argmax = e},
          P_be = mean over (l, t) of p_e    (moe/losses.py's sequence_balance_loss on the
                                            concatenation: transformers' load_balancing_loss)
Backward: the experts, gates and router backwards (the gate is a chosen score: its gradient
reaches the logits through softmax); the losses through the z-loss, sequence-balance and
softmax backwards.

Reference: huggingface/transformers
src/transformers/models/switch_transformers/modeling_switch_transformers.py
(SwitchTransformersTop1Router, SwitchTransformersSparseMLP, router_z_loss_func,
load_balancing_loss_func).
Glossary: B batch, T time, BT tokens, D model width, E experts, F expert width, C capacity,
M kept tokens, L sparse layers of a stack.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import ops
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.validate import (common_float, expect_douts, expect_float, expect_instance,
                                      expect_ndim, expect_shape)
from scratchllm.moe.experts import dispatch, relu_experts_backward, relu_experts_forward
from scratchllm.moe.layer import MoEWeights
from scratchllm.moe.losses import (sequence_balance_loss_backward, sequence_balance_loss_forward,
                                   z_loss_backward, z_loss_forward)
from scratchllm.moe.router import RouterOut, router_backward, router_forward
from scratchllm.specs import MoESpec


class SwitchOut(NamedTuple):
    """The outputs of switch_moe_forward (and the shape of its backward's dout)."""
    y: np.ndarray       # (..., D)
    logits: np.ndarray  # (..., E) the router logits (the stack losses read them)


class SwitchCache(NamedTuple):
    x_shape: tuple
    router: tuple    # RouterCache
    slots: np.ndarray  # (M,) kept tokens, grouped by expert
    experts: tuple   # ExpertsCache
    ys: np.ndarray   # (M, D) the experts' outputs
    gates: np.ndarray  # (M,) the kept tokens' gates
    counts: np.ndarray  # (E,) tokens routed per expert, before capacity


def _check(fn, x, spec, w):
    expect_instance(fn, "spec", spec, MoESpec)
    expect_instance(fn, "w", w, MoEWeights)
    if spec.expert_capacity is None or spec.experts.kind != "relu":
        raise ValueError(f"{fn}: a Switch layer has spec.expert_capacity set and ReLU experts "
                         f"(ExpertsSpec('relu')), got expert_capacity={spec.expert_capacity}, "
                         f"experts.kind={spec.experts.kind!r}")
    extra = [n for n in MoEWeights._fields
             if n not in ("w_router", "b_router", "w1", "w2") and getattr(w, n) is not None]
    if extra or w.w1 is None or w.w2 is None:
        raise ValueError(f"{fn}: w holds w_router (+ b_router), w1 and w2 only; got extra "
                         f"{extra}, w1 {'set' if w.w1 is not None else 'None'}, w2 "
                         f"{'set' if w.w2 is not None else 'None'}")
    expect_float(fn, "x", x, 2)
    D, E = x.shape[-1], spec.router.n_experts
    for name, shape, hint in (("w_router", (D, E), "(D, E)"), ("w1", (E, D, None), "(E, D, F)"),
                              ("w2", (E, None, D), "(E, F, D) matching w1")):
        expect_float(fn, name, getattr(w, name))
        expect_shape(fn, name, getattr(w, name), shape, hint)
    expect_shape(fn, "w2", w.w2, (E, w.w1.shape[2], D), "(E, F, D) matching w1")
    if w.b_router is not None:
        expect_shape(fn, "b_router", w.b_router, (E,), "(E,)")


def switch_moe_forward(x, w, *, spec):
    """Switch's top-1 sparse FFN with a per-sequence expert capacity.

    Inputs:  x (B, T, D) (capacity counted along T in each sequence) or (N, D) (each row a
             token of its own sequence: one decoding step); w MoEWeights with w_router (D, E)
             (+ b_router (E,) iff spec.router.bias), w1 (E, D, F), w2 (E, F, D); spec a MoESpec
             with a top-1 softmax RouterSpec (norm_topk_prob=False), ExpertsSpec("relu", F)
             and expert_capacity C.
    Returns: SwitchOut(y like x, logits (..., E)).  Cache: SwitchCache.
    """
    x, w = common_float(x, w)
    _check("switch_moe", x, spec, w)
    D, E = x.shape[-1], spec.router.n_experts
    xf = x.reshape(-1, D)  # (BT, D)
    group = x.shape[-2] if x.ndim >= 3 else 1  # tokens per sequence
    (gates, topk_idx, _, logits), r_cache = router_forward(xf, w.w_router, w.b_router,
                                                           spec=spec.router)
    disp = dispatch(topk_idx, E, spec.expert_capacity, group)
    ys, e_cache = relu_experts_forward(xf[disp.slots], disp.bounds, w.w1, w.w2)  # (M, D)
    g = gates[disp.slots, 0]  # (M,) top-1: slot = token
    y = np.zeros_like(xf)  # (BT, D): dropped tokens stay 0
    y[disp.slots] = g[:, None] * ys
    cache = SwitchCache(x.shape, r_cache, disp.slots, e_cache, ys, g, disp.tokens_per_expert)
    return SwitchOut(y.reshape(x.shape), logits.reshape(x.shape[:-1] + (E,))), cache


def switch_moe_backward(dout, cache):
    """dout = SwitchOut(dy, dlogits), either may be None.

    Math: y_n = g_n e_n (kept n) -> de_n = g_n dy_n, dg_n = <dy_n, e_n>; the experts'
    backward; the router's with the gates' and the logits' gradients (router_backward:
    softmax's Jacobian); dx = the kept tokens' expert input gradient + the router's.
    Returns {"x": dx like x, "w": MoEWeights(dw_router, db_router, w1=dw1, w2=dw2)}.
    Reference: Switch Transformer (arXiv 2101.03961) section 2.1.
    """
    x_shape, r_cache, slots, e_cache, ys, g, _ = cache
    E = e_cache.shapes["w1"][0]
    expect_douts("switch_moe_backward", dout, {"y": (x_shape, ys.dtype),
                                               "logits": (x_shape[:-1] + (E,), ys.dtype)})
    dy, dlogits = dout
    BT, D = r_cache.topk_idx.shape[0], x_shape[-1]
    dy = np.zeros((BT, D), ys.dtype) if dy is None else dy.reshape(BT, D)  # (BT, D)
    dgates = np.zeros((BT, 1), ys.dtype)  # (BT, 1)  fwd: y[slots] = g * ys
    dgates[slots, 0] = np.einsum("md,md->m", dy[slots], ys)
    g_e = relu_experts_backward(g[:, None] * dy[slots], e_cache)  # fwd: ys = experts(x[slots])
    dx = np.zeros((BT, D), ys.dtype)  # (BT, D)
    dx[slots] = g_e["xs"]
    g_r = router_backward(RouterOut(dgates, None, None, None if dlogits is None
                                    else dlogits.reshape(BT, E)), r_cache)
    dx += g_r["x"]  # fwd: s = x W_r (+ b_r)
    return {"x": dx.reshape(x_shape), "w": MoEWeights(g_r["w_router"], g_r.get("b_router"),
                                                      w1=g_e["w1"], w2=g_e["w2"])}


# ---------------------------------------------------------------------------- stack losses
class RouterLossCache(NamedTuple):
    z: tuple        # the z-loss cache on the concatenated logits
    balance: tuple  # the sequence-balance cache
    soft: tuple     # the softmax cache (probabilities of the concatenated logits)
    shape: tuple    # the logits' shape (L, B, T, E)


def router_losses_forward(logits):
    """Switch's router losses over a stack: logits (L, B, T, E), the router logits of its L
    sparse layers (on the same B sequences of T tokens) -> ((z, aux) 0-d arrays,
    RouterLossCache); the module docstring's formulas, on the layers' logits concatenated
    along the sequence (layer by layer, as transformers concatenates them)."""
    expect_float("router_losses", "logits", logits)
    expect_ndim("router_losses", "logits", logits, 4, "(L, B, T, E)")
    L, B, T, E = logits.shape
    cat = logits.transpose(1, 0, 2, 3).reshape(B, L * T, E)  # (B, L T, E)
    z, c_z = z_loss_forward(cat.reshape(B * L * T, E))
    p, c_soft = ops.softmax_forward(cat)  # (B, L T, E)
    aux, c_bal = sequence_balance_loss_forward(p, cat.argmax(-1)[..., None])
    return (z, aux), RouterLossCache(c_z, c_bal, c_soft, logits.shape)


def router_losses_backward(dout, cache):
    """dout = (dz, daux) 0-d (either may be None) -> {"logits": (L, B, T, E)}: the z-loss's
    gradient plus the balance loss's through softmax (the argmax is constant)."""
    L, B, T, E = cache.shape
    expect_douts("router_losses_backward", dout, {"z": ((), cache.soft[0].dtype),
                                                  "aux": ((), cache.soft[0].dtype)})
    dz, daux = dout
    dcat = np.zeros((B, L * T, E), cache.soft[0].dtype)  # (B, L T, E)
    if daux is not None:
        dp = sequence_balance_loss_backward(daux, cache.balance)["scores"]  # (B, L T, E)
        dcat += ops.softmax_backward(dp, cache.soft)["x"]  # fwd: p = softmax(s)
    if dz is not None:
        dcat += z_loss_backward(dz, cache.z)["logits"].reshape(dcat.shape)
    return {"logits": dcat.reshape(B, L, T, E).transpose(1, 0, 2, 3)}


class SwitchMoE(Module):
    """A Switch sparse FFN of a MoESpec (expert_capacity set, ReLU experts): Params w_router
    (+ b_router), w1 (E, D, F), w2 (E, F, D). forward(x) -> (SwitchOut, cache);
    backward(SwitchOut(dy, dlogits), cache) -> dx. Init: w_router, w1 ~ N(0, 1/D),
    w2 ~ N(0, 1/F)."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        expect_instance("SwitchMoE", "spec", spec, MoESpec)
        D, E, F = d_model, spec.router.n_experts, spec.experts.d_ff
        self.spec = spec
        self.w_router = Param(normal_init(rng, (D, E), D ** -0.5, dtype))
        self.b_router = Param(np.zeros(E, dtype)) if spec.router.bias else None
        self.w1 = Param(normal_init(rng, (E, D, F), D ** -0.5, dtype))
        self.w2 = Param(normal_init(rng, (E, F, D), F ** -0.5, dtype))

    def weights(self):
        return MoEWeights(self.w_router.data, None if self.b_router is None
                          else self.b_router.data, w1=self.w1.data, w2=self.w2.data)

    def forward(self, x):
        return switch_moe_forward(x, self.weights(), spec=self.spec)

    def backward(self, dout, cache):
        g = switch_moe_backward(dout, cache)
        return self.add_grads({**g["w"]._asdict(), "x": g["x"]})
