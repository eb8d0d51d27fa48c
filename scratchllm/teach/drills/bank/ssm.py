"""The drills of scratchllm.ssm: zero-order hold, the SSM kernel, the FFT convolution's
backward, the recurrence, the selective scan (backward and forward), an SSD chunk, Blelloch's
scan."""
import numpy as np

from scratchllm import ssm
from scratchllm.teach.drills.bank._common import (assert_close, causal_check, drill,
                                                  gradient_check, seeded_rng)


# ---------------------------------------------------------------------------- zoh
@drill("zoh", 10, "scratchllm/ssm/lti.py", '''
    def zoh(A, B, delta):
        """Zero-order-hold discretisation of a diagonal SSM h' = A h + B x.

        A, B (D, N); delta (D,) one step per channel.  Return (A_bar, B_bar), each (D, N).
        Reach: A_bar = exp(delta A);  B_bar = (exp(delta A) - 1) / A * B  (use expm1),
               with the limit delta * B where A == 0 (no 0/0).
        """
''', [
    ("equals scratchllm.ssm.zoh_forward", lambda fn: _zoh_vs_library(fn)),
    ("A = 0 gives B_bar = delta * B, finite", lambda fn: _zoh_at_zero(fn)),
    ("exact solution of x' = a x + b u with constant u", lambda fn: _zoh_ode(fn)),
])
def _zoh(A, B, delta):
    return ssm.zoh_forward(A, B, delta)[0]


def _zoh_vs_library(fn):
    r = seeded_rng(11)
    A, B, delta = -np.exp(r.standard_normal((3, 4))), r.standard_normal((3, 4)), r.random(3)
    a_bar, b_bar = fn(A, B, delta)
    want_a, want_b = _zoh(A, B, delta)
    assert_close(a_bar, want_a, what="A_bar")
    return assert_close(b_bar, want_b, what="B_bar")


def _zoh_at_zero(fn):
    B, delta = np.array([[2.0, -1.0]]), np.array([0.3])
    _, b_bar = fn(np.zeros((1, 2)), B, delta)
    return assert_close(b_bar, 0.3 * B, what="B_bar at A = 0")


def _zoh_ode(fn):
    a, b, u, dt, h0 = -0.7, 1.5, 2.0, 0.4, 0.3
    a_bar, b_bar = fn(np.array([[a]]), np.array([[b]]), np.array([dt]))
    exact = np.exp(a * dt) * h0 + (np.exp(a * dt) - 1) / a * b * u
    return assert_close(a_bar[0, 0] * h0 + b_bar[0, 0] * u, exact, what="h(dt)")


# ---------------------------------------------------------------------------- ssm kernel
@drill("ssm_kernel", 10, "scratchllm/ssm/lti.py", '''
    def ssm_kernel(A_bar, B_bar, C, L):
        """The convolution kernel of a discrete diagonal SSM.

        A_bar, B_bar, C (D, N); L int.  Return K (D, L).
        Reach: K_l = sum_n C_n A_bar_n^l B_bar_n,  l = 0 .. L-1
        """
''', [
    ("equals the direct sum of powers", lambda fn: _kernel_check(fn)),
    ("the recurrence's impulse response", lambda fn: _kernel_impulse(fn)),
])
def _ssm_kernel(A_bar, B_bar, C, L):
    return ssm.ssm_kernel_forward(A_bar, B_bar, C, L)[0]


def _kernel_inputs():
    r = seeded_rng(12)
    return r.uniform(0.5, 0.99, (3, 4)), r.standard_normal((3, 4)), r.standard_normal((3, 4))


def _kernel_check(fn):
    A_bar, B_bar, C = _kernel_inputs()
    want = np.stack([[np.sum(C[d] * A_bar[d] ** l * B_bar[d]) for l in range(9)]
                     for d in range(3)])
    return assert_close(fn(A_bar, B_bar, C, 9), want, what="K")


def _kernel_impulse(fn):
    A_bar, B_bar, C = _kernel_inputs()
    x = np.zeros((1, 7, 3))  # (B, T, D): a unit impulse at t = 0 on every channel
    x[:, 0] = 1.0
    y = ssm.ssm_recurrence(x, A_bar, B_bar, C, np.zeros(3))  # (1, 7, 3)
    return assert_close(fn(A_bar, B_bar, C, 7), y[0].T, what="K vs impulse response")


