"""Mamba-2's state-space duality (SSD; Dao & Gu 2024, "Transformers are SSMs", arXiv
2405.21060; upstream `state-spaces/mamba mamba_ssm/modules/ssd_minimal.py`).

A selective SSM whose A is one scalar per head, with B and C shared by the heads of a group:
    h_t = exp(Δ_t A) h_{t-1} + B_t (Δ_t x_t)^T        h (N, Dh) per (batch, head)
    y_t = h_t^T C_t + D x_t
Written as attention (the dual, "quadratic" form), with a_t = Δ_t A and b = cumsum(a):
    y_t = Σ_{s≤t} exp(b_t − b_s) (C_t·B_s) Δ_s x_s + D x_t
which is gated linear attention (scratchllm/linear_attention/gla.py) with q = C, k = B,
v = Δ x and one log gate a_t per head: the chunked SSD algorithm (quadratic inside each chunk,
states passed between chunks: ssd_minimal's four steps) is that file's chunked form, the dual
is its parallel form, and the scan is its recurrent form. With A = 0 it is causal linear
attention with φ = identity and no normaliser.

Glossary: B batch (the array B is the input matrix; the code spells the size `batch`), T time,
H heads, Dh head dim (Mamba-2's headdim P), N state size, Hg groups of B and C (ngroups),
H / Hg heads per group; Δ (dt) step sizes, C chunk length in `chunk`.
"""
from typing import NamedTuple

import numba
import numpy as np

from scratchllm.attention import repeat_kv_backward, repeat_kv_forward
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_ndim,
                                      expect_shape)
from scratchllm.linear_attention.gla import (GLACache, gla_attention_step, gla_backward_parts,
                                             gla_forward_parts, gla_out)
from scratchllm.linear_attention.lanes import for_lanes, run_spans


class SSDCache(NamedTuple):
    x: np.ndarray
    dt: np.ndarray
    A: np.ndarray
    D: np.ndarray
    rep: tuple  # the repeat_kv cache of B and C (one group size)
    gla: GLACache


def _check(fn, x, dt, A, B, C, D):
    expect_ndim(fn, "x", x, 4, "(B, T, H, Dh)")
    batch, T, H, _ = x.shape
    for name, a in (("x", x), ("dt", dt), ("A", A), ("B", B), ("C", C), ("D", D)):
        expect_float(fn, name, a)
    expect_shape(fn, "dt", dt, (batch, T, H), "(B, T, H)")
    expect_shape(fn, "A", A, (H,), "(H,): one scalar per head")
    expect_ndim(fn, "B", B, 4, "(B, T, Hg, N)")
    expect_shape(fn, "B", B, (batch, T, None, None), "(B, T, Hg, N)")
    expect_shape(fn, "C", C, B.shape, "the shape of B")
    if H % B.shape[2]:
        raise ValueError(f"{fn}: H={H} heads must be a multiple of Hg={B.shape[2]} groups")
    expect_shape(fn, "D", D, (H,), "(H,)")
    return H // B.shape[2]


def _check_step(x_t, dt_t, A, BCD, state):
    """ssd_step's inputs: _check's shapes without the time axis, and the state exactly
    (B, H, N, Dh) or None, never broadcast. Returns the group size H / Hg."""
    fn = "ssd_step"
    B_t, C_t, D = BCD
    expect_ndim(fn, "x_t", x_t, 3, "(B, H, Dh)")
    for name, a in (("x_t", x_t), ("dt_t", dt_t), ("A", A), ("B_t", B_t), ("C_t", C_t),
                    ("D", D)):
        expect_float(fn, name, a)
    batch, H, Dh = x_t.shape
    expect_shape(fn, "dt_t", dt_t, (batch, H), "(B, H)")
    for name, a in (("A", A), ("D", D)):
        expect_shape(fn, name, a, (H,), "(H,): one scalar per head")
    expect_ndim(fn, "B_t", B_t, 3, "(B, Hg, N)")
    expect_shape(fn, "B_t", B_t, (batch, None, None), "(B, Hg, N)")
    expect_shape(fn, "C_t", C_t, B_t.shape, "the shape of B_t")
    if H % B_t.shape[1]:
        raise ValueError(f"{fn}: H={H} heads must be a multiple of Hg={B_t.shape[1]} groups")
    if state is not None:
        expect_shape(fn, "state", state, (batch, H, B_t.shape[2], Dh),
                     "(B, H, N, Dh) of this step's rows")
    return H // B_t.shape[1]


