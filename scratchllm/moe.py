"""Mixture-of-Experts layer: top-k routing, capacity, grouped expert dispatch, shared experts,
balance loss, z-loss and the aux-loss-free selection bias (DeepSeek-V3), plus the MoE Module.

Papers: Switch Transformer (arXiv 2101.03961), Mixtral (arXiv 2401.04088), ST-MoE
(arXiv 2202.08906), DeepSeek-V3 (arXiv 2412.19437). Router pieces live in moe_router.py,
expert-choice routing in moe_expert_choice.py.

Math (token n):
    (g_n, K_n, p, s) = router(x_n)                                  gates over the chosen k
    y_n = sum_{i in K_n, slot kept} g_ni SwiGLU_i(x_n) + SwiGLU_shared(x_n)
    aux = E sum_i f_i P_i       z = mean_n logsumexp(s_n)^2          (moe_router.py)
Capacity C = ceil(c N k / E) slots per expert; slots are kept in token order and the overflow
is dropped (zero contribution: the caller's residual carries the token).

Dispatch (the grouped-GEMM pattern): the N k slots are sorted by expert once (a stable
argsort, so token order survives inside an expert), the kept tokens are gathered into one
(M, D) array, and expert i runs on its contiguous slice [start_i, end_i). The only Python loop
is over experts; no per-token loop, no N x E dense dispatch mask.

Glossary: N tokens (leading axes of x flattened), D model width, E experts, K top-k,
F expert hidden width, Fs shared-expert hidden width, C capacity, M kept slots (<= N K).
"""
import math
from typing import NamedTuple

import numpy as np

from scratchllm import ops
from scratchllm.moe_router import (balance_loss_backward, balance_loss_forward, check_k,
                                   router_backward, router_forward, update_selection_bias,
                                   z_loss_backward, z_loss_forward)
from scratchllm.nn import Module, Param, normal_init
from scratchllm.validate import expect_float, expect_positive, expect_shape


# ---------------------------------------------------------------------------- experts
def check_layer(fn, x, w_router, w1, w3, w2):
    """Validate a layer's inputs; return x flattened to (N, D) and E.
    Raises ValueError unless w_router is (D, E), w1, w3 are (E, D, F) and w2 is (E, F, D)."""
    expect_float(fn, "x", x)
    D = x.shape[-1]
    expect_shape(fn, "w_router", w_router, (D, None), f"(D, E) with D = {D}")
    E = w_router.shape[1]
    expect_shape(fn, "w1", w1, (E, D, None), f"(E, D, F) with E = {E} router columns, D = {D}")
    expect_shape(fn, "w3", w3, w1.shape, "(E, D, F), like w1")
    expect_shape(fn, "w2", w2, (E, w1.shape[2], D), "(E, F, D), matching w1")
    return x.reshape(-1, D), E  # (N, D)


def experts_forward(xs, bounds, w1, w3, w2):
    """Expert i runs ops.swiglu on its contiguous rows xs[bounds[i]:bounds[i+1]].

    Inputs:  xs (M, D) rows sorted by expert, bounds (E+1,) slice edges, w1/w3 (E, D, F),
             w2 (E, F, D).
    Returns: ys (M, D).  Cache: (bounds, the per-expert swiglu caches; None if empty).
    """
    ys = np.empty_like(xs)  # (M, D)
    caches = []
    for i in range(w1.shape[0]):
        a, b = bounds[i], bounds[i + 1]
        if a == b:
            caches.append(None)
            continue
        ys[a:b], c = ops.swiglu_forward(xs[a:b], w1[i], w3[i], w2[i])  # (M_i, D)
        caches.append(c)
    return ys, (bounds, caches, w1.shape)