# ---------------------------------------------------------------------------- fft conv
@drill("fft_conv_backward", 15, "scratchllm/ssm/lti.py", '''
    def fft_conv_backward(dy, x, K):
        """Backward of the causal convolution y_t = sum_{s<=t} K_s x_{t-s} (per channel, last
        axis), computed by FFT of length n >= 2T - 1.

        dy, x (B, D, T); K (D, T).  Return (dx (B, D, T), dK (D, T)).
        Reach: correlations:  dx_s = sum_{t>=s} dy_t K_{t-s},  dK_s = sum_b sum_{t>=s} dy_t x_{t-s};
               by FFT: irfft(conj(rfft(K, n)) * rfft(dy, n), n)[:T]  (likewise conj(rfft(x)))
        """
''', [
    ("gradient check (T = 7)", lambda fn: gradient_check(
        ssm.fft_conv_forward, lambda d, kw: fn(d, **kw), ["x", "K"], **_conv_inputs(7))),
    ("equals the direct correlation sums (T = 13)", lambda fn: _conv_direct(fn)),
])
def _fft_conv_backward(dy, x, K):
    g = ssm.fft_conv_backward(dy, ssm.fft_conv_forward(x, K)[1])
    return g["x"], g["K"]


def _conv_inputs(T):
    r = seeded_rng(13)
    return dict(x=r.standard_normal((2, 3, T)), K=r.standard_normal((3, T)))


def _conv_direct(fn):
    inp, T = _conv_inputs(13), 13
    x, K = inp["x"], inp["K"]
    dy = seeded_rng(14).standard_normal(x.shape)
    dx = np.array([[[sum(dy[b, d, t] * K[d, t - s] for t in range(s, T)) for s in range(T)]
                    for d in range(3)] for b in range(2)])
    dK = np.array([[sum(dy[b, d, t] * x[b, d, t - s] for b in range(2) for t in range(s, T))
                    for s in range(T)] for d in range(3)])
    got_dx, got_dK = fn(dy, x, K)
    assert_close(got_dK, dK, what="dK")
    return assert_close(got_dx, dx, what="dx")


# ---------------------------------------------------------------------------- selective scan
SCAN_INPUTS = ("x", "delta", "A", "B", "C", "D")


def _scan_inputs():
    r, Bt, T, d, N = seeded_rng(15), 2, 6, 3, 4
    return dict(x=r.standard_normal((Bt, T, d)), delta=r.uniform(0.1, 0.8, (Bt, T, d)),
                A=-r.uniform(0.5, 2.0, (d, N)), B=r.standard_normal((Bt, T, N)),
                C=r.standard_normal((Bt, T, N)), D=r.standard_normal(d))


@drill("selective_scan_backward", 20, "scratchllm/ssm/scan.py", '''
    def selective_scan_backward(dy, x, delta, A, B, C, D):
        """Backward of Mamba's selective scan (S6), per batch b, channel c, state n:
            A_bar_t = exp(delta_t A);  h_t = A_bar_t h_{t-1} + delta_t B_t x_t  (h_{-1} = 0);
            y_t = <C_t, h_t> + D x_t

        dy, x, delta (B, T, d); A (d, N); B, C (B, T, N); D (d,).
        Return (dx, ddelta, dA, dB, dC, dD) with the inputs' shapes.
        Reach: the reverse-time adjoint scan, lam_t = dL/dh_t:
            lam_t = C_t dy_t + A_bar_{t+1} lam_{t+1}
            ddelta_t = sum_n lam_t (h_{t-1} A_bar_t A + B_t x_t);  dA = sum_{b,t} lam_t h_{t-1} A_bar_t delta_t
            dB_t = sum_c lam_t delta_t x_t;  dC_t = sum_c dy_t h_t
            dx_t = D dy_t + sum_n lam_t delta_t B_t;  dD = sum_{b,t} dy_t x_t
        """
''', [
    ("gradient check of every input", lambda fn: gradient_check(
        ssm.selective_scan_forward_ref, lambda d, kw: fn(d, **kw), list(SCAN_INPUTS), **_scan_inputs())),
    ("equals the Numba backward of scratchllm.ssm.scan", lambda fn: _scan_vs_library(fn)),
])
def _selective_scan_backward(dy, x, delta, A, B, C, D):
    g = ssm.selective_scan_backward(dy, ssm.selective_scan_forward(x, delta, A, B, C, D)[1])
    return tuple(g[name] for name in SCAN_INPUTS)


def _scan_vs_library(fn):
    inp = _scan_inputs()
    dy = seeded_rng(16).standard_normal(inp["x"].shape)
    got = fn(dy, **inp)
    want = _selective_scan_backward(dy, **inp)
    return "; ".join(assert_close(g, w, what=f"d{name}")
                     for g, w, name in zip(got, want, SCAN_INPUTS))