def _heads(a, group):
    """(B, T, Hg, N) -> (B, H, T, N), head h reading group h // group; and the pair's cache."""
    return repeat_kv_forward(np.swapaxes(a, 1, 2), group)  # (B, H, T, N)


def ssd_forward(x, dt, A, B, C, D, *, form="chunked", chunk=64):
    """Mamba-2's SSD mixer (after the projections and the convolution), in the chunked SSD,
    the dual quadratic, or the recurrent (scan) form; all three equal to round-off.

    Inputs:  x (B, T, H, Dh); dt (B, T, H) step sizes (> 0, after softplus); A (H,) (< 0);
             B, C (B, T, Hg, N); D (H,) the skip.
    Returns: y (B, T, H, Dh).  Cache: x, Δ, A, D, the group size and the GLA cache.
    """
    x, dt, A, B, C, D = common_float(x, dt, A, B, C, D)
    group = _check("ssd", x, dt, A, B, C, D)
    rows = (x.shape[0], 1, x.size)  # the elementwise steps: batch rows in threads (lanes.py)

    v = np.empty(x.shape[:1] + x.shape[2:3] + x.shape[1:2] + x.shape[3:], x.dtype)  # (B,H,T,Dh)
    g = np.empty(dt.shape[:1] + dt.shape[2:] + dt.shape[1:2], dt.dtype)  # (B, H, T)

    def values(i):  # v = Δ x, g = Δ A for the rows i, written in place
        xt, dtt = np.swapaxes(x[i], 1, 2), np.swapaxes(dt[i], 1, 2)  # (B,H,T,Dh), (B,H,T)
        np.multiply(xt, dtt[..., None], out=v[i])
        np.multiply(dtt, A[:, None], out=g[i])
    for_lanes(values, *rows)
    (Ch, rep), (Bh, _) = _heads(C, group), _heads(B, group)  # (B, H, T, N) each
    yg, gla = gla_forward_parts("ssd", Ch, Bh, v, g, form, chunk)  # (B, H, T, Dh)
    y = np.empty(x.shape, np.result_type(yg, D, x))  # (B, T, H, Dh)
    for_lanes(lambda i: np.add(np.swapaxes(yg[i], 1, 2), D[:, None] * x[i], out=y[i]), *rows)
    return y, SSDCache(x, dt, A, D, rep, gla)


def ssd_backward(dy, cache):
    """Math: dD = Σ_{b,t,p} dy x, dx = D dy + the GLA backward's dv · Δ; with v = Δ x and
    g = Δ A: dΔ = Σ_p dv x + dg A, dA = Σ_{b,t} dg Δ; dB, dC = the GLA dk, dq summed over the
    heads of each group (the sharing's adjoint).
    Reference: Dao & Gu 2024, arXiv 2405.21060, section 6 (the SSD algorithm, the backward
    derived here).
    """
    expect_dout("ssd_backward", dy, cache.x.shape,
                np.result_type(cache.x, cache.D, gla_out(cache.gla)[1]), name="dy")
    x, dt, A, D, rep, gla = cache
    batch, T, H, Dh = x.shape
    rows = (batch, 1, x.size)  # the elementwise steps: batch rows in threads (lanes.py)
    do = np.empty((batch, H, T, Dh), dy.dtype)  # (B, H, T, Dh): dy in the heads' layout
    for_lanes(lambda i: np.copyto(do[i], np.swapaxes(dy[i], 1, 2)), *rows)
    dq, dk, dv, dg = gla_backward_parts(do, gla)  # (B, H, T, *)
    dv, dg = np.swapaxes(dv, 1, 2), np.swapaxes(dg, 1, 2)  # (B, T, H, Dh), (B, T, H)

    dx = np.empty(x.shape, np.result_type(D, dy, dv, dt))  # (B, T, H, Dh)
    ddt = np.empty(dt.shape, np.result_type(dv, x, dg, A))  # (B, T, H)
    dD_steps = np.empty(dt.shape, np.result_type(dy, x))  # (B, T, H): Σ_p dy x per step

    def inputs(i):  # fwd: y = swap(gla) + D x;  v = dt x;  g = dt A
        np.add(D[:, None] * dy[i], dv[i] * dt[i][..., None], out=dx[i])
        np.add((dv[i] * x[i]).sum(-1), dg[i] * A, out=ddt[i])
        np.sum(dy[i] * x[i], axis=-1, out=dD_steps[i])
    for_lanes(inputs, *rows)  # in place
    # fwd: B, C shared by the heads of a group  ->  the sum over the group
    dB, dC = (np.swapaxes(repeat_kv_backward(d, rep)["kv"], 1, 2) for d in (dk, dq))
    return {"x": dx, "dt": ddt, "A": (dg * dt).sum(axis=(0, 1)), "B": dB, "C": dC,
            "D": dD_steps.sum(axis=(0, 1))}  # dB, dC (B, T, Hg, N)