def experts_backward(dys, cache):
    """Each expert slice through ops.swiglu_backward; an expert with no rows gets zeros."""
    bounds, caches, w_shape = cache
    E, D, F = w_shape
    dxs = np.empty_like(dys)  # (M, D)
    dw1 = np.zeros(w_shape, dys.dtype)  # (E, D, F)
    dw3 = np.zeros(w_shape, dys.dtype)  # (E, D, F)
    dw2 = np.zeros((E, F, D), dys.dtype)  # (E, F, D)
    for i, c in enumerate(caches):
        if c is None:
            continue
        a, b = bounds[i], bounds[i + 1]
        g = ops.swiglu_backward(dys[a:b], c)  # fwd: ys[a:b] = swiglu(xs[a:b], w1[i], ...)
        dxs[a:b], dw1[i], dw3[i], dw2[i] = g["x"], g["W1"], g["W3"], g["W2"]
    return dxs, dw1, dw3, dw2


# ---------------------------------------------------------------------------- dispatch
class Dispatch(NamedTuple):
    slots: np.ndarray  # (M,) kept slot ids n*K + j, sorted by expert, token order inside
    bounds: np.ndarray  # (E+1,) kept-slot slice edges per expert
    tokens_per_expert: np.ndarray  # (E,) routed slots per expert, before capacity
    kept_per_expert: np.ndarray  # (E,) after capacity
    n_dropped: int  # routed slots dropped by capacity
    capacity: int  # C (N*K when there is no capacity)


def dispatch(topk_idx, E, capacity):
    """Sort the N K slots by expert once and keep the first `capacity` of each expert.

    Inputs:  topk_idx (N, K), E, capacity C (int).
    Returns: Dispatch.  Cost O(NK log NK): never N x E.
    """
    flat = topk_idx.ravel()  # (NK,)
    order = np.argsort(flat, kind="stable")  # (NK,) by expert, then slot = token order
    counts = np.bincount(flat, minlength=E)  # (E,)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))  # (E,)
    rank = np.arange(flat.size) - starts[flat[order]]  # (NK,) position inside the expert
    keep = rank < capacity  # (NK,)
    kept = np.minimum(counts, capacity)  # (E,)
    bounds = np.concatenate(([0], np.cumsum(kept)))  # (E+1,)
    return Dispatch(order[keep], bounds, counts, kept, int(flat.size - keep.sum()), capacity)


def capacity_of(N, k, E, capacity_factor):
    """C = ceil(c N k / E); no capacity (every slot kept) when capacity_factor is None."""
    if capacity_factor is None:
        return N * k
    expect_positive("moe", "capacity_factor", capacity_factor)
    return math.ceil(capacity_factor * N * k / E)


# ---------------------------------------------------------------------------- moe layer
class MoECache(NamedTuple):
    x_shape: tuple
    router: tuple
    balance: tuple
    z: tuple
    dispatch: Dispatch
    experts: tuple
    ys: np.ndarray
    gates: np.ndarray
    shared: tuple

    @property
    def tokens_per_expert(self):
        return self.dispatch.tokens_per_expert

    @property
    def n_dropped(self):
        return self.dispatch.n_dropped