# ---------------------------------------------------------------------------- ssm recurrence
def _lti_inputs():
    A_bar, B_bar, C = _kernel_inputs()
    return dict(x=seeded_rng(18).standard_normal((2, 11, 3)), A_bar=A_bar, B_bar=B_bar, C=C,
                D=seeded_rng(19).standard_normal(3))


@drill("ssm_recurrent", 10, "scratchllm/ssm/lti.py (ssm_recurrence)", '''
    def ssm_recurrent(x, A_bar, B_bar, C, D):
        """A discrete diagonal SSM run as a loop over time, per channel d and state n:
            h_t = A_bar h_{t-1} + B_bar x_t  (h_{-1} = 0);   y_t = <C, h_t> + D x_t

        x (B, T, D); A_bar, B_bar, C (D, N); D (D,).  Return y (B, T, D).
        """
''', [
    ("equals kernel * x by FFT + D x (scratchllm ssm_kernel_forward, fft_conv_forward)",
     lambda fn: _recurrent_vs_conv(fn)),
    ("causal: a future input changes no earlier output",
     lambda fn: causal_check(fn, _lti_inputs(), 6)),
])
def _ssm_recurrent(x, A_bar, B_bar, C, D):
    return ssm.ssm_recurrence(x, A_bar, B_bar, C, D)


def _recurrent_vs_conv(fn):
    inp = _lti_inputs()
    K = ssm.ssm_kernel_forward(inp["A_bar"], inp["B_bar"], inp["C"], 11)[0]  # (D, T)
    conv = ssm.fft_conv_forward(inp["x"].transpose(0, 2, 1), K)[0].transpose(0, 2, 1)
    return assert_close(fn(**inp), conv + inp["D"] * inp["x"], what="y")




# ---------------------------------------------------------------------------- scan forward
@drill("selective_scan_forward", 15, "scratchllm/ssm/scan.py", '''
    def selective_scan_forward(x, delta, A, B, C, D):
        """Mamba's selective scan (S6): Δ, B, C change with the token. Per batch b, channel c,
        state n:  A_bar_t = exp(delta_t A);  h_t = A_bar_t h_{t-1} + delta_t B_t x_t
        (h_{-1} = 0, Euler for B);  y_t = <C_t, h_t> + D x_t

        x, delta (B, T, d); A (d, N); B, C (B, T, N); D (d,).  Return y (B, T, d).
        """
''', [
    ("equals the Numba scratchllm.ssm.selective_scan_forward", lambda fn: _scan_fwd_vs_library(fn)),
    ("constant delta, B, C: the LTI recurrence with A_bar = exp(delta A), B_bar = delta B",
     lambda fn: _scan_fwd_lti(fn)),
])
def _selective_scan_forward(x, delta, A, B, C, D):
    return ssm.selective_scan_forward(x, delta, A, B, C, D)[0]


def _scan_fwd_vs_library(fn):
    inp = _scan_inputs()
    return assert_close(fn(**inp), _selective_scan_forward(**inp), what="y")


def _scan_fwd_lti(fn):
    inp = _scan_inputs()
    Bt, T, d = inp["x"].shape
    N = inp["A"].shape[1]
    dt = inp["delta"][0, 0]  # (d,) one step per channel, the same at every token
    b, c = inp["B"][0, 0], inp["C"][0, 0]  # (N,)
    inp.update(delta=np.broadcast_to(dt, (Bt, T, d)).copy(),
               B=np.broadcast_to(b, (Bt, T, N)).copy(), C=np.broadcast_to(c, (Bt, T, N)).copy())
    lti = ssm.ssm_recurrence(inp["x"], np.exp(dt[:, None] * inp["A"]), dt[:, None] * b,
                             np.broadcast_to(c, (d, N)), inp["D"])  # (B, T, d)
    return assert_close(fn(**inp), lti, what="y (time-invariant)")


# ---------------------------------------------------------------------------- ssd chunk
def _ssd_chunk_inputs():
    r = seeded_rng(24)
    Q, Dh, N = 6, 3, 4
    return dict(x=r.standard_normal((Q, Dh)), a=-r.uniform(0.1, 1.5, Q),
                B=r.standard_normal((Q, N)), C=r.standard_normal((Q, N)),
                S0=r.standard_normal((N, Dh)))


