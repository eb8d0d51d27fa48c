"""The experts of an MoE layer and the dispatch that feeds them: tokens sorted by expert once,
each expert a SwiGLU on its contiguous slice (the grouped-GEMM pattern), and the capacity rule;
gpt-oss's expert, the clamped SwiGLU with biases; and the plain MLP expert with biases,
y = GELU(x W1 + b1) W2 + b2 (core.gelu's gelu_mlp pair, erf GELU as torch's nn.GELU), the
expert of the first MoE listings (Shazeer et al. 2017, arXiv 1701.06538; Switch).

Dispatch: the BT K routing slots are sorted by expert (a stable argsort, so token order
survives inside an expert), the first C = ceil(c BT K / E) of each expert are kept and the
overflow dropped (Switch Transformer, arXiv 2101.03961 §2.1). The only Python loop is over
experts; no per-token loop, no BT x E dense dispatch mask.

gpt-oss's expert (huggingface/transformers modeling_gpt_oss.py GptOssExperts), per row x:
    h = x @ gate_up + gate_up_b;  gate, up = h[0::2], h[1::2]      interleaved columns
    gate = min(gate, limit);  up = clip(up, -limit, limit)
    y = ((up + 1) * gate * sigmoid(alpha * gate)) @ down + down_b
The clamps are kinks: the gradient is zero beyond a limit (torch.clamp passes it on
gate <= limit and on -limit <= up <= limit, boundaries included; so does the backward here).

Glossary: BT tokens (rows), D model width, E experts, K top-k, F expert hidden width,
C capacity, M kept slots (<= BT K).
"""
import math
from typing import NamedTuple

import numpy as np

from scratchllm.core import fused, ops
from scratchllm.core.gelu import gelu_mlp_backward, gelu_mlp_forward
from scratchllm.core.relu import relu_mlp_backward, relu_mlp_forward
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_int,
                                      expect_linear, expect_ndim, expect_positive, expect_shape)


# ---------------------------------------------------------------------------- experts
def check_layer(fn, x, w_router, w1, w3, w2):
    """Validate a layer's inputs; return x flattened to (BT, D) and E.
    Raises ValueError unless w_router is (D, E), w1, w3 are (E, D, F) and w2 is (E, F, D)."""
    expect_float(fn, "x", x, 1)
    D = x.shape[-1]
    expect_shape(fn, "w_router", w_router, (D, None), f"(D, E) with D = {D}")
    E = w_router.shape[1]
    expect_shape(fn, "w1", w1, (E, D, None), f"(E, D, F) with E = {E} router columns, D = {D}")
    expect_shape(fn, "w3", w3, w1.shape, "(E, D, F), like w1")
    expect_shape(fn, "w2", w2, (E, w1.shape[2], D), "(E, F, D), matching w1")
    return x.reshape(-1, D), E  # (BT, D)