def moe_forward(x, w_router, w1, w3, w2, *, k, capacity_factor=None, shared_w1=None,
                shared_w3=None, shared_w2=None, score="softmax", selection_bias=None):
    """Top-k MoE of SwiGLU experts with capacity and optional shared experts.

    Inputs:  x (..., D), w_router (D, E), w1/w3 (E, D, F), w2 (E, F, D), k in [1, E],
             capacity_factor c > 0 or None, shared_w1/w3 (D, Fs), shared_w2 (Fs, D) or None,
             score "softmax" | "sigmoid", selection_bias (E,) or None (selects only).
    Returns: (y (..., D), aux 0-d balance loss, z 0-d router z-loss).
    Cache:   MoECache; .tokens_per_expert (E,) routed counts, .n_dropped, .dispatch.
    """
    xf, E = check_layer("moe", x, w_router, w1, w3, w2)  # (N, D)
    N, D = xf.shape
    check_k("moe", k, E)
    C = capacity_of(N, k, E, capacity_factor)
    (gates, topk_idx, probs, logits), r_cache = router_forward(
        xf, w_router, k=k, score=score, selection_bias=selection_bias)
    aux, b_cache = balance_loss_forward(probs, topk_idx)
    z, z_cache = z_loss_forward(logits)
    disp = dispatch(topk_idx, E, C)
    xs = xf[disp.slots // k]  # (M, D) kept tokens, grouped by expert
    ys, e_cache = experts_forward(xs, disp.bounds, w1, w3, w2)  # (M, D)
    g = gates.reshape(-1)[disp.slots]  # (M,)
    slot_out = np.zeros((N * k, D), x.dtype)  # (NK, D); dropped slots stay 0
    slot_out[disp.slots] = g[:, None] * ys
    y = slot_out.reshape(N, k, D).sum(axis=1)  # (N, D)
    s_cache = _shared_forward(xf, shared_w1, shared_w3, shared_w2)
    if s_cache is not None:
        y = y + s_cache[0]  # (N, D)
        s_cache = s_cache[1]
    cache = MoECache(x.shape, r_cache, b_cache, z_cache, disp, e_cache, ys, g, s_cache)
    return (y.reshape(x.shape), aux, z), cache


def _shared_forward(xf, w1, w3, w2):
    """The shared expert: ops.swiglu on every token, ungated. None when w1 is None."""
    given = [w is not None for w in (w1, w3, w2)]
    if any(given) and not all(given):
        raise ValueError(f"moe: shared_w1, shared_w3, shared_w2 must be given together, got "
                         f"{['None' if not g else 'array' for g in given]}")
    return None if w1 is None else ops.swiglu_forward(xf, w1, w3, w2)


def moe_backward(dout, cache):
    """Gradients of the MoE layer. dout = (dy, daux, dz); any may be None.

    Math: y_n = sum_j g_nj e_nj  ->  de_nj = g_nj dy_n, dg_nj = <dy_n, e_nj> (kept slots; 0 for
    dropped ones), then each expert's swiglu_backward, the router backward with the balance-
    and z-loss gradients on the probabilities and logits, and the shared swiglu_backward.
    Reference: REFERENCE.md §3-4.
    """
    x_shape, r_cache, b_cache, z_cache, disp, e_cache, ys, g, s_cache = cache
    dy, daux, dz = dout
    D = x_shape[-1]
    N, k = r_cache.topk_idx.shape
    dy = np.zeros((N, D), ys.dtype) if dy is None else dy.reshape(N, D)  # (N, D)
    dslot = dy[disp.slots // k]  # (M, D)  fwd: slot_out[slots] = g * ys, y = sum of slots
    dgates = np.zeros(N * k, ys.dtype)  # (NK,)
    dgates[disp.slots] = np.einsum("md,md->m", dslot, ys)  # dg = <dy, ys>
    dxs, dw1, dw3, dw2 = experts_backward(g[:, None] * dslot, e_cache)  # dys = g dy
    dx_slot = np.zeros((N * k, D), ys.dtype)  # (NK, D)  fwd: xs = x[slots // k]
    dx_slot[disp.slots] = dxs
    dprobs = None if daux is None else balance_loss_backward(daux, b_cache)["probs"]
    dlogits = None if dz is None else z_loss_backward(dz, z_cache)["logits"]
    g_r = router_backward((dgates.reshape(N, k), None, dprobs, dlogits), r_cache)
    dx = dx_slot.reshape(N, k, D).sum(axis=1) + g_r["x"]  # (N, D)
    grads = {"w_router": g_r["w_router"], "w1": dw1, "w3": dw3, "w2": dw2}
    if s_cache is not None:
        g_s = ops.swiglu_backward(dy, s_cache)  # fwd: y += swiglu(x, shared_w1, ...)
        dx = dx + g_s["x"]
        grads.update(shared_w1=g_s["W1"], shared_w3=g_s["W3"], shared_w2=g_s["W2"])
    return {"x": dx.reshape(x_shape), **grads}


def moe_forward_ref(x, w_router, w1, w3, w2, *, k, capacity_factor=None, shared_w1=None,
                    shared_w3=None, shared_w2=None, score="softmax", selection_bias=None):
    """The `_ref` twin of moe_forward's y: a plain loop over tokens in order with a per-expert
    slot counter (the capacity rule read literally), no sorting. Returns y (..., D) only."""
    D = x.shape[-1]
    xf = x.reshape(-1, D)  # (N, D)
    N, E = xf.shape[0], w_router.shape[1]
    C = capacity_of(N, k, E, capacity_factor)
    (gates, topk_idx, _, _), _ = router_forward(xf, w_router, k=k, score=score,
                                                selection_bias=selection_bias)
    used = np.zeros(E, int)  # (E,) slots taken so far
    y = np.zeros_like(xf)  # (N, D)
    for n in range(N):
        for j in range(k):
            i = topk_idx[n, j]
            if used[i] < C:
                used[i] += 1
                y[n] += gates[n, j] * ops.swiglu_forward(xf[n], w1[i], w3[i], w2[i])[0]
        if shared_w1 is not None:
            y[n] += ops.swiglu_forward(xf[n], shared_w1, shared_w3, shared_w2)[0]
    return y.reshape(x.shape)


# ---------------------------------------------------------------------------- module
SHARED = ("shared_w1", "shared_w3", "shared_w2")


class MoE(Module):
    """A top-k MoE layer: owns the router, stacked expert and shared-expert Params, and the
    selection bias as non-trainable state (a plain array, not a Param).

    forward(x) -> ((y, aux, z), cache); backward((dy, daux, dz), cache) -> dx.
    update_bias(tokens_per_expert, gamma) moves the selection bias towards balance
    (aux-loss-free), in place, so replicas that share the array see it.
    """

    def __init__(self, d_model, d_ff, n_experts, k, *, capacity_factor=None, d_shared=0,
                 score="softmax", rng, dtype=np.float32):
        D, F, E = d_model, d_ff, n_experts
        check_k("MoE", k, E)
        self.k, self.capacity_factor, self.score = k, capacity_factor, score
        self.w_router = Param(normal_init(rng, (D, E), D ** -0.5, dtype))
        self.w1 = Param(normal_init(rng, (E, D, F), D ** -0.5, dtype))
        self.w3 = Param(normal_init(rng, (E, D, F), D ** -0.5, dtype))
        self.w2 = Param(normal_init(rng, (E, F, D), F ** -0.5, dtype))
        shapes = {"shared_w1": (D, d_shared), "shared_w3": (D, d_shared),
                  "shared_w2": (d_shared, D)}
        for name, shape in shapes.items():  # None (no Param) without shared experts
            setattr(self, name, Param(normal_init(rng, shape, shape[0] ** -0.5, dtype))
                    if d_shared else None)
        self.selection_bias = np.zeros(E, dtype)

    def _weights(self):
        names = ("w_router", "w1", "w3", "w2", *SHARED)
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    def forward(self, x):
        return moe_forward(x, **{n: p.data for n, p in self._weights().items()}, k=self.k,
                           capacity_factor=self.capacity_factor, score=self.score,
                           selection_bias=self.selection_bias)

    def backward(self, dout, cache):
        g = moe_backward(dout, cache)
        for name, p in self._weights().items():
            p.grad += g[name]
        return g["x"]

    def update_bias(self, tokens_per_expert, gamma):
        """b_i += gamma sign(mean load - load_i) from a step's routed counts (E,), in place."""
        self.selection_bias[...] = update_selection_bias(self.selection_bias,
                                                         tokens_per_expert, gamma)
