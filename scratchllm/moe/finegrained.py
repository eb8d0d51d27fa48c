"""Fine-grained experts at equal FLOPs (DeepSeekMoE, Dai et al. 2024, arXiv 2401.06066 §3.1):
E experts of width F become m·E experts of width F/m, and top-k becomes top-(m·k), so every
token still runs k·F hidden units and the parameter count is unchanged.

split_experts cuts each expert's hidden units into m consecutive chunks; the pieces start as
an exact re-parametrisation of the same layer (then training lets them specialise):
    router   each column copied m times (expert i -> fine experts i·m .. i·m + m − 1):
             softmax over duplicated logits gives p_i / m to each copy, a sigmoid gives
             each copy s_i, and the top-(m·k) are the m copies of the same top-k experts;
             renormalised (or unnormalised) gates become g_i / m per copy
    experts  w1, w3 (and gate_up, b1) split along F;  w2 (down) split along F and scaled by m,
             so  sum_c (g_i / m) · m · expert_ic(x) = g_i · expert_i(x)  (a SwiGLU or GELU MLP is
             a sum over its hidden units); an output bias b2 (down_b) is copied, unscaled:
             sum_c (g_i / m) b2 = g_i b2
    capacity ceil(c·BT·mk / mE) = ceil(c·BT·k / E): the same tokens kept, the same dropped
    losses  the Switch balance loss is unchanged (f and P each split by m, E grows by m); the
             z-loss grows by log m inside the square (logsumexp over m copies)
merge_experts is the inverse (for checking: merge(split(w)) == w). Group-limited routing is
refused (a group's top-2 score would count one expert twice); a selection bias (E,) is
copied like the router's columns: np.repeat(bias, m).

Glossary: D model width, E experts, K top-k, F expert hidden width, m split factor.
"""
import dataclasses

import numpy as np

from scratchllm.core.validate import expect_instance, expect_integer
from scratchllm.moe.layer import EXPERTS, MoEWeights
from scratchllm.specs import MoESpec

SPLIT_ALONG_F = ("w1", "w3", "gate_up", "b1", "gate_up_b")  # inputs of the hidden units
SPLIT_AND_SCALE = ("w2", "down")  # outputs of the hidden units: split along F, times m
COPIED = ("b2", "down_b")  # output biases: one copy per fine expert


def _check(fn, w, spec, m):
    expect_instance(fn, "w", w, MoEWeights)
    expect_instance(fn, "spec", spec, MoESpec)
    expect_integer(fn, "m", m, 1)
    if spec.router.n_group > 1:
        raise ValueError(f"{fn}: group-limited routing (n_group={spec.router.n_group}) does not "
                         f"survive splitting (a group's score would count one expert twice)")
    if spec.gate_input:
        raise ValueError(f"{fn}: gate_input=True (the gate inside the expert, on its input) "
                         f"does not survive splitting: g/m per copy would change each copy's "
                         f"nonlinearity")


def split_experts(w, spec, m):
    """E experts of width F -> m·E experts of width F/m, top-k -> top-(m·k): the same layer.

    Inputs:  w MoEWeights, spec MoESpec (any experts kind; no group-limited routing), m >= 1
             dividing d_ff.
    Returns: (MoEWeights, MoESpec) of the fine-grained layer, whose moe_forward output (y and
             the balance loss) equals the original's. Math: the module docstring.
    """
    fn = "split_experts"
    _check(fn, w, spec, m)
    F = spec.experts.d_ff
    if F % m:
        raise ValueError(f"{fn}: m={m} must divide d_ff={F}")
    new = {"w_router": np.repeat(w.w_router, m, axis=1)}  # (D, m E)
    if w.b_router is not None:
        new["b_router"] = np.repeat(w.b_router, m)  # (m E,)
    for name in EXPERTS[spec.experts.kind]:
        a = getattr(w, name)
        if name in COPIED:
            new[name] = np.repeat(a, m, axis=0)  # (m E, D)
            continue
        axis = a.ndim - 1 if name in SPLIT_ALONG_F else 1  # the F axis (2F for gate_up)
        E, n = a.shape[0], a.shape[axis]
        parts = np.moveaxis(a, axis, 1).reshape((E, m, n // m) + a.shape[1:axis]
                                                 + a.shape[axis + 1:])  # (E, m, n/m, ...)
        parts = np.moveaxis(parts, 2, axis + 1)  # the chunk axis back where F was
        scale = m if name in SPLIT_AND_SCALE else 1
        new[name] = scale * parts.reshape((E * m,) + parts.shape[2:])  # (m E, ...)
    kept = {n: getattr(w, n) for n in ("shared_w1", "shared_w3", "shared_w2")}
    router = dataclasses.replace(spec.router, n_experts=spec.router.n_experts * m,
                                 top_k=spec.router.top_k * m)
    experts = dataclasses.replace(spec.experts, d_ff=F // m)
    return (MoEWeights(**new, **kept),
            dataclasses.replace(spec, router=router, experts=experts))


def merge_experts(w, spec, m):
    """The inverse of split_experts: m·E fine experts (copies of the router column side by
    side) -> E experts of width m·F.  Returns (MoEWeights, MoESpec)."""
    fn = "merge_experts"
    _check(fn, w, spec, m)
    E_fine, k_fine = spec.router.n_experts, spec.router.top_k
    if E_fine % m or k_fine % m:
        raise ValueError(f"{fn}: m={m} must divide n_experts={E_fine} and top_k={k_fine}")
    new = {"w_router": np.ascontiguousarray(w.w_router[:, ::m])}  # (D, E)
    if w.b_router is not None:
        new["b_router"] = w.b_router[::m].copy()  # (E,)
    for name in EXPERTS[spec.experts.kind]:
        a = getattr(w, name)
        if name in COPIED:
            new[name] = a[::m].copy()  # (E, D)
            continue
        axis = a.ndim - 1 if name in SPLIT_ALONG_F else 1
        parts = a.reshape((E_fine // m, m) + a.shape[1:])  # (E, m, ...)
        merged = np.moveaxis(parts, 1, axis)  # (E, ..., m, n/m, ...)
        shape = a.shape[1:axis] + (m * a.shape[axis],) + a.shape[axis + 1:]
        scale = m if name in SPLIT_AND_SCALE else 1
        new[name] = merged.reshape((E_fine // m,) + shape) / scale  # (E, ...)
    kept = {n: getattr(w, n) for n in ("shared_w1", "shared_w3", "shared_w2")}
    router = dataclasses.replace(spec.router, n_experts=E_fine // m, top_k=k_fine // m)
    experts = dataclasses.replace(spec.experts, d_ff=spec.experts.d_ff * m)
    return (MoEWeights(**new, **kept),
            dataclasses.replace(spec, router=router, experts=experts))
