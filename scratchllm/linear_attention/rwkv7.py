"""RWKV-7 "Goose" (Peng et al. 2025, arXiv 2503.14456 §4): the generalised delta rule with a
vector-valued decay and a vector-valued in-context learning rate, the time-mixing core
(the wkv7 kernel) as a forward/backward pair, its recurrent forms and its decoding step.

The paper's state is S (Dv, Dk) with S_t = S_{t-1} (diag(w_t) − κ̂_tᵀ (a_t ⊙ κ̂_t)) + v_tᵀ k_t,
o_t = S_t r_t. Here S is its transpose (Dk, Dv), as in delta.py and gla.py:
    c_t = a_t ⊙ κ_t                                 what the removal key erases, per channel
    S_t = diag(w_t) S_{t-1} − c_t (κ_tᵀ S_{t-1}) + k_t v_tᵀ
    o_t = S_tᵀ r_t
w_t ∈ (0, 1)^Dk: the decay per key channel (the paper's exp(−e^{−0.5}σ(·))); κ_t: the removal
key (normalised in RWKV-7); a_t ∈ (0, 1)^Dk: the in-context learning rate, a vector where the
delta rule has a scalar β. With w = 1, κ = k̂ (unit), a = β·1 and the written key β k̂, one
step is DeltaNet's S = (I − β k̂ k̂ᵀ) S + β k̂ vᵀ (tests/linear_attention/test_rwkv7.py).
Backward (λ_t = dL/dS_t, including the future; M_t = diag(w_t) − c_t κ_tᵀ):
    λ_t = r_t do_tᵀ + M_{t+1}ᵀ λ_{t+1}       M ᵀλ = diag(w) λ − κ (cᵀ λ): the reverse-time scan
    dr_t = S_t do_t;  dk_t = λ_t v_t;  dv_t = λ_tᵀ k_t
    dw_t = rowsum(λ_t ⊙ S_{t-1});  dc_t = −λ_t (S_{t-1}ᵀ κ_t);  dκ_t = −S_{t-1} (λ_tᵀ c_t) + a_t ⊙ dc_t;
    da_t = κ_t ⊙ dc_t
No Dk x Dk matrix is formed: each step is O(Dk Dv).
Chunked form (the UT/WY idea of delta.py with a per-channel decay), per chunk of C steps
entering with S_0, γ_t = Π_{s<=t} w_s inside the chunk (ratios γ_t/γ_s = exp(b_t − b_s), b the
cumulative log decay, only for s <= t, so never above 1):
    u_t = S_{t-1}ᵀ κ_t satisfies  (I + A_c) U = Q̃ S_0 + A_k V,
        A_k[t, s] = Σ_i κ_ti (γ_{t-1}/γ_s)_i k_si,  A_c[t, s] = the same with c_s   (s < t)
        Q̃_t = γ_{t-1} ⊙ κ_t                                       (a unit-triangular solve)
    O = (γ ⊙ R) S_0 + B_k V − B_c U,  B_k[t, s] = Σ_i r_ti (γ_t/γ_s)_i k_si (s <= t), B_c with c
    S_C = diag(γ_C) S_0 + Σ_s (γ_C/γ_s ⊙ k_s) v_sᵀ − (γ_C/γ_s ⊙ c_s) u_sᵀ
Only S_0 -> S_C runs chunk after chunk. Its backward recomputes the states by the recurrence
and runs the same adjoint scan.

Glossary: B batch, H heads, T time, Dk key head dim, Dv value head dim.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_integer,
                                      expect_shape)
from scratchllm.linear_attention.gla import check_head_step, check_qkv

FORMS7 = ("recurrent", "chunked")


class RWKV7Cache(NamedTuple):
    r: np.ndarray
    w: np.ndarray
    k: np.ndarray
    v: np.ndarray
    kappa: np.ndarray
    a: np.ndarray
    states: np.ndarray  # (B, H, T+1, Dk, Dv): S_{-1} = 0, S_0 .. S_{T-1}; None (chunked)


def _check(fn, r, w, k, v, kappa, a):
    check_qkv(fn, r, k, v)
    for name, x in (("w", w), ("kappa", kappa), ("a", a)):
        expect_float(fn, name, x)
        expect_shape(fn, name, x, r.shape, "(B, H, T, Dk) like r")


def rwkv7_step(r_t, w_t, k_t, v_t, kappa_t, a_t, state):
    """One step: S = diag(w) S − (a ⊙ κ)(κᵀ S) + k vᵀ, o = Sᵀ r.

    Inputs: r_t, w_t, k_t, kappa_t, a_t (B, H, Dk); v_t (B, H, Dv); state (B, H, Dk, Dv) or
    None (zeros). Returns (o_t (B, H, Dv), new state (B, H, Dk, Dv)).
    """
    shape = check_head_step("rwkv7_step", r_t, k_t, v_t, state)
    for name, x in (("w_t", w_t), ("kappa_t", kappa_t), ("a_t", a_t)):
        expect_shape("rwkv7_step", name, x, r_t.shape, "(B, H, Dk) like r_t")
    if state is None:
        state = np.zeros(shape, k_t.dtype)  # (B, H, Dk, Dv)
    u = np.einsum("bhi,bhij->bhj", kappa_t, state)  # (B, H, Dv) κᵀ S
    state = (w_t[..., None] * state - (a_t * kappa_t)[..., None] * u[..., None, :]
             + k_t[..., None] * v_t[..., None, :])  # (B, H, Dk, Dv)
    return np.einsum("bhi,bhij->bhj", r_t, state), state  # (B, H, Dv)


def _scan(r, w, k, v, kappa, a):
    """Every state and output of the recurrence: (o (B, H, T, Dv), states (B, H, T+1, Dk, Dv))."""
    B, H, T, Dk = r.shape
    states = np.zeros((B, H, T + 1, Dk, v.shape[-1]), r.dtype)  # (B, H, T+1, Dk, Dv)
    o = np.empty(v.shape, r.dtype)  # (B, H, T, Dv)
    for t in range(T):
        o[:, :, t], states[:, :, t + 1] = rwkv7_step(r[:, :, t], w[:, :, t], k[:, :, t],
                                                     v[:, :, t], kappa[:, :, t], a[:, :, t],
                                                     states[:, :, t])
    return o, states


def _chunk(r, w, k, v, kappa, a, S0):
    """One chunk of the chunked form (module docstring): (O (B, H, n, Dv), S_C)."""
    n = r.shape[2]
    c = a * kappa  # (B, H, n, Dk)
    b = np.cumsum(np.log(w), axis=2)  # (B, H, n, Dk) log γ_t
    b_prev = b - np.log(w)  # log γ_{t-1}
    strict, incl = np.tril(np.ones((n, n), bool), -1), np.tril(np.ones((n, n), bool))
    ratio_prev = np.exp(np.where(strict[..., None], b_prev[:, :, :, None] - b[:, :, None],
                                 -np.inf))  # (B, H, n, n, Dk) γ_{t-1}/γ_s, s < t
    ratio = np.exp(np.where(incl[..., None], b[:, :, :, None] - b[:, :, None], -np.inf))
    A_k, A_c = (np.einsum("bhti,bhtsi,bhsi->bhts", kappa, ratio_prev, x) for x in (k, c))
    rhs = np.einsum("bhti,bhij->bhtj", np.exp(b_prev) * kappa, S0) + A_k @ v  # (B, H, n, Dv)
    U = np.linalg.solve(np.eye(n) + A_c, rhs)  # (B, H, n, Dv) u_t = S_{t-1}ᵀ κ_t
    B_k, B_c = (np.einsum("bhti,bhtsi,bhsi->bhts", r, ratio, x) for x in (k, c))
    O = np.einsum("bhti,bhij->bhtj", np.exp(b) * r, S0) + B_k @ v - B_c @ U
    last = np.exp(b[:, :, -1:] - b)  # (B, H, n, Dk) γ_C/γ_s
    S_C = (np.exp(b[:, :, -1])[..., None] * S0 + np.einsum("bhsi,bhsj->bhij", last * k, v)
           - np.einsum("bhsi,bhsj->bhij", last * c, U))  # (B, H, Dk, Dv)
    return O, S_C


def rwkv7_forward(r, w, k, v, kappa, a, *, form="recurrent", chunk=16):
    """RWKV-7's time-mixing core (wkv7), in the recurrent or the chunked form (equal to
    round-off).

    Inputs:  r, w, k, kappa, a (B, H, T, Dk): receptance, decay in (0, 1), key, removal
             key, in-context learning rate; v (B, H, T, Dv).  One float dtype.
             form "recurrent" | "chunked" (chunks of `chunk` steps).
    Returns: o (B, H, T, Dv).  Cache: the inputs and the states (B, H, T+1, Dk, Dv)
             (recurrent; the chunked form keeps none and its backward recomputes them).
    """
    r, w, k, v, kappa, a = common_float(r, w, k, v, kappa, a)
    _check("rwkv7", r, w, k, v, kappa, a)
    if form not in FORMS7:
        raise ValueError(f"rwkv7: form must be one of {FORMS7}, got {form!r}")
    if form == "recurrent":
        o, states = _scan(r, w, k, v, kappa, a)
        return o, RWKV7Cache(r, w, k, v, kappa, a, states)
    expect_integer("rwkv7", "chunk", chunk, 1)
    B, H, T, Dk = r.shape
    S = np.zeros((B, H, Dk, v.shape[-1]), r.dtype)  # (B, H, Dk, Dv)
    o = np.empty(v.shape, r.dtype)  # (B, H, T, Dv)
    for c0 in range(0, T, chunk):
        part = slice(c0, min(c0 + chunk, T))
        o[:, :, part], S = _chunk(*(x[:, :, part] for x in (r, w, k, v, kappa, a)), S)
    return o, RWKV7Cache(r, w, k, v, kappa, a, None)


def rwkv7_backward(do, cache):
    """The reverse-time adjoint scan of the module docstring (λ_t = r_t do_tᵀ + M_{t+1}ᵀ λ_{t+1}),
    derived there and checked by grads.  Returns {r, w, k, v, kappa, a}.
    Reference: Peng et al. 2025 (arXiv 2503.14456) §4 (the forward)."""
    r, w, k, v, kappa, a, states = cache
    expect_dout("rwkv7_backward", do, v.shape, v.dtype, name="do")
    if states is None:  # the chunked form: recompute the states by the recurrence
        states = _scan(r, w, k, v, kappa, a)[1]
    T = r.shape[2]
    grads = {n: np.empty_like(x) for n, x in (("r", r), ("w", w), ("k", k), ("v", v),
                                              ("kappa", kappa), ("a", a))}
    lam = np.zeros_like(states[:, :, 0])  # (B, H, Dk, Dv) M_{t+1}ᵀ λ_{t+1}, 0 after T-1
    for t in reversed(range(T)):
        S, S_prev = states[:, :, t + 1], states[:, :, t]  # (B, H, Dk, Dv)
        lam = lam + r[:, :, t, :, None] * do[:, :, t, None, :]  # fwd: o_t = S_tᵀ r_t
        grads["r"][:, :, t] = np.einsum("bhij,bhj->bhi", S, do[:, :, t])
        # fwd: S_t = diag(w) S_prev − c (κᵀ S_prev) + k vᵀ
        grads["k"][:, :, t] = np.einsum("bhij,bhj->bhi", lam, v[:, :, t])
        grads["v"][:, :, t] = np.einsum("bhij,bhi->bhj", lam, k[:, :, t])
        grads["w"][:, :, t] = np.sum(lam * S_prev, axis=-1)
        c = a[:, :, t] * kappa[:, :, t]  # (B, H, Dk)
        u = np.einsum("bhi,bhij->bhj", kappa[:, :, t], S_prev)  # (B, H, Dv) κᵀ S_prev
        lc = np.einsum("bhij,bhi->bhj", lam, c)  # (B, H, Dv) λᵀ c
        dc = -np.einsum("bhij,bhj->bhi", lam, u)  # (B, H, Dk)
        grads["kappa"][:, :, t] = -np.einsum("bhij,bhj->bhi", S_prev, lc) + a[:, :, t] * dc
        grads["a"][:, :, t] = kappa[:, :, t] * dc  # fwd: c = a ⊙ κ
        # carry: λ_{t-1} gets M_tᵀ λ_t = diag(w) λ − κ (cᵀ λ)
        lam = w[:, :, t, :, None] * lam - kappa[:, :, t, :, None] * lc[..., None, :]
    return grads


def rwkv7_recurrent(r, w, k, v, kappa, a):
    """The recurrent form, T calls of rwkv7_step. Returns (o (B, H, T, Dv), final state)."""
    r, w, k, v, kappa, a = common_float(r, w, k, v, kappa, a)
    _check("rwkv7_recurrent", r, w, k, v, kappa, a)
    o, states = _scan(r, w, k, v, kappa, a)
    return o, states[:, :, -1]


def rwkv7_recurrent_ref(r, w, k, v, kappa, a):
    """The plain loop, one sequence and head at a time, in the paper's orientation (Dv, Dk)
    with the transition matrix written out: S ← S (diag(w) − κᵀ (a ⊙ κ)) + vᵀ k, o = S r.
    Returns (o (B, H, T, Dv), final state transposed to (B, H, Dk, Dv))."""
    r, w, k, v, kappa, a = common_float(r, w, k, v, kappa, a)
    _check("rwkv7_recurrent_ref", r, w, k, v, kappa, a)
    B, H, T, Dk = r.shape
    Dv = v.shape[-1]
    o = np.zeros((B, H, T, Dv), r.dtype)  # (B, H, T, Dv)
    final = np.zeros((B, H, Dk, Dv), r.dtype)  # (B, H, Dk, Dv)
    for b in range(B):
        for h in range(H):
            S = np.zeros((Dv, Dk), r.dtype)  # (Dv, Dk)
            for t in range(T):
                kap = kappa[b, h, t]
                G = np.diag(w[b, h, t]) - np.outer(kap, a[b, h, t] * kap)  # (Dk, Dk)
                S = S @ G + np.outer(v[b, h, t], k[b, h, t])
                o[b, h, t] = S @ r[b, h, t]
            final[b, h] = S.T
    return o, final
