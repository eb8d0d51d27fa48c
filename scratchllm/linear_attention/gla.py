"""Gated linear attention (GLA, Yang et al. 2023, "Gated Linear Attention Transformers with
Hardware-Efficient Training", arXiv 2312.06635): the engine the whole family runs on. Linear
attention (no gate), RetNet (one constant gate per head) and Mamba-2's SSD (one data-dependent
gate per head) are this recurrence with a narrower gate.

Recurrent (constant memory):   S_t = diag(α_t) S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t
with α_t = exp(g_t) in (0, 1] and S (Dk, Dv) per (batch, head), S_0 = 0.
Parallel (masked attention with cumulative-decay factors), b_t = g_1 + ... + g_t:
    o_t = Σ_{s≤t} P_ts v_s,   P_ts = Σ_i q_t[i] k_s[i] exp(b_t[i] − b_s[i])
Chunked (size C): the parallel form inside each chunk, plus the state at each chunk's edge:
    o_t += (q_t ⊙ exp(b_t))^T S_in,   S_out = diag(exp(b_C)) S_in + Σ_s (k_s ⊙ exp(b_C − b_s)) v_s^T
with b counted from the chunk's start. Every exp argument above is ≤ 0 (s ≤ t and g ≤ 0), so
no gate, however large, overflows in float32; the pairs (t, s > t) are masked *before* exp.
The parallel form is the chunked form with one chunk (no state is passed). With a gate per
channel the intra-chunk scores are a Numba kernel (gla_scores.py, with its NumPy twin).

Gates g: (B, H, T, Dk) one per key channel (GLA), (B, H, T) one per head (RetNet, SSD), or
None (α = 1: linear attention). Ragged T is zero-padded to whole chunks (a zero key adds
nothing to the state and the padded outputs are dropped).

Glossary: B batch, H heads, T time, Dk key (and query) head dim, Dv value head dim, C chunk
length, n = ceil(T / C) chunks, G gate width (Dk, or 1 for a per-head gate); S the state.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_ndim,
                                      expect_positive, expect_shape)
from scratchllm.linear_attention.gla_scores import (decay_tensor, gla_scores_backward,
                                                    gla_scores_forward)
from scratchllm.linear_attention.gla_chunks import chunked_backward_kernel_call, chunked_kernel

FORMS = ("parallel", "chunked", "recurrent")


class GLACache(NamedTuple):
    form: str
    q: np.ndarray  # (B, H, n, C, Dk) chunked, (B, H, T, Dk) recurrent
    k: np.ndarray
    v: np.ndarray
    b: np.ndarray  # chunked: in-chunk cumulative log gate (B, H, n, C, G); recurrent: α
    #                (B, H, T, G)
    states: np.ndarray  # chunked: state entering each chunk (B, H, n, Dk, Dv); recurrent: S_0..S_T
    T: int
    gate: str  # "none" | "head" | "channel": the layout of g, to return dg in it


def check_qkv(fn, q, k, v):
    """q, k (B, H, T, Dk) and v (B, H, T, Dv) float arrays."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        expect_ndim(fn, name, a, 4, "(B, H, T, Dh)")
        expect_float(fn, name, a)
    expect_shape(fn, "k", k, q.shape, "the shape of q")
    expect_shape(fn, "v", v, q.shape[:3] + (None,), "(B, H, T, Dv) like q")


def check_head_step(fn, q_t, k_t, v_t, state, *, extra=0):
    """One decoding step's inputs: q_t, k_t (B, H, Dk) and v_t (B, H, Dv) float arrays; the
    state None or exactly (B, H, Dk, Dv + extra), never broadcast. Returns the state's
    shape."""
    for name, a in (("q_t", q_t), ("k_t", k_t), ("v_t", v_t)):
        expect_float(fn, name, a)
        expect_ndim(fn, name, a, 3, "(B, H, Dh)")
    expect_shape(fn, "k_t", k_t, q_t.shape, "(B, H, Dk) like q_t")
    expect_shape(fn, "v_t", v_t, q_t.shape[:2] + (None,), "(B, H, Dv) like q_t")
    shape = q_t.shape + (v_t.shape[-1] + extra,)
    if state is not None:
        expect_shape(fn, "state", state, shape, "(B, H, Dk, Dv) of this step's rows")
    return shape