@drill("ssd_chunk", 25, "scratchllm/ssm/ssd.py", '''
    def ssd_chunk(x, a, B, C, S0):
        """One chunk of Mamba-2's SSD algorithm (Dao & Gu 2024) for one head.

        x (Q, Dh) the inputs (already times dt); a (Q,) log decays (dt * A, <= 0);
        B, C (Q, N); S0 (N, Dh) the state entering the chunk.  Return (y (Q, Dh), S_out (N, Dh))
        of the scan h_t = exp(a_t) h_{t-1} + outer(B_t, x_t), y_t = h_t^T C_t, h_{-1} = S0.
        Reach (no loop over t): b = cumsum(a);  L_ts = exp(b_t - b_s) for s <= t else 0;
               y = ((C B^T) * L) x + exp(b)[:, None] * (C S0);
               S_out = exp(b_Q) S0 + (B * exp(b_Q - b)[:, None])^T x
        """
''', [
    ("equals the sequential scan", lambda fn: _ssd_chunk_scan(fn)),
    ("two chained chunks equal scratchllm.ssm.ssd_forward", lambda fn: _ssd_chunk_chain(fn)),
])
def _ssd_chunk(x, a, B, C, S0):
    b = np.cumsum(a)  # (Q,)
    L = np.exp(np.where(np.tri(len(a), dtype=bool), b[:, None] - b[None, :], -np.inf))  # (Q, Q)
    y = ((C @ B.T) * L) @ x + np.exp(b)[:, None] * (C @ S0)  # (Q, Dh)
    return y, np.exp(b[-1]) * S0 + (B * np.exp(b[-1] - b)[:, None]).T @ x


def _ssd_chunk_scan(fn):
    p = _ssd_chunk_inputs()
    h, ys = p["S0"], []
    for t in range(len(p["a"])):
        h = np.exp(p["a"][t]) * h + np.outer(p["B"][t], p["x"][t])
        ys.append(h.T @ p["C"][t])
    y, S = fn(**p)
    return assert_close(y, np.stack(ys), what="y") + "; " + assert_close(S, h, what="S_out")


def _ssd_chunk_chain(fn):
    p = _ssd_chunk_inputs()
    Q, (N, Dh) = 3, p["S0"].shape
    y1, S1 = fn(p["x"][:Q], p["a"][:Q], p["B"][:Q], p["C"][:Q], np.zeros((N, Dh)))
    y2, _ = fn(p["x"][Q:], p["a"][Q:], p["B"][Q:], p["C"][Q:], S1)
    dt = -p["a"]  # with A = -1, dt A = a; ssd's input times dt is the drill's x
    want = ssm.ssd_forward((p["x"] / dt[:, None])[None, :, None], dt[None, :, None],
                           np.array([-1.0]), p["B"][None, :, None], p["C"][None, :, None],
                           np.zeros(1), chunk=4)[0][0, :, 0]
    return assert_close(np.concatenate([y1, y2]), want, what="y")


# ---------------------------------------------------------------------------- parallel scan
@drill("blelloch", 20, "scratchllm/ssm/assoc_scan.py", '''
    def blelloch(a, b):
        """h_t = a_t h_{t-1} + b_t (h_{-1} = 0) along axis 1 in O(log T) vectorised rounds.

        a, b (B, T, ...).  Return h (B, T, ...), equal to the sequential loop.
        Reach: the pairs (a, b) compose as (a1, b1) . (a2, b2) = (a1 a2, a2 b1 + b2) (earlier
        on the left: associative, not commutative). Pad T to a power of two with (1, 0), do
        Blelloch's up-sweep and down-sweep (an exclusive scan), then h_t = a_t X_t.b + b_t.
        """
''', [
    ("equals the sequential loop at T = 13 (not a power of two)", lambda fn: _blelloch_loop(fn)),
    ("T = 1 and the constant-a geometric series", lambda fn: _blelloch_geometric(fn)),
])
def _blelloch(a, b):
    return ssm.blelloch(a, b)


def _blelloch_loop(fn):
    r = seeded_rng(26)
    a, b = r.uniform(-1, 1, (2, 13, 3)), r.standard_normal((2, 13, 3))
    return assert_close(fn(a, b), ssm.associative_scan_forward_ref(a, b)[0], what="h")


def _blelloch_geometric(fn):
    assert_close(fn(np.full((1, 1, 1), 0.5), np.full((1, 1, 1), 3.0)), np.full((1, 1, 1), 3.0),
                 what="h at T = 1")
    t = np.arange(8)
    want = (1 - 0.5 ** (t + 1)) / (1 - 0.5)  # h_t = sum_{s <= t} 0.5^s
    return assert_close(fn(np.full((1, 8), 0.5), np.ones((1, 8))), want[None], what="h")
