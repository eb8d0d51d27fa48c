"""Causal linear attention (Katharopoulos et al. 2020, "Transformers are RNNs: Fast
Autoregressive Transformers with Linear Attention", arXiv 2006.16236).

Feature map φ(x) = elu(x) + 1 (positive, so the normaliser is > 0), or the identity.
Parallel:   o_t = Σ_{s≤t} (φ(q_t)·φ(k_s)) v_s / (Σ_{s≤t} φ(q_t)·φ(k_s) + eps)
Recurrent:  S_t = S_{t-1} + φ(k_t) v_t^T,  z_t = z_{t-1} + φ(k_t),
            o_t = S_t^T φ(q_t) / (z_t·φ(q_t) + eps)
This is gated linear attention (gla.py) with no gate, run on the values padded with a column
of ones: the padded column of the state is z, and the last output column is the normaliser.
normalize=False drops it (o_t = S_t^T φ(q_t)): Mamba-2's SSD with A = 0 is that, with φ = id.

Glossary: B batch, H heads, T time, Dk key head dim, Dv value head dim; S (Dk, Dv) and z (Dk)
the state, eps the normaliser's guard (1e-6, as upstream's `fast_transformers` layer).
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import expect_dout
from scratchllm.linear_attention.gla import (GLACache, check_head_step, check_qkv,
                                             gla_attention_step, gla_backward_parts,
                                             gla_forward_parts, gla_out)
from scratchllm.linear_attention.lanes import for_lanes

FEATURES = ("elu", "identity")


def _phi(x, feature):
    """φ(x): elu(x) + 1 = x + 1 (x > 0), exp(x) (x ≤ 0), written max(x, 0) + exp(min(x, 0))
    (plain ufuncs: a third of np.where's time); or x."""
    if feature == "identity":
        return x
    return np.maximum(x, 0) + np.exp(np.minimum(x, 0))  # (..., Dk)


def _phi_into(x, out):
    """out = elu(x) + 1 = exp(min(x, 0)) + max(x, 0): _phi's operations (a sum of two terms in
    either order has the same bits), in out."""
    np.minimum(x, 0, out=out)
    np.exp(out, out=out)
    out += np.maximum(x, 0)


def _phi_backward_into(dphi, x, out):
    """fwd: φ = elu(x) + 1  ->  dx = dφ · (1 if x > 0 else exp(x)) = dφ · exp(min(x, 0)),
    written in out (elu only: the identity's dx is dφ)."""
    np.minimum(x, 0, out=out)
    np.exp(out, out=out)
    out *= dphi


def _check_options(fn, feature, normalize):
    if feature not in FEATURES:
        raise ValueError(f"{fn}: feature must be one of {FEATURES}, got {feature!r}")
    if not isinstance(normalize, bool):
        raise TypeError(f"{fn}: normalize must be a bool, got {type(normalize).__name__}")


def _with_ones(v, normalize):
    """v padded with a column of ones when normalising: (..., Dv + 1)."""
    if not normalize:
        return v
    return np.concatenate([v, np.ones(v.shape[:-1] + (1,), v.dtype)], axis=-1)  # (..., Dv+1)


def _normalise(out, normalize, eps):
    """Split the last column (the normaliser) off and divide by it."""
    if not normalize:
        return out
    return out[..., :-1] / (out[..., -1:] + eps)  # (..., Dv)


class LinearAttentionCache(NamedTuple):
    q: np.ndarray
    k: np.ndarray
    feature: str
    eps: float
    out: np.ndarray  # (B, H, T, Dv + 1) numerator and normaliser; None when not normalising
    gla: GLACache


def linear_attention_forward(q, k, v, *, feature="elu", normalize=True, eps=1e-6,
                             form="chunked", chunk=64):
    """Causal linear attention in the parallel, chunked or recurrent form (equal to round-off).

    Inputs:  q, k (B, H, T, Dk); v (B, H, T, Dv).  feature "elu" (φ = elu + 1) | "identity";
             normalize: divide by φ(q_t)·z_t + eps.  form "parallel" | "chunked" | "recurrent".
    Returns: o (B, H, T, Dv).  Cache: q, k, the numerator and normaliser, the GLA cache.
    """
    fn = "linear_attention"
    check_qkv(fn, q, k, v)
    _check_options(fn, feature, normalize)
    lanes = q.shape[:2] + (q.size + v.size,)  # the elementwise steps in threads too (lanes.py)
    phq, phk = (x if feature == "identity" else np.empty_like(x) for x in (q, k))
    vv = np.empty(v.shape[:-1] + (v.shape[-1] + 1,), v.dtype) if normalize else v

    def features(i):  # φ(q), φ(k) and [v | 1] for the lanes i, written in place
        if feature != "identity":
            _phi_into(q[i], phq[i])
            _phi_into(k[i], phk[i])
        if normalize:
            vv[i][..., :-1], vv[i][..., -1] = v[i], 1
    if feature != "identity" or normalize:
        for_lanes(features, *lanes)
    out, gla = gla_forward_parts(fn, phq, phk, vv, None, form, chunk)  # (B, H, T, Dv+1)
    cache = LinearAttentionCache(q, k, feature, eps, out if normalize else None, gla)
    if not normalize:
        return out, cache
    o = np.empty(out.shape[:-1] + (out.shape[-1] - 1,), out.dtype)  # (B, H, T, Dv)
    for_lanes(lambda i: np.divide(out[i][..., :-1], out[i][..., -1:] + eps, out=o[i]), *lanes)
    return o, cache


def _linear_out(cache):
    """(shape, dtype) of linear attention's o: the GLA output without the normaliser column."""
    (B, H, T, Dv), dtype = gla_out(cache.gla)
    return (B, H, T, Dv - (cache.out is not None)), dtype


def linear_attention_backward(do, cache):
    """Math: with num = S_t^T φq_t, den = z_t·φq_t + eps, o = num / den:
    dnum = do / den, dden = −Σ_j do_j num_j / den²; then the GLA backward (no gate) on the
    values padded with ones (the ones get no gradient) and dq = dφq ⊙ φ'(q), dk likewise,
    φ'(x) = 1 for x > 0 and exp(x) below. The recurrent form's backward is the reverse-time
    adjoint λ_t = φq_t dnum_t^T + λ_{t+1}.
    Reference: Katharopoulos et al. 2020, arXiv 2006.16236, section 3.3 (the backward derived
    here).
    """
    expect_dout("linear_attention_backward", do, *_linear_out(cache), name="do")
    lanes = do.shape[:2] + (cache.q.size + do.size,)  # elementwise steps in threads (lanes.py)
    if cache.out is None:
        dout = do
    else:
        out = cache.out
        dout = np.empty(out.shape, np.result_type(do, out))  # (B, H, T, Dv + 1)

        def unnormalise(i):
            num, den = out[i][..., :-1], out[i][..., -1:] + cache.eps  # (.., Dv), (.., 1)
            # fwd: o = num / den  ->  dnum = do / den, dden = -sum(do * num) / den^2
            dout[i][..., -1:] = -(do[i] * num).sum(axis=-1, keepdims=True) / den ** 2
            np.divide(do[i], den, out=dout[i][..., :-1])
        for_lanes(unnormalise, *lanes)
    dphq, dphk, dv, _ = gla_backward_parts(dout, cache.gla)
    if cache.out is not None:
        dv = dv[..., :-1]  # the column of ones is a constant
    if cache.feature == "identity":
        return {"q": dphq, "k": dphk, "v": dv}
    dq = np.empty(dphq.shape, np.result_type(dphq, cache.q))  # (B, H, T, Dk)
    dk = np.empty(dphk.shape, np.result_type(dphk, cache.k))

    def features_backward(i):
        _phi_backward_into(dphq[i], cache.q[i], dq[i])
        _phi_backward_into(dphk[i], cache.k[i], dk[i])
    for_lanes(features_backward, *lanes)
    return {"q": dq, "k": dk, "v": dv}


def linear_attention_step(q_t, k_t, v_t, state, *, feature="elu", normalize=True, eps=1e-6):
    """One decoding step. q_t, k_t (B, H, Dk); v_t (B, H, Dv); state (B, H, Dk, Dv + 1)
    ([S | z] when normalising, else (B, H, Dk, Dv)) or None. Returns (o_t (B, H, Dv), state)."""
    _check_options("linear_attention_step", feature, normalize)
    check_head_step("linear_attention_step", q_t, k_t, v_t, state, extra=int(normalize))
    out, state = gla_attention_step(_phi(q_t, feature), _phi(k_t, feature),
                                    _with_ones(v_t, normalize), None, state)  # (B, H, Dv+1)
    return _normalise(out, normalize, eps), state


def linear_attention_recurrent(q, k, v, *, feature="elu", normalize=True, eps=1e-6):
    """The recurrent form: T calls of linear_attention_step. Returns (o (B, H, T, Dv), state)."""
    check_qkv("linear_attention_recurrent", q, k, v)
    state, outs = None, []
    for t in range(q.shape[2]):
        o_t, state = linear_attention_step(q[:, :, t], k[:, :, t], v[:, :, t], state,
                                           feature=feature, normalize=normalize, eps=eps)
        outs.append(o_t)
    return np.stack(outs, axis=2), state  # (B, H, T, Dv)


def linear_attention_recurrent_ref(q, k, v, *, feature="elu", normalize=True, eps=1e-6):
    """The plain loop of the paper's equations, one sequence and head at a time, with S and z
    kept apart. Returns (o, state) with state = [S | z] (or S) as linear_attention_recurrent."""
    check_qkv("linear_attention_recurrent_ref", q, k, v)
    _check_options("linear_attention_recurrent_ref", feature, normalize)
    B, H, T, Dk = q.shape
    Dv = v.shape[-1]
    o = np.zeros((B, H, T, Dv), q.dtype)  # (B, H, T, Dv)
    final = np.zeros((B, H, Dk, Dv + normalize), q.dtype)  # (B, H, Dk, Dv [+ 1])
    for b in range(B):
        for h in range(H):
            S, z = np.zeros((Dk, Dv), q.dtype), np.zeros(Dk, q.dtype)  # (Dk, Dv), (Dk,)
            for t in range(T):
                fq, fk = _phi(q[b, h, t], feature), _phi(k[b, h, t], feature)  # (Dk,)
                S = S + np.outer(fk, v[b, h, t])
                z = z + fk
                o[b, h, t] = fq @ S / (fq @ z + eps) if normalize else fq @ S
            final[b, h] = np.column_stack([S, z]) if normalize else S
    return o, final
