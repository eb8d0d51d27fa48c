"""The delta rule (DeltaNet: Schlag et al. 2021, arXiv 2102.11174; chunkwise training: Yang et
al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence Length",
arXiv 2406.06484) and gated DeltaNet (Yang et al. 2024, arXiv 2412.06464).

The state S (Dk, Dv) is a key -> value memory; each step replaces the value stored under k_t
by a β_t-blend with v_t (S here is the transpose of the papers' S, so that o_t = S_t^T q_t as
in gla.py):
    u_t = S_{t-1}^T k_t                        what the memory returns for k_t now
    S_t = α_t S_{t-1} + β_t k_t (v_t − α_t u_t)^T = α_t (I − β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T
    o_t = S_t^T q_t
with α_t = exp(g_t) (gated DeltaNet) or 1 (DeltaNet, g = None).
Chunkwise (the WY / UT form), per chunk of C steps entering with S_0, with b the in-chunk
cumulative log gate, γ_t = exp(b_t), Γ_ts = exp(b_t − b_s) (s ≤ t, else 0):
    the written values w_t = β_t (v_t − α_t S_{t-1}^T k_t) satisfy
    (I + diag(β) A) W = diag(β)(V − diag(γ) K S_0),
    A = Γ ⊙ strict_lower(K K^T); with T_c = (I + diag(β) A)^{-1}:  W = Ũ − Wk S_0,
    Ũ = T_c diag(β) V, Wk = T_c diag(β γ) K  (computed for every chunk at once);
    O = diag(γ) Q S_0 + (Γ ⊙ lower(Q K^T)) W,   S_C = γ_C S_0 + (K ⊙ Γ_C·)^T W.
Only S_0 -> W -> S_C runs chunk after chunk. With one chunk (C = T) this is the parallel form.

Glossary: B batch, H heads, T time, Dk key head dim, Dv value head dim, C chunk length,
n chunks; β (B, H, T) write strengths in (0, 1); g (B, H, T) log gates.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import expect_dout, expect_float, expect_positive, expect_shape
from scratchllm.linear_attention.gla import (FORMS, check_head_step, check_qkv, merge_chunks,
                                            split_chunks)
from scratchllm.linear_attention.lanes import lanes_of, map_lanes


class DeltaCache(NamedTuple):
    form: str
    q: np.ndarray  # (B, H, T, Dk) recurrent; (B, H, n, C, Dk) chunked
    k: np.ndarray
    v: np.ndarray
    beta: np.ndarray  # (B, H, T) or (B, H, n, C)
    g: np.ndarray  # log gates, same layout (zeros when ungated)
    states: np.ndarray  # S_0 .. S_T (recurrent), or the state entering each chunk
    T: int
    gated: bool


def _check(fn, q, k, v, beta, g, form, chunk):
    check_qkv(fn, q, k, v)
    expect_float(fn, "beta", beta)
    expect_shape(fn, "beta", beta, q.shape[:3], "(B, H, T)")
    if g is not None:
        expect_float(fn, "g", g)
        expect_shape(fn, "g", g, q.shape[:3], "(B, H, T): one log gate per head")
    if form not in FORMS:
        raise ValueError(f"{fn}: form must be one of {FORMS}, got {form!r}")
    if form == "chunked":
        if not isinstance(chunk, int):
            raise TypeError(f"{fn}: chunk must be an int, got {type(chunk).__name__}")
        expect_positive(fn, "chunk", chunk)


# ---------------------------------------------------------------------------- recurrent form
def delta_rule_step(q_t, k_t, v_t, beta_t, g_t, state):
    """One step: S = α S + β k (v − α S^T k)^T, o = S^T q.

    Inputs: q_t, k_t (B, H, Dk); v_t (B, H, Dv); beta_t (B, H); g_t (B, H) or None; state
    (B, H, Dk, Dv) or None (zeros). Returns (o_t (B, H, Dv), new state (B, H, Dk, Dv)).
    """
    shape = check_head_step("delta_rule_step", q_t, k_t, v_t, state)
    expect_shape("delta_rule_step", "beta_t", beta_t, q_t.shape[:2], "(B, H)")
    if g_t is not None:
        expect_shape("delta_rule_step", "g_t", g_t, q_t.shape[:2], "(B, H)")
    if state is None:
        state = np.zeros(shape, k_t.dtype)  # (B, H, Dk, Dv)
    alpha = np.ones_like(beta_t) if g_t is None else np.exp(g_t)  # (B, H)
    u = np.einsum("bhij,bhi->bhj", state, k_t)  # (B, H, Dv)
    e = v_t - alpha[..., None] * u  # (B, H, Dv)
    write = (beta_t[..., None] * k_t)[..., :, None] * e[..., None, :]  # (B, H, Dk, Dv)
    state = alpha[..., None, None] * state + write
    return np.einsum("bhi,bhij->bhj", q_t, state), state  # (B, H, Dv)


def _recurrent(q, k, v, beta, g):
    B, H, T, Dk = q.shape
    states = np.zeros((B, H, T + 1, Dk, v.shape[-1]), q.dtype)  # (B, H, T+1, Dk, Dv)
    o = np.zeros(v.shape, q.dtype)  # (B, H, T, Dv)
    for t in range(T):
        o[:, :, t], states[:, :, t + 1] = delta_rule_step(
            q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t], g[:, :, t], states[:, :, t])
    return o, states


def _recurrent_backward(do, cache):
    """Reverse-time adjoint; λ = dL/dS_t, e = v − α u, u = S_{t-1}^T k."""
    q, k, v, beta, g, states = cache.q, cache.k, cache.v, cache.beta, cache.g, cache.states
    alpha = np.exp(g)  # (B, H, T)
    dq = np.einsum("bhtij,bhtj->bhti", states[:, :, 1:], do)  # fwd: o_t = S_t^T q_t
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    dbeta, dalpha = np.zeros_like(beta), np.zeros_like(beta)  # (B, H, T)
    lam = np.zeros(states.shape[:2] + states.shape[3:], q.dtype)  # (B, H, Dk, Dv)
    for t in range(q.shape[2] - 1, -1, -1):
        S, kt, a, bt = states[:, :, t], k[:, :, t], alpha[:, :, t, None], beta[:, :, t, None]
        lam = lam + q[:, :, t, :, None] * do[:, :, t, None, :]  # through o_t
        u = np.einsum("bhij,bhi->bhj", S, kt)  # (B, H, Dv)
        e = v[:, :, t] - a * u  # (B, H, Dv)
        lam_e = np.einsum("bhij,bhj->bhi", lam, e)  # (B, H, Dk)
        # fwd: S_t = a S + b k e^T  ->  db = k^T λ e, de = b λ^T k, dk = b λ e
        dbeta[:, :, t] = (kt * lam_e).sum(-1)
        de = bt * np.einsum("bhij,bhi->bhj", lam, kt)  # (B, H, Dv)
        # fwd: e = v − a S^T k  ->  dv = de, da = −u·de, dk −= a S de, dS −= a k de^T
        dv[:, :, t] = de
        dk[:, :, t] = bt * lam_e - a * np.einsum("bhij,bhj->bhi", S, de)
        dalpha[:, :, t] = (lam * S).sum(axis=(-2, -1)) - (u * de).sum(-1)
        lam = a[..., None] * (lam - kt[..., :, None] * de[..., None, :])  # λ_{t-1} (so far)
    return dq, dk, dv, dbeta, dalpha * alpha  # fwd: α = exp(g)


# ---------------------------------------------------------------------------- chunked (WY) form
def tr(a):
    """The transpose of the last two axes."""
    return np.swapaxes(a, -1, -2)


class WYParts(NamedTuple):
    """The state-free parts of the chunked form (recomputed by the backward, not cached)."""
    Gam: np.ndarray  # (B, H, n, C, C) exp(b_t − b_s), s ≤ t
    strict: np.ndarray  # (C, C) s < t
    KK: np.ndarray  # (B, H, n, C, C) K K^T
    A: np.ndarray  # Γ ⊙ strict ⊙ K K^T
    Tinv: np.ndarray  # (I + diag(β) A)^{-1}
    gam: np.ndarray  # (B, H, n, C) exp(b)
    QK: np.ndarray
    P: np.ndarray  # Γ ⊙ Q K^T
    Ut: np.ndarray  # (B, H, n, C, Dv) T diag(β) V
    bgk: np.ndarray  # (B, H, n, C, Dk) diag(β γ) K
    Wk: np.ndarray  # T diag(β γ) K
    Kd: np.ndarray  # K ⊙ exp(b_C − b)
    decay_out: np.ndarray  # (B, H, n, C) exp(b_C − b)
    gam_C: np.ndarray  # (B, H, n, 1, 1) exp(b_C)


def _wy(q, k, v, beta, b):
    """Everything of the chunked form that needs no state, for all chunks at once."""
    C = b.shape[-1]
    lower = np.tril(np.ones((C, C), bool))  # (C, C) s ≤ t
    strict = np.tril(np.ones((C, C), k.dtype), -1)  # (C, C) s < t
    Gam = np.exp(np.where(lower, b[..., :, None] - b[..., None, :], -np.inf))  # (B,H,n,C,C)
    KK = k @ np.swapaxes(k, -1, -2)  # (B, H, n, C, C)
    A = Gam * strict * KK  # (B, H, n, C, C)
    M = np.eye(C, dtype=k.dtype) + beta[..., None] * A  # (B, H, n, C, C) unit lower
    Tinv = np.linalg.inv(M)  # (B, H, n, C, C)
    gam, decay_out = np.exp(b), np.exp(b[..., -1:] - b)  # (B, H, n, C) each
    QK = q @ np.swapaxes(k, -1, -2)  # (B, H, n, C, C)
    bgk = (beta * gam)[..., None] * k  # (B, H, n, C, Dk)
    return WYParts(Gam, strict, KK, A, Tinv, gam, QK, Gam * QK, Tinv @ (beta[..., None] * v),
                   bgk, Tinv @ bgk, k * decay_out[..., None], decay_out,
                   np.exp(b[..., -1])[..., None, None])


def _chunked(q, k, v, beta, b):
    """Chunks in order: W = Ũ − Wk S_in, O = γ Q S_in + P W, S_out = γ_C S_in + Kd^T W."""
    p = _wy(q, k, v, beta, b)
    B, H, n, C, Dk = q.shape
    states = np.zeros((B, H, n, Dk, v.shape[-1]), q.dtype)  # (B, H, n, Dk, Dv)
    S = np.zeros((B, H, Dk, v.shape[-1]), q.dtype)  # (B, H, Dk, Dv)
    for c in range(n):
        states[:, :, c] = S
        W = p.Ut[:, :, c] - p.Wk[:, :, c] @ S  # (B, H, C, Dv)
        S = p.gam_C[:, :, c] * S + np.swapaxes(p.Kd[:, :, c], -1, -2) @ W
    W = p.Ut - p.Wk @ states  # (B, H, n, C, Dv)
    return p.gam[..., None] * (q @ states) + p.P @ W, states  # (B, H, n, C, Dv)


def _chunked_backward(do, cache):
    q, k, v, beta, b, states = cache.q, cache.k, cache.v, cache.beta, cache.g, cache.states
    p = _wy(q, k, v, beta, b)
    W = p.Ut - p.Wk @ states  # (B, H, n, C, Dv)
    dO = split_chunks(do, q.shape[3])  # (B, H, n, C, Dv)
    dW, lam_out = np.zeros_like(W), np.zeros_like(states)  # dL/dW, dL/dS_out per chunk
    lam = np.zeros(states.shape[:2] + states.shape[3:], q.dtype)  # (B, H, Dk, Dv)
    PT = np.swapaxes(p.P, -1, -2)  # (B, H, n, C, C)
    for c in range(q.shape[2] - 1, -1, -1):
        lam_out[:, :, c] = lam
        # fwd: O = γ Q S_in + P W, S_out = γ_C S_in + Kd^T W, W = Ũ − Wk S_in
        dW[:, :, c] = PT[:, :, c] @ dO[:, :, c] + p.Kd[:, :, c] @ lam
        lam = (np.swapaxes(p.gam[:, :, c, :, None] * q[:, :, c], -1, -2) @ dO[:, :, c]
               + p.gam_C[:, :, c] * lam - np.swapaxes(p.Wk[:, :, c], -1, -2) @ dW[:, :, c])
    dKd = W @ tr(lam_out)  # (B, H, n, C, Dk)
    dgam_C = (lam_out * states).sum(axis=(-2, -1))  # (B, H, n)
    dgq, dP = dO @ tr(states), dO @ tr(W)  # d(γ Q) (B,H,n,C,Dk), dP (B,H,n,C,C)
    dWk = -dW @ tr(states)  # (B, H, n, C, Dk)
    # fwd: Ũ = T (β V), Wk = T (β γ K), T = M^{-1}  ->  dT, then dM = −T^T dT T^T
    dTinv = dW @ tr(beta[..., None] * v) + dWk @ tr(p.bgk)  # (B, H, n, C, C)
    dbv, dbgk = tr(p.Tinv) @ dW, tr(p.Tinv) @ dWk  # (B,H,n,C,Dv), (B,H,n,C,Dk)
    dM = -tr(p.Tinv) @ dTinv @ tr(p.Tinv)  # (B, H, n, C, C)
    # fwd: M = I + diag(β) A,  A = Γ ⊙ strict ⊙ K K^T,  P = Γ ⊙ Q K^T
    dbeta = (dM * p.A).sum(-1) + (dbv * v).sum(-1) + (dbgk * k).sum(-1) * p.gam
    dA = beta[..., None] * dM  # (B, H, n, C, C)
    dKK = dA * p.Gam * p.strict  # (B, H, n, C, C)
    dQK = dP * p.Gam  # (B, H, n, C, C)
    dGam = dA * p.strict * p.KK + dP * p.QK  # (B, H, n, C, C)
    dq = dQK @ k + p.gam[..., None] * dgq
    dk = ((dKK + tr(dKK)) @ k + tr(dQK) @ q + (beta * p.gam)[..., None] * dbgk
          + dKd * p.decay_out[..., None])
    dv = beta[..., None] * dbv
    # the log gates: Γ_ts = exp(b_t − b_s), γ = exp(b), Kd = K exp(b_C − b), γ_C = exp(b_C)
    ddiff = dGam * p.Gam  # (B, H, n, C, C)
    wk = (dKd * p.Kd).sum(-1)  # (B, H, n, C)
    dgam = (dgq * q).sum(-1) + (dbgk * k).sum(-1) * beta  # (B, H, n, C)
    db = ddiff.sum(-1) - ddiff.sum(-2) + dgam * p.gam - wk
    db[..., -1] += wk.sum(-1) + dgam_C * p.gam_C[..., 0, 0]
    dg = np.flip(np.cumsum(np.flip(db, -1), axis=-1), -1)  # fwd: b = cumsum(g) in the chunk
    return dq, dk, dv, dbeta, dg


# ---------------------------------------------------------------------------- the public pair
def delta_rule_forward(q, k, v, beta, g=None, *, form="chunked", chunk=64):
    """DeltaNet (g = None) or gated DeltaNet (g given), in the parallel, chunked (WY) or
    recurrent form (equal to round-off).

    Inputs:  q, k (B, H, T, Dk) (the papers L2-normalise k; any k is computed exactly);
             v (B, H, T, Dv); beta (B, H, T) write strengths; g (B, H, T) log gates or None.
    Returns: o (B, H, T, Dv).  Cache: the inputs (chunked) and the states S_0 .. (recurrent:
             every step's; chunked: each chunk's entering state).
    """
    _check("delta_rule", q, k, v, beta, g, form, chunk)
    T = q.shape[2]
    g0 = np.zeros_like(beta) if g is None else g  # (B, H, T)
    if form == "recurrent":
        o, states = _recurrent(q, k, v, beta, g0)
        return o, DeltaCache(form, q, k, v, beta, g0, states, T, g is not None)
    C = T if form == "parallel" else chunk
    qc, kc, vc = split_chunks(q, C), split_chunks(k, C), split_chunks(v, C)  # (B,H,n,C,*)
    bc, beta_c = (split_chunks(a[..., None], C)[..., 0] for a in (g0, beta))  # (B, H, n, C)
    bc = np.cumsum(bc, axis=-1)  # in-chunk cumulative log gate
    o, states = map_lanes(lambda i: _chunked(qc[i], kc[i], vc[i], beta_c[i], bc[i]),
                          *q.shape[:2], q.size + v.size)  # lane groups in threads (lanes.py)
    return merge_chunks(o, T), DeltaCache(form, qc, kc, vc, beta_c, bc, states, T, g is not None)


def delta_rule_backward(do, cache):
    """Math (recurrent, reverse time): λ_t = q_t do_t^T + α_{t+1} (λ_{t+1} − k_{t+1} de_{t+1}^T);
    with e = v − α S_{t-1}^T k: dβ = k^T λ e, de = β λ^T k, dv = de, dk = β λ e − α S_{t-1} de,
    dα = ⟨λ, S_{t-1}⟩ − (S_{t-1}^T k)·de, dg = α dα, dq = S_t do.
    Math (chunked): the state's adjoint runs chunk by chunk backwards through
    W = Ũ − Wk S_in, O = γ Q S_in + P W, S_out = γ_C S_in + Kd^T W; then the inverse
    T = M^{-1} gives dM = −T^T dT T^T, and M = I + diag(β)(Γ ⊙ strict(K K^T)),
    P = Γ ⊙ lower(Q K^T) and Γ_ts = exp(b_t − b_s) are undone line by line; dg is the
    reverse cumsum of db within each chunk.
    Reference: Yang et al. 2024, arXiv 2406.06484, section 3 (the WY form, the backward
    derived here).
    """
    expect_dout("delta_rule_backward", do, cache.q.shape[:2] + (cache.T, cache.v.shape[-1]),
                np.result_type(cache.q, cache.k, cache.v, cache.beta), name="do")  # (B, H, T, Dv)
    if cache.form == "recurrent":
        dq, dk, dv, dbeta, dg = _recurrent_backward(do, cache)
    else:
        T = cache.T
        fields = ("q", "k", "v", "beta", "g", "states")
        dq, dk, dv, dbeta, dg = map_lanes(
            lambda i: _chunked_backward(do[i], lanes_of(cache, i, fields)), *do.shape[:2],
            cache.q.size + cache.v.size)
        dq, dk, dv = merge_chunks(dq, T), merge_chunks(dk, T), merge_chunks(dv, T)
        dbeta, dg = (merge_chunks(a[..., None], T)[..., 0] for a in (dbeta, dg))
    grads = {"q": dq, "k": dk, "v": dv, "beta": dbeta}
    if cache.gated:
        grads["g"] = dg
    return grads


def delta_rule_final_state(cache):
    """The state S_T (B, H, Dk, Dv) after the last step of the delta_rule_forward that made
    `cache`: the recurrent form's last state, or the chunked form's last chunk run from the
    state entering it, S_C = γ_C S_in + Kd^T (Ũ − Wk S_in) (its zero padding writes nothing:
    β = 0 there). What a prefill hands to delta_rule_step."""
    if cache.form == "recurrent":
        return cache.states[:, :, -1].copy()
    p = _wy(*(a[:, :, -1:] for a in (cache.q, cache.k, cache.v, cache.beta, cache.g)))
    S = cache.states[:, :, -1:]  # (B, H, 1, Dk, Dv)
    W = p.Ut - p.Wk @ S  # (B, H, 1, C, Dv)
    return (p.gam_C * S + np.swapaxes(p.Kd, -1, -2) @ W)[:, :, 0]  # (B, H, Dk, Dv)


def delta_rule_recurrent(q, k, v, beta, g=None):
    """The recurrent form, T calls of delta_rule_step. Returns (o (B, H, T, Dv), final state)."""
    _check("delta_rule_recurrent", q, k, v, beta, g, "recurrent", None)
    state, outs = None, []
    for t in range(q.shape[2]):
        o_t, state = delta_rule_step(q[:, :, t], k[:, :, t], v[:, :, t], beta[:, :, t],
                                     None if g is None else g[:, :, t], state)
        outs.append(o_t)
    return np.stack(outs, axis=2), state  # (B, H, T, Dv)


def delta_rule_recurrent_ref(q, k, v, beta, g=None):
    """The plain loop, one sequence and head at a time, in the papers' orientation M (Dv, Dk):
    M ← α M (I − β k k^T) + β v k^T, o = M q. Returns (o, final state M^T (Dk, Dv))."""
    _check("delta_rule_recurrent_ref", q, k, v, beta, g, "recurrent", None)
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    o = np.zeros((B, H, T, Dv), q.dtype)  # (B, H, T, Dv)
    final = np.zeros((B, H, Dk, Dv), q.dtype)  # (B, H, Dk, Dv)
    for b in range(B):
        for h in range(H):
            M = np.zeros((Dv, Dk), q.dtype)  # (Dv, Dk)
            for t in range(T):
                kt, bt = k[b, h, t], beta[b, h, t]
                alpha = 1.0 if g is None else np.exp(g[b, h, t])
                M = alpha * M @ (np.eye(Dk) - bt * np.outer(kt, kt)) + bt * np.outer(v[b, h, t], kt)
                o[b, h, t] = M @ q[b, h, t]
            final[b, h] = M.T
    return o, final
