"""The experts of an MoE layer and the dispatch that feeds them: tokens sorted by expert once,
each expert a SwiGLU on its contiguous slice (the grouped-GEMM pattern), and the capacity rule.

Dispatch: the BT K routing slots are sorted by expert (a stable argsort, so token order
survives inside an expert), the first C = ceil(c BT K / E) of each expert are kept and the
overflow dropped (Switch Transformer, arXiv 2101.03961 §2.1). The only Python loop is over
experts; no per-token loop, no BT x E dense dispatch mask.

Glossary: BT tokens (rows), D model width, E experts, K top-k, F expert hidden width,
C capacity, M kept slots (<= BT K).
"""
import math
from typing import NamedTuple

import numpy as np

from scratchllm.core import ops
from scratchllm.core.validate import (expect_dout, expect_float, expect_int, expect_positive,
                                      expect_shape)


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


class ExpertsCache(NamedTuple):
    bounds: np.ndarray  # (E+1,) slice edges
    swiglu: list  # per expert: its ops.swiglu cache, None when it got no rows
    w_shape: tuple  # (E, D, F)
    dtype: np.dtype  # of xs and ys


def experts_forward(xs, bounds, w1, w3, w2):
    """Expert i runs ops.swiglu on its contiguous rows xs[bounds[i]:bounds[i+1]].

    Inputs:  xs (M, D) rows sorted by expert, bounds (E+1,) slice edges, w1/w3 (E, D, F),
             w2 (E, F, D).
    Returns: ys (M, D).  Cache: (bounds, the per-expert swiglu caches; None if empty).
    """
    expect_float("experts", "xs", xs, 2)
    expect_shape("experts", "w1", w1, (None, xs.shape[1], None), "(E, D, F)")
    expect_shape("experts", "w3", w3, w1.shape, "(E, D, F), like w1")
    expect_shape("experts", "w2", w2, (w1.shape[0], w1.shape[2], xs.shape[1]), "(E, F, D)")
    expect_int("experts", "bounds", bounds)
    expect_shape("experts", "bounds", bounds, (w1.shape[0] + 1,), "(E+1,) slice edges")
    if bounds[0] != 0 or bounds[-1] != xs.shape[0] or np.any(np.diff(bounds) < 0):
        raise ValueError(f"experts: bounds must rise from 0 to M = {xs.shape[0]}, got "
                         f"{bounds.tolist()}")
    ys = np.empty_like(xs)  # (M, D)
    caches = []
    for i in range(w1.shape[0]):
        a, b = bounds[i], bounds[i + 1]
        if a == b:
            caches.append(None)
            continue
        ys[a:b], c = ops.swiglu_forward(xs[a:b], w1[i], w3[i], w2[i])  # (M_i, D)
        caches.append(c)
    return ys, ExpertsCache(bounds, caches, w1.shape, ys.dtype)


def experts_backward(dys, cache):
    """Each expert slice through ops.swiglu_backward; an expert with no rows gets zeros.
    Returns {xs, w1, w3, w2}."""
    bounds, caches, w_shape, dtype = cache
    E, D, F = w_shape
    expect_dout("experts_backward", dys, (int(bounds[-1]), D), dtype, name="dys")
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
    return {"xs": dxs, "w1": dw1, "w3": dw3, "w2": dw2}


# ---------------------------------------------------------------------------- dispatch
class Dispatch(NamedTuple):
    slots: np.ndarray  # (M,) kept slot ids n*K + j, sorted by expert, token order inside
    bounds: np.ndarray  # (E+1,) kept-slot slice edges per expert
    tokens_per_expert: np.ndarray  # (E,) routed slots per expert, before capacity
    kept_per_expert: np.ndarray  # (E,) after capacity
    n_dropped: int  # routed slots dropped by capacity
    capacity: int  # C (BT*K when there is no capacity)


def dispatch(topk_idx, E, capacity):
    """Sort the BT K slots by expert once and keep the first `capacity` of each expert.

    Inputs:  topk_idx (BT, K), E, capacity C (int).
    Returns: Dispatch.  Cost O(BTK log BTK): never BT x E.
    """
    flat = topk_idx.ravel()  # (BTK,)
    order = np.argsort(flat, kind="stable")  # (BTK,) by expert, then slot = token order
    counts = np.bincount(flat, minlength=E)  # (E,)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))  # (E,)
    rank = np.arange(flat.size) - starts[flat[order]]  # (BTK,) position inside the expert
    keep = rank < capacity  # (BTK,)
    kept = np.minimum(counts, capacity)  # (E,)
    bounds = np.concatenate(([0], np.cumsum(kept)))  # (E+1,)
    return Dispatch(order[keep], bounds, counts, kept, int(flat.size - keep.sum()), capacity)


def capacity_of(BT, k, E, capacity_factor):
    """C = ceil(c BT k / E); no capacity (every slot kept) when capacity_factor is None."""
    if capacity_factor is None:
        return BT * k
    expect_positive("moe", "capacity_factor", capacity_factor)
    return math.ceil(capacity_factor * BT * k / E)