def check_clamped_layer(fn, x, w_router, gate_up, gate_up_b, down, down_b):
    """Validate a layer's gpt-oss experts; return x flattened to (BT, D) and E. Raises
    ValueError unless gate_up is (E, D, 2F), gate_up_b (E, 2F), down (E, F, D), down_b (E, D)."""
    expect_float(fn, "x", x)
    D = x.shape[-1]
    expect_shape(fn, "w_router", w_router, (D, None), f"(D, E) with D = {D}")
    E = w_router.shape[1]
    expect_shape(fn, "gate_up", gate_up, (E, D, None), f"(E, D, 2F) with E = {E}, D = {D}")
    F2 = gate_up.shape[2]
    expect_shape(fn, "gate_up_b", gate_up_b, (E, F2), "(E, 2F), matching gate_up")
    expect_shape(fn, "down", down, (E, F2 // 2, D), "(E, F, D), matching gate_up")
    expect_shape(fn, "down_b", down_b, (E, D), "(E, D)")
    return x.reshape(-1, D), E  # (BT, D)


def check_mlp_layer(fn, x, w_router, w1, b1, w2, b2):
    """Validate a layer's plain MLP experts; return x flattened to (BT, D) and E. Raises
    ValueError unless w1 is (E, D, F), b1 (E, F), w2 (E, F, D), b2 (E, D)."""
    expect_float(fn, "x", x, 1)
    D = x.shape[-1]
    expect_shape(fn, "w_router", w_router, (D, None), f"(D, E) with D = {D}")
    E = w_router.shape[1]
    expect_shape(fn, "w1", w1, (E, D, None), f"(E, D, F) with E = {E} router columns, D = {D}")
    F = w1.shape[2]
    for name, w, shape in (("b1", b1, (E, F)), ("w2", w2, (E, F, D)), ("b2", b2, (E, D))):
        expect_shape(fn, name, w, shape, "matching w1 (E, D, F)")
    return x.reshape(-1, D), E  # (BT, D)


class ExpertsCache(NamedTuple):
    bounds: np.ndarray  # (E+1,) slice edges
    per_expert: list  # per expert: its pair's cache, None when it got no rows
    shapes: dict  # stacked weight name -> shape, e.g. w1: (E, D, F)
    dtype: np.dtype  # of xs and ys


def _run_experts(xs, bounds, forward, weights, **hyper):
    """Expert i runs forward(xs[bounds[i]:bounds[i+1]], *its slices of the stacked weights);
    returns ys and the ExpertsCache (None for an expert with no rows)."""
    ys = np.empty_like(xs)  # (M, D)
    caches = []
    for i in range(len(bounds) - 1):
        a, b = bounds[i], bounds[i + 1]
        if a == b:
            caches.append(None)
            continue
        ys[a:b], c = forward(xs[a:b], *(w[i] for w in weights.values()), **hyper)  # (M_i, D)
        caches.append(c)
    return ys, ExpertsCache(bounds, caches, {n: w.shape for n, w in weights.items()},
                            ys.dtype)


def _experts_grads(fn, dys, cache, backward, keys):
    """Each expert slice through `backward`; keys maps a stacked weight name to the pair's
    gradient key. An expert with no rows gets zeros. Returns {xs, stacked weight names}."""
    bounds, caches, shapes, dtype = cache
    D = next(iter(shapes.values()))[1]  # every stacked weight is (E, D, ...) or (E, F, D)
    expect_dout(fn, dys, (int(bounds[-1]), D), dtype, name="dys")
    dxs = np.empty_like(dys)  # (M, D)
    grads = {n: np.zeros(shape, dys.dtype) for n, shape in shapes.items()}  # (E, ...)
    for i, c in enumerate(caches):
        if c is None:
            continue
        a, b = bounds[i], bounds[i + 1]
        g = backward(dys[a:b], c)  # fwd: ys[a:b] = expert_i(xs[a:b])
        dxs[a:b] = g["x"]
        for name, key in keys.items():
            grads[name][i] = g[key]
    return {"xs": dxs, **grads}


def _check_bounds(fn, bounds, E, M):
    """bounds (E+1,) integers rising from 0 to M: the experts' row slices of xs."""
    expect_int(fn, "bounds", bounds)
    expect_shape(fn, "bounds", bounds, (E + 1,), "(E+1,) slice edges")
    if bounds[0] != 0 or bounds[-1] != M or np.any(np.diff(bounds) < 0):
        raise ValueError(f"{fn}: bounds must rise from 0 to M = {M}, got {bounds.tolist()}")


def experts_forward(xs, bounds, w1, w3, w2):
    """Expert i runs swiglu (core.fused.SWIGLU: the fused twin, or the readable ops pair) on
    its contiguous rows xs[bounds[i]:bounds[i+1]].

    Inputs:  xs (M, D) rows sorted by expert, bounds (E+1,) slice edges, w1/w3 (E, D, F),
             w2 (E, F, D).
    Returns: ys (M, D).  Cache: ExpertsCache of the per-expert SWIGLU TwinCaches (each holds
             its twin's backward; None for an expert with no rows).
    """
    xs, w1, w3, w2 = common_float(xs, w1, w3, w2)
    expect_float("experts", "xs", xs, 2)
    expect_shape("experts", "w1", w1, (None, xs.shape[1], None), "(E, D, F)")
    expect_shape("experts", "w3", w3, w1.shape, "(E, D, F), like w1")
    expect_shape("experts", "w2", w2, (w1.shape[0], w1.shape[2], xs.shape[1]), "(E, F, D)")
    _check_bounds("experts", bounds, w1.shape[0], xs.shape[0])
    return _run_experts(xs, bounds, fused.SWIGLU.forward, dict(w1=w1, w3=w3, w2=w2))


def experts_backward(dys, cache):
    """Each expert slice through the backward of the swiglu twin its forward chose; an expert
    with no rows gets zeros. Returns {xs, w1, w3, w2}."""
    return _experts_grads("experts_backward", dys, cache, fused.SWIGLU.backward,
                          dict(w1="W1", w3="W3", w2="W2"))


# ---------------------------------------------------------------------------- gpt-oss expert
class ClampedSwiGLUCache(NamedTuple):
    up: ops.LinearCache  # x @ gate_up + gate_up_b
    act: ops.InputCache  # silu of alpha * gate
    down: ops.LinearCache
    gate_live: np.ndarray  # (..., F) bool: gate <= limit (the clamp passes the gradient)
    up_live: np.ndarray  # (..., F) bool: |up| <= limit
    glu: np.ndarray  # gate * sigmoid(alpha * gate), clamped gate
    up_plus_1: np.ndarray  # clip(up) + 1


def clamped_swiglu_forward(x, gate_up, gate_up_b, down, down_b, *, alpha=1.702, limit=7.0):
    """gpt-oss's expert MLP (GptOssExperts): interleaved gate/up columns, clamped, biased.

    Inputs:  x (..., D), gate_up (D, 2F) with gate in the even and up in the odd columns,
             gate_up_b (2F,) or None, down (F, D), down_b (D,) or None; alpha, limit > 0
             (gpt-oss: 1.702 and 7.0).
    Returns: y (..., D).  Cache: the linear caches, silu's, the clamp masks, two halves.
    The glu is silu(alpha gate) / alpha = gate sigmoid(alpha gate), so silu's pair serves.
    """
    expect_float("clamped_swiglu", "x", x, 1)
    expect_ndim("clamped_swiglu", "gate_up", gate_up, 2, "(D, 2F)")
    if gate_up.shape[1] % 2:
        raise ValueError(f"clamped_swiglu: gate_up has shape {gate_up.shape}, expected (D, 2F) "
                         f"with an even number of interleaved gate/up columns")
    fn = "clamped_swiglu"
    expect_linear(fn, x.shape[-1], gate_up, gate_up_b, ("gate_up", "gate_up_b"))
    expect_linear(fn, gate_up.shape[1] // 2, down, down_b, ("down", "down_b"),
                  d_out=x.shape[-1])
    expect_positive("clamped_swiglu", "alpha", alpha)
    expect_positive("clamped_swiglu", "limit", limit)
    h, up_cache = ops.linear_forward(x, gate_up, gate_up_b)  # (..., 2F)
    gate, up = h[..., 0::2], h[..., 1::2]  # (..., F) each, interleaved
    s, act = ops.silu_forward(alpha * np.minimum(gate, limit))  # (..., F)
    glu = s / alpha  # (..., F) gate sigmoid(alpha gate)
    up_plus_1 = np.clip(up, -limit, limit) + 1  # (..., F)
    y, down_cache = ops.linear_forward(up_plus_1 * glu, down, down_b)  # (..., D)
    cache = ClampedSwiGLUCache(up_cache, act, down_cache, gate <= limit, np.abs(up) <= limit,
                               glu, up_plus_1)
    return y, cache


def clamped_swiglu_backward(dy, cache):
    """Math: m = (u + 1) glu(g), glu(g) = silu(alpha g) / alpha, g = min(gate, limit),
    u = clip(up, -limit, limit):
        dglu = dm (u + 1),  du = dm glu,  dg = silu'(alpha g) dglu   (the alphas cancel)
        dgate = dg [gate <= limit],  dup = du [-limit <= up <= limit]   (zero past a clamp)
    then dh interleaves dgate, dup back into the 2F columns of h = x @ gate_up + gate_up_b.
    Reference: huggingface/transformers src/transformers/models/gpt_oss/modeling_gpt_oss.py
    GptOssExperts._apply_gate; Shazeer 2020 (arXiv 2002.05202).
    """
    expect_dout("clamped_swiglu_backward", dy, *ops.linear_out(cache.down), name="dy")
    up_cache, act, down_cache, gate_live, up_live, glu, up_plus_1 = cache
    g_down = ops.linear_backward(dy, down_cache)  # fwd: y = m @ down + down_b
    dm = g_down["x"]  # (..., F)
    dh = np.empty(dm.shape[:-1] + (2 * dm.shape[-1],), dm.dtype)  # (..., 2F)
    dg = ops.silu_backward(dm * up_plus_1, act)["x"]  # fwd: glu = silu(alpha g) / alpha
    dh[..., 0::2] = dg * gate_live  # fwd: g = min(gate, limit)
    dh[..., 1::2] = dm * glu * up_live  # fwd: m = (clip(up) + 1) glu
    g_up = ops.linear_backward(dh, up_cache)  # fwd: h = x @ gate_up + gate_up_b
    grads = {"x": g_up["x"], "gate_up": g_up["W"], "down": g_down["W"]}
    if "b" in g_up:
        grads["gate_up_b"] = g_up["b"]
    if "b" in g_down:
        grads["down_b"] = g_down["b"]
    return grads


def _expect_floats(fn, xs, weights, first_layout):
    """xs (M, D) and every stacked weight float; the first weight 3-d (first_layout)."""
    for name, w in weights.items():
        expect_float(fn, name, w)
    expect_float(fn, "xs", xs, 2)
    first = next(iter(weights))
    expect_ndim(fn, first, weights[first], 3, first_layout)


CLAMPED_KEYS = dict(gate_up="gate_up", gate_up_b="gate_up_b", down="down", down_b="down_b")


def clamped_experts_forward(xs, bounds, gate_up, gate_up_b, down, down_b, *, alpha=1.702,
                            limit=7.0):
    """Expert i runs clamped_swiglu on its rows xs[bounds[i]:bounds[i+1]] (gpt-oss layout).

    Inputs:  xs (M, D) rows sorted by expert, bounds (E+1,), gate_up (E, D, 2F) interleaved,
             gate_up_b (E, 2F), down (E, F, D), down_b (E, D); alpha, limit.
    Returns: ys (M, D).  Cache: ExpertsCache of the per-expert clamped_swiglu caches.
    """
    xs, gate_up, gate_up_b, down, down_b = common_float(xs, gate_up, gate_up_b, down, down_b)
    fn = "clamped_experts"
    weights = dict(gate_up=gate_up, gate_up_b=gate_up_b, down=down, down_b=down_b)
    _expect_floats(fn, xs, weights, "(E, D, 2F)")
    E, D = gate_up.shape[0], xs.shape[1]
    expect_shape(fn, "gate_up", gate_up, (E, D, None), f"(E, D, 2F) with D = {D}")
    expect_shape(fn, "gate_up_b", gate_up_b, (E, gate_up.shape[2]), "(E, 2F), like gate_up")
    expect_shape(fn, "down", down, (E, gate_up.shape[2] // 2, D), "(E, F, D), like gate_up")
    expect_shape(fn, "down_b", down_b, (E, D), "(E, D)")
    _check_bounds(fn, bounds, E, xs.shape[0])
    return _run_experts(xs, bounds, clamped_swiglu_forward, weights, alpha=alpha, limit=limit)


def clamped_experts_backward(dys, cache):
    """Each expert slice through clamped_swiglu_backward; no rows -> zeros.
    Returns {xs, gate_up, gate_up_b, down, down_b}."""
    return _experts_grads("clamped_experts_backward", dys, cache, clamped_swiglu_backward,
                          CLAMPED_KEYS)


# ---------------------------------------------------------------------------- plain MLP expert
def mlp_experts_forward(xs, bounds, w1, b1, w2, b2):
    """Expert i runs gelu_mlp (y = GELU(x w1_i + b1_i) w2_i + b2_i, erf GELU) on its rows.

    Inputs:  xs (M, D) rows sorted by expert, bounds (E+1,), w1 (E, D, F), b1 (E, F),
             w2 (E, F, D), b2 (E, D).
    Returns: ys (M, D).  Cache: ExpertsCache of the per-expert gelu_mlp caches.
    """
    xs, w1, b1, w2, b2 = common_float(xs, w1, b1, w2, b2)
    fn = "mlp_experts"
    weights = dict(w1=w1, b1=b1, w2=w2, b2=b2)
    _expect_floats(fn, xs, weights, "(E, D, F)")
    E, D, F = w1.shape
    expect_shape(fn, "w1", w1, (E, xs.shape[1], F), f"(E, D, F) with D = {xs.shape[1]}")
    for name, shape in (("b1", (E, F)), ("w2", (E, F, D)), ("b2", (E, D))):
        expect_shape(fn, name, weights[name], shape, "matching w1 (E, D, F)")
    _check_bounds(fn, bounds, E, xs.shape[0])
    return _run_experts(xs, bounds, gelu_mlp_forward, weights, approximate="none")


def mlp_experts_backward(dys, cache):
    """Each expert slice through gelu_mlp_backward (linear, gelu, linear); no rows -> zeros.
    Returns {xs, w1, b1, w2, b2}."""
    return _experts_grads("mlp_experts_backward", dys, cache, gelu_mlp_backward,
                          dict(w1="W1", b1="b1", w2="W2", b2="b2"))


def relu_experts_forward(xs, bounds, w1, w2):
    """Expert i runs relu_mlp (y = max(x w1_i, 0) w2_i, no biases: Switch Transformers'
    experts) on its rows xs[bounds[i]:bounds[i+1]].

    Inputs:  xs (M, D) rows sorted by expert, bounds (E+1,), w1 (E, D, F), w2 (E, F, D).
    Returns: ys (M, D).  Cache: ExpertsCache of the per-expert relu_mlp caches.
    """
    xs, w1, w2 = common_float(xs, w1, w2)
    fn = "relu_experts"
    weights = dict(w1=w1, w2=w2)
    _expect_floats(fn, xs, weights, "(E, D, F)")
    E, D, F = w1.shape
    expect_shape(fn, "w1", w1, (E, xs.shape[1], F), f"(E, D, F) with D = {xs.shape[1]}")
    expect_shape(fn, "w2", w2, (E, F, D), "(E, F, D), matching w1 (E, D, F)")
    _check_bounds(fn, bounds, E, xs.shape[0])
    return _run_experts(xs, bounds, relu_mlp_forward, weights)


def relu_experts_backward(dys, cache):
    """Each expert slice through relu_mlp_backward; no rows -> zeros. Returns {xs, w1, w2}."""
    return _experts_grads("relu_experts_backward", dys, cache, relu_mlp_backward,
                          dict(w1="W1", w2="W2"))


# ---------------------------------------------------------------------------- dispatch
class Dispatch(NamedTuple):
    slots: np.ndarray  # (M,) kept slot ids n*K + j, sorted by expert, token order inside
    bounds: np.ndarray  # (E+1,) kept-slot slice edges per expert
    tokens_per_expert: np.ndarray  # (E,) routed slots per expert, before capacity
    kept_per_expert: np.ndarray  # (E,) after capacity
    n_dropped: int  # routed slots dropped by capacity
    capacity: int  # C (BT*K when there is no capacity)


def dispatch(topk_idx, E, capacity, group=None):
    """Sort the BT K slots by expert once and keep the first `capacity` of each expert (in
    each group of `group` consecutive tokens, when given: Switch's capacity per sequence).

    Inputs:  topk_idx (BT, K), E, capacity C (int), group (int dividing BT) or None.
    Returns: Dispatch.  Cost O(BTK log BTK): never BT x E.
    """
    BT, k = topk_idx.shape
    n_groups = 1 if group is None else BT // group
    flat = topk_idx.ravel()  # (BTK,)
    key = flat * n_groups + (0 if group is None else np.arange(flat.size) // k // group)
    order = np.argsort(key, kind="stable")  # (BTK,) by expert, group, then token order
    counts = np.bincount(key, minlength=E * n_groups)  # (E * groups,)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))  # (E * groups,)
    rank = np.arange(flat.size) - starts[key[order]]  # (BTK,) position inside its expert
    keep = rank < capacity  # (BTK,)
    kept = np.minimum(counts, capacity).reshape(E, n_groups).sum(axis=1)  # (E,)
    bounds = np.concatenate(([0], np.cumsum(kept)))  # (E+1,)
    return Dispatch(order[keep], bounds, counts.reshape(E, n_groups).sum(axis=1), kept,
                    int(flat.size - keep.sum()), capacity)


def capacity_of(BT, k, E, capacity_factor):
    """C = ceil(c BT k / E); no capacity (every slot kept) when capacity_factor is None."""
    if capacity_factor is None:
        return BT * k
    expect_positive("moe", "capacity_factor", capacity_factor)
    return math.ceil(capacity_factor * BT * k / E)