def _gate(fn, g, q):
    """g as (B, H, T, G) and its layout name; None -> zeros (B, H, T, 1)."""
    if g is None:
        return np.zeros(q.shape[:3] + (1,), q.dtype), "none"  # (B, H, T, 1)
    expect_float(fn, "g", g)
    if g.ndim == 3:
        expect_shape(fn, "g", g, q.shape[:3], "(B, H, T): one log gate per head")
        return g[..., None], "head"  # (B, H, T, 1)
    expect_shape(fn, "g", g, q.shape, "(B, H, T, Dk) or (B, H, T)")
    return g, "channel"


def split_chunks(a, C):
    """(B, H, T, X) -> (B, H, n, C, X), zero-padded at the end."""
    B, H, T, X = a.shape
    n = -(-T // C)
    if n * C == T:
        return a.reshape(B, H, n, C, X)  # (B, H, n, C, X), no padding needed
    pad = np.zeros((B, H, n * C - T, X), a.dtype)  # (B, H, nC - T, X)
    return np.concatenate([a, pad], axis=2).reshape(B, H, n, C, X)  # (B, H, n, C, X)


def merge_chunks(a, T):
    """(B, H, n, C, X) -> (B, H, T, X), the padding dropped."""
    B, H, n, C, X = a.shape
    return a.reshape(B, H, n * C, X)[:, :, :T]  # (B, H, T, X)


def _to_gate(w, G):
    """Sum a (..., Dk) gradient onto a gate of width G (1: a per-head gate)."""
    return w if G > 1 else w.sum(axis=-1, keepdims=True)


def _scores(q, k, b):
    """P_ts = Σ_i q_t[i] k_s[i] exp(b_t[i] − b_s[i]) (s ≤ t) and what its backward needs.
    A per-head gate factors out of the sum: P = (q k^T) ⊙ E with E (..., C, C); a gate per
    channel goes to the Numba kernel of gla_scores.py."""
    if b.shape[-1] > 1:
        return gla_scores_forward(q, k, b)
    E = decay_tensor(b)[..., 0]  # (..., C, C)
    return (q @ np.swapaxes(k, -1, -2)) * E, E  # (..., C, C)


def _scores_backward(dP, q, k, E):
    """(dq, dk, db) of P = scores(q, k, b); E is the per-head decay or gla_scores' cache."""
    if not isinstance(E, np.ndarray):
        g = gla_scores_backward(dP, E)
        return g["q"], g["k"], g["b"]
    # fwd: P = (q k^T) ⊙ E  ->  d(qk) = dP ⊙ E, dE = dP ⊙ (q k^T)
    dqk = dP * E  # (..., C, C)
    W = dqk * (q @ np.swapaxes(k, -1, -2))  # (..., C, C) = d(b_t − b_s)
    db = (W.sum(axis=-1) - W.sum(axis=-2))[..., None]  # (..., C, 1)
    return dqk @ k, np.swapaxes(dqk, -1, -2) @ q, db


def _chunked(q, k, v, g, C):
    """The chunked forward on (B, H, T, *) arrays; returns o (B, H, T, Dv) and the cache parts."""
    T = q.shape[2]
    qc, kc, vc = split_chunks(q, C), split_chunks(k, C), split_chunks(v, C)  # (B, H, n, C, Dk/Dv)
    b = np.cumsum(split_chunks(g, C), axis=3)  # (B, H, n, C, G)
    o = _scores(qc, kc, b)[0] @ vc  # (B, H, n, C, Dv) intra-chunk
    last = b[..., -1:, :]  # (B, H, n, 1, G)
    X = np.swapaxes(kc * np.exp(last - b), -1, -2) @ vc  # (B, H, n, Dk, Dv)
    decay = np.swapaxes(np.exp(last), -1, -2)  # (B, H, n, G, 1) scales the rows of S
    states = np.zeros(X.shape, q.dtype)  # (B, H, n, Dk, Dv) state entering each chunk
    for c in range(1, X.shape[2]):
        states[:, :, c] = decay[:, :, c - 1] * states[:, :, c - 1] + X[:, :, c - 1]
    o = o + (qc * np.exp(b)) @ states  # (B, H, n, C, Dv) inter-chunk
    return merge_chunks(o, T), (qc, kc, vc, b, states)


def _chunked_backward(do, cache):
    qc, kc, vc, b, states = cache.q, cache.k, cache.v, cache.b, cache.states
    G = b.shape[-1]
    doc = split_chunks(do, qc.shape[3])  # (B, H, n, C, Dv)
    P, E = _scores(qc, kc, b)  # (B, H, n, C, C), recomputed
    last = b[..., -1:, :]  # (B, H, n, 1, G)
    kd, qd = kc * np.exp(last - b), qc * np.exp(b)  # (B, H, n, C, Dk)
    decay = np.swapaxes(np.exp(last), -1, -2)  # (B, H, n, G, 1)
    # fwd: o += qd @ S_in  ->  dqd = do S_in^T, dS_in = qd^T do
    dqd = doc @ np.swapaxes(states, -1, -2)  # (B, H, n, C, Dk)
    dS_in = np.swapaxes(qd, -1, -2) @ doc  # (B, H, n, Dk, Dv)
    # fwd: S_in[c+1] = decay[c] S_in[c] + X[c]  ->  reverse-time over chunks
    dX = np.zeros(states.shape, states.dtype)  # (B, H, n, Dk, Dv)
    ddecay = np.zeros(decay.shape, decay.dtype)  # (B, H, n, G, 1)
    lam = np.zeros(states.shape[:2] + states.shape[3:], states.dtype)  # (B, H, Dk, Dv)
    for c in range(states.shape[2] - 1, -1, -1):
        dX[:, :, c] = lam
        ddecay[:, :, c] = _to_gate((lam * states[:, :, c]).sum(-1), G)[..., None]
        lam = dS_in[:, :, c] + decay[:, :, c] * lam
    # fwd: X = kd^T v, kd = k ⊙ exp(last − b), decay = exp(last)
    dkd = vc @ np.swapaxes(dX, -1, -2)  # (B, H, n, C, Dk)
    dv = kd @ dX  # (B, H, n, C, Dv)
    dlast = np.swapaxes(ddecay * decay, -1, -2)  # (B, H, n, 1, G)
    wk = _to_gate(dkd * kd, G)  # (B, H, n, C, G)
    dlast = dlast + wk.sum(axis=3, keepdims=True)
    db = -wk + _to_gate(dqd * qd, G)  # fwd: qd = q ⊙ exp(b)
    # fwd: o = P v  ->  dP = do v^T (masked through E), dv += P^T do
    dP = doc @ np.swapaxes(vc, -1, -2)  # (B, H, n, C, C)
    dv = dv + np.swapaxes(P, -1, -2) @ doc
    dq_s, dk_s, db_s = _scores_backward(dP, qc, kc, E)
    dq = dq_s + dqd * np.exp(b)  # (B, H, n, C, Dk)
    dk = dk_s + dkd * np.exp(last - b)  # (B, H, n, C, Dk)
    db = db + db_s
    db[..., -1:, :] += dlast  # fwd: last = b[..., -1]
    dg = np.flip(np.cumsum(np.flip(db, 3), axis=3), 3)  # fwd: b = cumsum(g) in the chunk
    T = cache.T
    return merge_chunks(dq, T), merge_chunks(dk, T), merge_chunks(dv, T), merge_chunks(dg, T)


def _chunked_fast(q, k, v, g, C):
    """_chunked with its core in gla_chunks' Numba kernel (lanes in parallel, no GIL): the
    same numbers to round-off."""
    T = q.shape[2]
    qc, kc, vc = split_chunks(q, C), split_chunks(k, C), split_chunks(v, C)  # (B, H, n, C, *)
    b = np.cumsum(split_chunks(g, C), axis=3)  # (B, H, n, C, G)
    o, states = chunked_kernel(qc, kc, vc, b)  # (B, H, n, C, Dv), (B, H, n, Dk, Dv)
    return merge_chunks(o, T), (qc, kc, vc, b, states)


def _chunked_backward_fast(do, cache):
    """_chunked_backward with its core in gla_chunks' Numba kernel."""
    doc = split_chunks(do, cache.q.shape[3])  # (B, H, n, C, Dv)
    grads = chunked_backward_kernel_call(doc, cache.q, cache.k, cache.v, cache.b, cache.states)
    return tuple(merge_chunks(a, cache.T) for a in grads)


def _recurrence(q, k, v, a):
    """o_t = S_t^T q_t with S_t = diag(a_t) S_{t-1} + k_t v_t^T; returns o and S_0 .. S_T."""
    B, H, T, Dk = q.shape
    states = np.zeros((B, H, T + 1, Dk, v.shape[-1]), q.dtype)  # (B, H, T+1, Dk, Dv)
    for t in range(T):
        states[:, :, t + 1] = (a[:, :, t, :, None] * states[:, :, t]
                               + k[:, :, t, :, None] * v[:, :, t, None, :])
    o = np.einsum("bhti,bhtij->bhtj", q, states[:, :, 1:])  # (B, H, T, Dv)
    return o, states


def _recurrence_backward(do, cache):
    """The reverse-time adjoint: λ_t = dL/dS_t = q_t do_t^T + diag(α_{t+1}) λ_{t+1}."""
    q, k, v, a, states = cache.q, cache.k, cache.v, cache.b, cache.states
    G, T = a.shape[-1], q.shape[2]
    dq = np.einsum("bhtij,bhtj->bhti", states[:, :, 1:], do)  # fwd: o_t = S_t^T q_t
    dk, dv = np.zeros_like(k), np.zeros_like(v)  # (B, H, T, Dk), (B, H, T, Dv)
    da = np.zeros_like(a)  # (B, H, T, G)
    lam = np.zeros(states.shape[:2] + states.shape[3:], q.dtype)  # (B, H, Dk, Dv)
    for t in range(T - 1, -1, -1):
        lam = lam + q[:, :, t, :, None] * do[:, :, t, None, :]  # + dL/dS_t through o_t
        # fwd: S_t = diag(a_t) S_{t-1} + k_t v_t^T
        dk[:, :, t] = np.einsum("bhij,bhj->bhi", lam, v[:, :, t])
        dv[:, :, t] = np.einsum("bhij,bhi->bhj", lam, k[:, :, t])
        da[:, :, t] = _to_gate((lam * states[:, :, t]).sum(-1), G)
        lam = a[:, :, t, :, None] * lam  # λ_{t-1} gets diag(a_t) λ_t
    return dq, dk, dv, da * a  # fwd: a = exp(g)  ->  dg = da ⊙ a


def gla_forward_parts(fn, q, k, v, g, form, chunk):
    """Shared by the family's forwards: run `form` on checked inputs -> (o, GLACache)."""
    check_qkv(fn, q, k, v)
    g4, gate = _gate(fn, g, q)  # (B, H, T, G)
    if form not in FORMS:
        raise ValueError(f"{fn}: form must be one of {FORMS}, got {form!r}")
    if form == "recurrent":
        a = np.exp(g4)  # (B, H, T, G)
        o, states = _recurrence(q, k, v, a)
        return o, GLACache(form, q, k, v, a, states, q.shape[2], gate)
    if form == "chunked":
        if not isinstance(chunk, int):
            raise TypeError(f"{fn}: chunk must be an int, got {type(chunk).__name__}")
        expect_positive(fn, "chunk", chunk)
    C = q.shape[2] if form == "parallel" else chunk
    o, (qc, kc, vc, b, states) = _chunked_fast(q, k, v, g4, max(C, 1))
    return o, GLACache(form, qc, kc, vc, b, states, q.shape[2], gate)


def gla_out(cache):
    """(shape, dtype) of the output o (B, H, T, Dv) that made a GLACache: what its dout must be."""
    return cache.q.shape[:2] + (cache.T, cache.v.shape[-1]), np.result_type(cache.q, cache.k,
                                                                            cache.v, cache.b)


def gla_backward_parts(do, cache):
    """(dq, dk, dv, dg) with dg in g's layout (None when there was no gate)."""
    back = _recurrence_backward if cache.form == "recurrent" else _chunked_backward_fast
    dq, dk, dv, dg = back(do, cache)
    dg = {"none": None, "head": dg[..., 0], "channel": dg}[cache.gate]
    return dq, dk, dv, dg


# ---------------------------------------------------------------------------- the public pair
def gla_attention_forward(q, k, v, g, *, form="chunked", chunk=64):
    """Gated linear attention, o_t = S_t^T q_t with S_t = diag(exp g_t) S_{t-1} + k_t v_t^T.

    Inputs:  q, k (B, H, T, Dk); v (B, H, T, Dv); g (B, H, T, Dk) or (B, H, T) log forget
             gates (≤ 0 keeps the state bounded; any real g is computed exactly), or None.
             form "parallel" | "chunked" (chunk = C) | "recurrent": equal to round-off.
    Returns: o (B, H, T, Dv).  Cache: the (chunked) inputs, cumulative gates, edge states.
    """
    q, k, v, g = common_float(q, k, v, g)
    return gla_forward_parts("gla_attention", q, k, v, g, form, chunk)


def gla_attention_backward(do, cache):
    """Math (chunked): per chunk, in reverse: the state's adjoint λ_c = dS_in[c] +
    diag(exp b_C) λ_{c+1}; then X = kd^T v, o += qd S_in and o = P v through their own lines,
    P's gradient onto b as d(b_t − b_s), and dg = reverse cumsum of db within the chunk.
    Math (recurrent): λ_t = q_t do_t^T + diag(α_{t+1}) λ_{t+1}; dq_t = S_t do_t,
    dk_t = λ_t v_t, dv_t = λ_t^T k_t, dg_t = α_t ⊙ rowsum(λ_t ⊙ S_{t-1}).
    Reference: Yang et al. 2023, arXiv 2312.06635, section 4 (the chunkwise form, the
    backward derived here).
    """
    expect_dout("gla_attention_backward", do, *gla_out(cache), name="do")
    dq, dk, dv, dg = gla_backward_parts(do, cache)
    grads = {"q": dq, "k": dk, "v": dv}
    if dg is not None:
        grads["g"] = dg
    return grads


def gla_attention_step(q_t, k_t, v_t, g_t, state):
    """One decoding step: S = diag(exp g_t) S + k_t v_t^T, o_t = S^T q_t.

    Inputs:  q_t, k_t (B, H, Dk); v_t (B, H, Dv); g_t (B, H, Dk), (B, H) or None;
             state (B, H, Dk, Dv) or None (zeros).
    Returns: (o_t (B, H, Dv), new state (B, H, Dk, Dv)); the state's size never grows.
    """
    shape = check_head_step("gla_attention_step", q_t, k_t, v_t, state)
    if g_t is not None:
        expect_shape("gla_attention_step", "g_t", g_t, q_t.shape[:2] + q_t.shape[2:] * (
            g_t.ndim == 3), "(B, H, Dk) or (B, H)")
    if state is None:
        state = np.zeros(shape, k_t.dtype)  # (B, H, Dk, Dv)
    if g_t is not None:
        a = np.exp(g_t if g_t.ndim == 3 else g_t[..., None])  # (B, H, G)
        state = a[..., None] * state  # (B, H, Dk, Dv)
    state = state + k_t[..., :, None] * v_t[..., None, :]  # (B, H, Dk, Dv)
    return np.einsum("bhi,bhij->bhj", q_t, state), state  # (B, H, Dv)


def gla_attention_recurrent(q, k, v, g):
    """The recurrent form over a whole sequence, T calls of gla_attention_step.

    Inputs as gla_attention_forward.  Returns: (o (B, H, T, Dv), final state (B, H, Dk, Dv)).
    """
    check_qkv("gla_attention_recurrent", q, k, v)
    _gate("gla_attention_recurrent", g, q)
    state, outs = None, []
    for t in range(q.shape[2]):
        g_t = None if g is None else g[:, :, t]
        o_t, state = gla_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], g_t, state)
        outs.append(o_t)
    return np.stack(outs, axis=2), state  # (B, H, T, Dv)


def gla_attention_recurrent_ref(q, k, v, g):
    """The plain loop, one sequence and one head at a time, scalars written out:
    S[i, j] = α_t[i] S[i, j] + k_t[i] v_t[j];  o_t[j] = Σ_i q_t[i] S[i, j]."""
    check_qkv("gla_attention_recurrent_ref", q, k, v)
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    o = np.zeros((B, H, T, Dv), q.dtype)  # (B, H, T, Dv)
    final = np.zeros((B, H, Dk, Dv), q.dtype)  # (B, H, Dk, Dv)
    for b in range(B):
        for h in range(H):
            S = np.zeros((Dk, Dv), q.dtype)  # (Dk, Dv)
            for t in range(T):
                for i in range(Dk):
                    alpha = 1.0 if g is None else np.exp(g[b, h, t] if g.ndim == 3
                                                         else g[b, h, t, i])
                    S[i] = alpha * S[i] + k[b, h, t, i] * v[b, h, t]
                o[b, h, t] = q[b, h, t] @ S
            final[b, h] = S
    return o, final