def ssd_step(x_t, dt_t, A, B_t, C_t, D, state):
    """One decoding step: h = exp(Δ A) h + B_t (Δ x_t)^T, y = h^T C_t + D x_t.

    Inputs:  x_t (B, H, Dh); dt_t (B, H); A, D (H,); B_t, C_t (B, Hg, N); state (B, H, N, Dh)
             or None (zeros). Returns (y_t (B, H, Dh), new state (B, H, N, Dh)).
    """
    group = _check_step(x_t, dt_t, A, (B_t, C_t, D), state)
    Ch, Bh = np.repeat(C_t, group, axis=1), np.repeat(B_t, group, axis=1)  # (B, H, N)
    y, state = gla_attention_step(Ch, Bh, x_t * dt_t[..., None], dt_t * A, state)
    return y + D[:, None] * x_t, state  # (B, H, Dh)


def ssd_recurrent_ref(x, dt, A, B, C, D):
    """The plain sequential scan, one sequence and head at a time, as Mamba's selective scan:
    h ← exp(Δ_t A) h + outer(B_t, Δ_t x_t), y_t = h^T C_t + D x_t. Returns (y, final state)."""
    group = _check("ssd_recurrent_ref", x, dt, A, B, C, D)
    batch, T, H, Dh = x.shape
    y = np.zeros(x.shape, x.dtype)  # (B, T, H, Dh)
    final = np.zeros((batch, H, B.shape[-1], Dh), x.dtype)  # (B, H, N, Dh)
    for b in range(batch):
        for h in range(H):
            S = np.zeros((B.shape[-1], Dh), x.dtype)  # (N, Dh)
            for t in range(T):
                S = np.exp(dt[b, t, h] * A[h]) * S + np.outer(B[b, t, h // group],
                                                             dt[b, t, h] * x[b, t, h])
                y[b, t, h] = S.T @ C[b, t, h // group] + D[h] * x[b, t, h]
            final[b, h] = S
    return y, final


@numba.njit(cache=True, nogil=True)
def _scan_kernel(x, dt, A, B, C, D, group, y, final, lo, hi):  # pragma: no cover (compiled)
    """The scan of ssd_recurrent_ref, one (batch, head) lane per task, the tasks lo .. hi − 1
    (a span per thread: lanes.run_spans)."""
    T, H, Dh = x.shape[1:]
    N = B.shape[3]
    for task in range(lo, hi):
        b, h = task // H, task % H
        g = h // group
        S = np.zeros((N, Dh), x.dtype)  # (N, Dh)
        for t in range(T):
            a = np.exp(dt[b, t, h] * A[h])
            for n in range(N):
                for p in range(Dh):
                    S[n, p] = a * S[n, p] + B[b, t, g, n] * (dt[b, t, h] * x[b, t, h, p])
            for p in range(Dh):
                acc = S[0, p] * C[b, t, g, 0]
                for n in range(1, N):
                    acc += S[n, p] * C[b, t, g, n]
                y[b, t, h, p] = acc + D[h] * x[b, t, h, p]
        for n in range(N):
            for p in range(Dh):
                final[b, h, n, p] = S[n, p]


def ssd_recurrent(x, dt, A, B, C, D):
    """The sequential scan as a Numba kernel over (batch, head) lanes: the twin of
    ssd_recurrent_ref (same inputs; returns (y (B, T, H, Dh), final state (B, H, N, Dh)))."""
    group = _check("ssd_recurrent", x, dt, A, B, C, D)
    batch, T, H, Dh = x.shape
    arrays = [np.ascontiguousarray(a) for a in (x, dt, A, B, C, D)]
    y = np.empty(x.shape, x.dtype)  # (B, T, H, Dh)
    final = np.empty((batch, H, B.shape[-1], Dh), x.dtype)  # (B, H, N, Dh)
    run_spans(lambda lo, hi: _scan_kernel(*arrays, group, y, final, lo, hi), batch * H, y.size)
    return y, final
