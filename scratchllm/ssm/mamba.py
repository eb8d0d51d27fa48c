"""The Mamba block (Gu & Dao 2023, arXiv 2312.00752; state-spaces/mamba
mamba_ssm/modules/mamba_simple.py) as a forward/backward
pair built from smaller pairs, its decoding step, and the Mamba Module.

    xz = x @ W_in                         split into xi, z            (B, T, 2Di)
    u  = silu(causal_conv1d(xi) + conv_b)  depthwise, kernel K        (B, T, Di)
    dt_low, Bm, Cm = split(u @ W_x)        sizes R, N, N
    (Jamba: dt_low, Bm, Cm = rmsnorm(dt_low, dt_norm), rmsnorm(Bm, B_norm), rmsnorm(Cm, C_norm))
    Δ  = softplus(dt_low @ W_dt + b_dt)    (logaddexp: no overflow)   (B, T, Di)
    y  = selective_scan(u, Δ, A = -exp(A_log), Bm, Cm, D)             (B, T, Di)
    out = (y * silu(z)) @ W_out                                       (B, T, D)
Decoding keeps a MambaState (conv: the last K-1 values of xi, ssm: h (B, Di, N)) per sequence.
Jamba (arXiv 2403.19887; huggingface/transformers modeling_jamba.py JambaMambaMixer) adds
the three inner RMSNorms, with gains dt_norm (R,), B_norm (N,), C_norm (N,).
The sizes and options come from one MambaSpec (scratchllm.specs: d_state, d_conv, expand,
dt_rank, inner_norms, norm_eps, scan); spec.scan = "associative" runs the selective scan as
Blelloch's parallel scan (assoc_scan.py: work O(T) combines, depth O(log T)) in place of the
time loop, with the same y and gradients; the arrays of one block travel as one MambaWeights.

Glossary: B batch, T time, D model width, Di = expand·D inner width (scan channels), N state
size, R dt rank (spec.dt_rank, default ceil(D/16)), K conv kernel (4).
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import Module, Param
from scratchllm.core.ops import (InputCache, LinearCache, linear_backward, linear_forward,
                                 linear_out, rmsnorm_backward, rmsnorm_forward, silu_backward,
                                 silu_forward, softplus_backward, softplus_forward)
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_instance,
                                      expect_ndim, expect_shape)
from scratchllm.specs import MambaSpec
from scratchllm.ssm.assoc_scan import (SelectiveAssocCache, selective_scan_assoc_backward,
                                       selective_scan_assoc_forward)
from scratchllm.ssm.scan import (ScanCache, selective_scan_backward, selective_scan_forward,
                                 selective_scan_step)

INNER_NORMS = ("dt_norm", "B_norm", "C_norm")  # Jamba's, on dt_low, Bm, Cm
_SCANS = {"sequential": selective_scan_forward, "associative": selective_scan_assoc_forward}


# ---------------------------------------------------------------------------- causal conv1d
class CausalConvCache(NamedTuple):
    xp: np.ndarray  # x with K-1 leading zeros (B, T+K-1, d)
    w: np.ndarray


def causal_conv1d_forward(x, w, b):
    """Depthwise causal conv (PyTorch Conv1d(groups=d, padding=K-1), first T outputs kept):
    y[t, c] = b[c] + Σ_k w[c, k] x[t - (K-1) + k, c], with x = 0 before t = 0.

    Inputs:  x (B, T, d), w (d, K), b (d,).
    Returns: y (B, T, d).  Cache: (x padded with K-1 leading zeros, w).
    """
    x, w, b = common_float(x, w, b)
    for name, a in (("x", x), ("w", w), ("b", b)):
        expect_float("causal_conv1d", name, a)
    expect_ndim("causal_conv1d", "x", x, 3, "(B, T, d)")
    batch, T, d = x.shape
    expect_shape("causal_conv1d", "w", w, (d, None), "(d, K)")
    expect_shape("causal_conv1d", "b", b, (d,), "(d,)")
    K = w.shape[1]
    xp = np.concatenate([np.zeros((batch, K - 1, d), x.dtype), x], axis=1)  # (B, T+K-1, d)
    y = np.broadcast_to(b, x.shape).copy()  # (B, T, d)
    for k in range(K):
        y += w[:, k] * xp[:, k:k + T]
    return y, CausalConvCache(xp, w)


def causal_conv1d_backward(dy, cache):
    """Math: dw[c, k] = Σ_{b,t} dy[t, c] xp[t + k, c]; db = Σ_{b,t} dy; dxp[t + k] += w[:, k] dy[t]
    (a correlation: the conv with the time-reversed kernel), dx = dxp without the padding."""
    xp, w = cache
    K = w.shape[1]
    batch, T, d = xp.shape[0], xp.shape[1] - K + 1, xp.shape[2]
    expect_dout("causal_conv1d_backward", dy, (batch, T, d), np.result_type(xp, w), name="dy")
    dxp = np.zeros_like(xp)  # (B, T+K-1, d)
    dw = np.empty_like(w)  # (d, K)
    for k in range(K):  # fwd: y += w[:, k] * xp[:, k:k+T]
        dxp[:, k:k + T] += w[:, k] * dy
        dw[:, k] = np.sum(dy * xp[:, k:k + T], axis=(0, 1))
    return {"x": dxp[:, K - 1:], "w": dw, "b": np.sum(dy, axis=(0, 1))}


# ---------------------------------------------------------------------------- the block
class MambaWeights(NamedTuple):
    """The arrays of one Mamba block (the Mamba Module's Param names)."""
    W_in: np.ndarray  # (D, 2Di) -> xi, z
    conv_w: np.ndarray  # (Di, K)
    conv_b: np.ndarray  # (Di,)
    W_x: np.ndarray  # (Di, R + 2N) -> dt_low, B, C
    W_dt: np.ndarray  # (R, Di)
    b_dt: np.ndarray  # (Di,)
    A_log: np.ndarray  # (Di, N), A = -exp(A_log)
    D: np.ndarray  # (Di,) skip
    W_out: np.ndarray  # (Di, D)
    dt_norm: np.ndarray = None  # (R,) Jamba's inner RMSNorm gains, iff spec.inner_norms
    B_norm: np.ndarray = None  # (N,)
    C_norm: np.ndarray = None  # (N,)


class MambaState(NamedTuple):
    """Per-layer decoding state; Mamba.decode and Mamba.prefill overwrite it in place."""
    conv: np.ndarray  # (B, K-1, Di) the last K-1 values of xi
    ssm: np.ndarray  # (B, Di, N) h


class MambaCache(NamedTuple):
    proj_in: LinearCache
    conv: CausalConvCache
    act: InputCache
    proj_x: LinearCache
    proj_dt: LinearCache
    soft: InputCache
    scan: ScanCache  # or SelectiveAssocCache (spec.scan = "associative")
    gate: InputCache
    proj_out: LinearCache
    y: np.ndarray
    silu_z: np.ndarray
    A: np.ndarray
    norms: tuple  # the three inner rmsnorm caches (Jamba), None without them
    state_in: tuple  # (conv input (B, T, Di), u, delta (B, T, Di), B (B, T, N)): Mamba.prefill


def _sizes(fn, x, w, spec):
    """Check x, w and spec against each other; return (Di, R, N) and the inner-norm gains
    (None without them)."""
    expect_instance(fn, "spec", spec, MambaSpec)
    expect_instance(fn, "w", w, MambaWeights)
    expect_float(fn, "x", x, 1)
    Dm = x.shape[-1]
    Di, R, N, K = spec.expand * Dm, spec.rank(Dm), spec.d_state, spec.d_conv
    for name, shape, hint in (
            ("W_in", (Dm, 2 * Di), f"(D, 2Di), Di = spec.expand D = {Di}"),
            ("conv_w", (Di, K), f"(Di, K), K = spec.d_conv = {K}"),
            ("W_x", (Di, R + 2 * N), f"(Di, R + 2N), R = {R} (spec.rank), N = spec.d_state"),
            ("W_dt", (R, Di), f"(R, Di), R = {R} (spec.rank)"),
            ("A_log", (Di, N), f"(Di, N), N = spec.d_state = {N}"),
            ("conv_b", (Di,), "(Di,)"), ("b_dt", (Di,), "(Di,)"), ("D", (Di,), "(Di,)"),
            ("W_out", (Di, Dm), "(Di, D)")):
        expect_float(fn, name, getattr(w, name))
        expect_shape(fn, name, getattr(w, name), shape, hint)
    given = [getattr(w, n) is not None for n in INNER_NORMS]
    if given != [spec.inner_norms] * 3:
        raise ValueError(f"{fn}: dt_norm, B_norm, C_norm must be given together exactly when "
                         f"spec.inner_norms is True, got spec.inner_norms={spec.inner_norms} "
                         f"and {['array' if g else 'None' for g in given]}")
    if not spec.inner_norms:
        return (Di, R, N), None
    for name, size in zip(INNER_NORMS, (R, N, N)):
        expect_shape(fn, name, getattr(w, name), (size,),
                     "(R,) for dt_norm, (N,) for B_norm and C_norm")
    return (Di, R, N), (w.dt_norm, w.B_norm, w.C_norm)


def _split_dbc(dbc, R, N, norms, eps):
    """dt_low, Bm, Cm = split(dbc, [R, N, N]), each through its inner RMSNorm when `norms`
    (the gains dt_norm, B_norm, C_norm) is given. Returns the three and their rmsnorm caches
    (None without norms)."""
    parts = (dbc[..., :R], dbc[..., R:R + N], dbc[..., R + N:])  # (.., R), (.., N), (.., N)
    if norms is None:
        return parts, None
    normed = [rmsnorm_forward(a, g, eps) for a, g in zip(parts, norms)]
    return tuple(n[0] for n in normed), tuple(n[1] for n in normed)


def mamba_forward(x, w, *, spec):
    """The Mamba block (mamba_simple.Mamba.forward, without the fused kernels).

    Inputs:  x (B, T, D); w MambaWeights: W_in (D, 2Di); conv_w (Di, K); conv_b (Di,);
             W_x (Di, R+2N); W_dt (R, Di); b_dt (Di,); A_log (Di, N); D (Di,); W_out (Di, D);
             Jamba's inner RMSNorm gains dt_norm (R,), B_norm (N,), C_norm (N,) iff
             spec.inner_norms (epsilon spec.norm_eps); spec: MambaSpec (Di = expand D,
             N = d_state, K = d_conv, R = rank(D); scan picks the selective scan).
    Returns: out (B, T, D).  Cache: the children's caches (MambaCache); the sequential
             scan's holds only its inputs, the associative scan's also the (B, T, Di, N)
             states.
    """
    x, w = common_float(x, w)
    expect_ndim("mamba", "x", x, 3, "(B, T, D)")
    (Di, R, N), norms = _sizes("mamba", x, w, spec)
    xz, proj_in = linear_forward(x, w.W_in)  # (B, T, 2Di)
    xc, conv = causal_conv1d_forward(xz[..., :Di], w.conv_w, w.conv_b)  # (B, T, Di)
    u, act = silu_forward(xc)  # (B, T, Di)
    dbc, proj_x = linear_forward(u, w.W_x)  # (B, T, R+2N)
    (dt_low, Bm, Cm), n_caches = _split_dbc(dbc, R, N, norms, spec.norm_eps)
    dt, proj_dt = linear_forward(dt_low, w.W_dt, w.b_dt)  # (B, T, Di)
    delta, soft = softplus_forward(dt)  # (B, T, Di)
    A = -np.exp(w.A_log)  # (Di, N)
    y, scan = _SCANS[spec.scan](u, delta, A, Bm, Cm, w.D)  # (B, T, Di)
    silu_z, gate = silu_forward(xz[..., Di:])  # (B, T, Di)
    out, proj_out = linear_forward(y * silu_z, w.W_out)  # (B, T, D)
    return out, MambaCache(proj_in, conv, act, proj_x, proj_dt, soft, scan, gate, proj_out,
                           y, silu_z, A, n_caches, (xz[..., :Di], u, delta, Bm))


def mamba_backward(dout, cache):
    """The forward in reverse, through the pairs' backwards (the scan's is the adjoint scan,
    sequential or associative as the forward's was; Jamba's inner norms go through
    rmsnorm_backward).

    Returns: {"x": dx (B, T, D), "w": MambaWeights of the gradients (None for absent norms)}.
    """
    (proj_in, conv, act, proj_x, proj_dt, soft, scan, gate, proj_out, y, silu_z, A, norms,
     _) = cache
    expect_dout("mamba_backward", dout, *linear_out(proj_out))
    g_out = linear_backward(dout, proj_out)  # fwd: out = (y * silu(z)) @ W_out
    dgated = g_out["x"]  # (B, T, Di)
    dz = silu_backward(dgated * y, gate)["x"]  # fwd: silu_z = silu(z)
    scan_backward = (selective_scan_assoc_backward if isinstance(scan, SelectiveAssocCache)
                     else selective_scan_backward)
    g_scan = scan_backward(dgated * silu_z, scan)  # fwd: y = scan(u, Δ, A, B, C, D)
    ddt = softplus_backward(g_scan["delta"], soft)["x"]  # fwd: Δ = softplus(dt)
    g_dt = linear_backward(ddt, proj_dt)  # fwd: dt = dt_low @ W_dt + b_dt
    parts, norm_grads = (g_dt["x"], g_scan["B"], g_scan["C"]), {}
    if norms is not None:  # fwd: dt_low, Bm, Cm = rmsnorm(split(dbc), gains)
        g_n = [rmsnorm_backward(d, c) for d, c in zip(parts, norms)]
        parts = tuple(g["x"] for g in g_n)
        norm_grads = {name: g["g"] for name, g in zip(INNER_NORMS, g_n)}
    ddbc = np.concatenate(parts, axis=-1)  # (B, T, R+2N)
    g_x = linear_backward(ddbc, proj_x)  # fwd: dbc = u @ W_x
    dxc = silu_backward(g_x["x"] + g_scan["x"], act)["x"]  # fwd: u = silu(xc)
    g_conv = causal_conv1d_backward(dxc, conv)  # fwd: xc = conv(xi)
    g_in = linear_backward(np.concatenate([g_conv["x"], dz], axis=-1), proj_in)  # xz = x @ W_in
    dw = MambaWeights(g_in["W"], g_conv["w"], g_conv["b"], g_x["W"], g_dt["W"], g_dt["b"],
                      g_scan["A"] * A,  # fwd: A = -exp(A_log) -> dA_log = dA * A
                      g_scan["D"], g_out["W"], **norm_grads)
    return {"x": g_in["x"], "w": dw}


def mamba_step(x_t, state, w, *, spec):
    """One decoding step, equal to position t of mamba_forward (mamba_simple.Mamba.step).

    Inputs:  x_t (B, D); state MambaState: conv (B, K-1, Di) the previous K-1 values of xi
             (zeros at the start), ssm (B, Di, N) = h_{t-1}; w, spec as in mamba_forward.
    Returns: (out_t (B, D), the new MambaState); the inputs are not modified.
    """
    (Di, R, N), norms = _sizes("mamba_step", x_t, w, spec)
    expect_instance("mamba_step", "state", state, MambaState)
    batch = x_t.shape[0]
    expect_shape("mamba_step", "state.conv", state.conv, (batch, spec.d_conv - 1, Di),
                 "(B, K-1, Di): the last K-1 conv inputs of every row")
    expect_shape("mamba_step", "state.ssm", state.ssm, (batch, Di, N),
                 "(B, Di, N): the SSM state of every row")
    xz = linear_forward(x_t, w.W_in)[0]  # (B, 2Di)
    window = np.concatenate([state.conv, xz[:, None, :Di]], axis=1)  # (B, K, Di)
    u = silu_forward(causal_conv1d_forward(window, w.conv_w, w.conv_b)[0][:, -1])[0]  # (B, Di)
    (dt_low, Bm, Cm), _ = _split_dbc(linear_forward(u, w.W_x)[0], R, N, norms, spec.norm_eps)
    delta = softplus_forward(linear_forward(dt_low, w.W_dt, w.b_dt)[0])[0]  # (B, Di)
    y, h = selective_scan_step(u, delta, -np.exp(w.A_log), Bm, Cm, w.D,
                               state.ssm)  # (B, Di), (B, Di, N)
    out = linear_forward(y * silu_forward(xz[:, Di:])[0], w.W_out)[0]  # (B, D)
    return out, MambaState(window[:, 1:], h)


# ---------------------------------------------------------------------------- Module
class Mamba(Module):
    """A Mamba block of a MambaSpec: owns the block's Params (the names of MambaWeights'
    fields; mamba_simple initialisation) and calls mamba_forward/backward with its spec.

    A_log = log(1..N) per channel (S4D-real), D = 1, b_dt = softplus^-1(dt) with
    dt ~ logU[1e-3, 0.1] floored at 1e-4, W_dt ~ U(±R^-0.5), conv ~ U(±K^-0.5);
    spec.inner_norms adds Jamba's dt_norm, B_norm, C_norm gains (ones)."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        expect_instance("Mamba", "spec", spec, MambaSpec)
        Di, N, K, R = spec.expand * d_model, spec.d_state, spec.d_conv, spec.rank(d_model)
        self.spec = spec
        dt = np.maximum(np.exp(rng.uniform(np.log(1e-3), np.log(0.1), Di)), 1e-4)  # (Di,)
        init = {
            "W_in": rng.standard_normal((d_model, 2 * Di)) * d_model ** -0.5,
            "conv_w": rng.uniform(-1, 1, (Di, K)) * K ** -0.5,
            "conv_b": rng.uniform(-1, 1, Di) * K ** -0.5,
            "W_x": rng.standard_normal((Di, R + 2 * N)) * Di ** -0.5,
            "W_dt": rng.uniform(-1, 1, (R, Di)) * R ** -0.5,
            "b_dt": dt + np.log(-np.expm1(-dt)),
            "A_log": np.log(np.tile(np.arange(1, N + 1), (Di, 1))),
            "D": np.ones(Di),
            "W_out": rng.standard_normal((Di, d_model)) * Di ** -0.5,
        }
        if spec.inner_norms:
            init.update(dt_norm=np.ones(R), B_norm=np.ones(N), C_norm=np.ones(N))
        for name, value in init.items():
            setattr(self, name, Param(value.astype(dtype)))

    def weights(self):
        """The Params' arrays as one MambaWeights (None for absent inner norms)."""
        return MambaWeights(**{n: getattr(self, n).data for n in MambaWeights._fields
                               if getattr(self, n, None) is not None})

    def forward(self, x):
        return mamba_forward(x, self.weights(), spec=self.spec)

    def backward(self, dout, cache):
        g = mamba_backward(dout, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))

    def init_state(self, batch, max_len=None):
        """Zero states; their size does not grow with max_len."""
        (Di, K), N = self.conv_w.data.shape, self.A_log.data.shape[1]
        dt = self.W_in.data.dtype
        return MambaState(np.zeros((batch, K - 1, Di), dt), np.zeros((batch, Di, N), dt))

    def prefill(self, x, state):
        """The prompt x (B, T, D) in one forward; returns y (B, T, D) and sets `state` to
        what T decode calls leave: conv = the last K-1 conv inputs, ssm = h_T with
        h_T = sum_t exp(A sum_{s>t} delta_s) delta_t B_t x_t (the scan unrolled)."""
        y, cache = self.forward(x)  # (B, T, D)
        K1 = state.conv.shape[1]
        xc, u, delta, Bm = cache.state_in  # (B, T, Di) x3, (B, T, N)
        xp = np.concatenate([state.conv, xc], axis=1)  # (B, K-1+T, Di): a fresh state's zeros first
        state.conv[...] = xp[:, xp.shape[1] - K1:]
        A = cache.A  # (Di, N)
        later = delta[:, ::-1].cumsum(axis=1)[:, ::-1] - delta  # (B, T, Di): sum_{s>t} delta_s
        decay = np.exp(later[..., None] * A)  # (B, T, Di, N)
        state.ssm[...] = np.einsum("btdn,btd,btn->bdn", decay, delta * u, Bm)  # (B, Di, N)
        return y

    def decode(self, x_t, state, position=None):
        """One token (B, D) -> (B, D); updates `state` in place (position is not needed)."""
        out, new = mamba_step(x_t, state, self.weights(), spec=self.spec)
        state.conv[...] = new.conv
        state.ssm[...] = new.ssm
        return out
