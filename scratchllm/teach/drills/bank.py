"""The drills: for each, the template a learner fills in, the checks it must pass, and the
library's own implementation in the drill's signature (the solution the tests substitute).

A drill's function takes plain inputs (not a library cache), so a learner can write it from
the docstring alone. Checks differentiate the library's forward by finite differences
(grads.check) and compare with the library's own backward or an independent formula.
"""
import textwrap
import tracemalloc

import numpy as np

import grads
from scratchllm import attention, linear_attention, moe, ssm
from scratchllm.attention import rope
from scratchllm.core import ops
from scratchllm.teach.drills.core import Drill
from scratchllm.tokenizer import train as bpe_train

DRILLS = {}


def drill(name, minutes, source, template, checks):
    """Register a drill; the decorated function is its solution."""
    def register(solution):
        body = textwrap.dedent(template).strip("\n") + "\n    raise NotImplementedError\n"
        DRILLS[name] = Drill(name, minutes, source, "import numpy as np\n\n\n" + body,
                             tuple(checks), solution)
        return solution
    return register


def _rng(seed=0):
    return np.random.default_rng(seed)


def gradient_check(forward, grads_of, names, **inputs):
    """grads.check of the library forward against the user's backward; raises unless ok.

    grads_of(dout, inputs) -> tuple of gradients in the order of `names`."""
    def forward_keeping_inputs(**kw):
        return forward(**kw)[0], kw

    def backward(dout, kw):
        return dict(zip(names, _as_tuple(grads_of(dout, kw))))

    report = grads.check(forward_keeping_inputs, backward, rng=_rng(1), wrt=names, **inputs)
    if not report.ok:
        raise AssertionError("\n" + str(report))
    return f"max rel err {max(r.max_rel_err for r in report.rows):.1e}"


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def assert_close(got, want, tol=1e-10, what="result"):
    """Raise AssertionError unless got matches want (shapes and values, relative tol)."""
    got = np.asarray(got)
    if got.shape != np.shape(want):
        raise AssertionError(f"{what} has shape {got.shape}, expected {np.shape(want)}")
    err = grads.relative_error(got, want)
    if not err < tol:
        raise AssertionError(f"{what} differs from the reference: rel err {err:.2e}")
    return f"rel err {err:.1e}"


# ---------------------------------------------------------------------------- rmsnorm
def _rmsnorm_inputs():
    r = _rng(2)
    return dict(x=r.standard_normal((3, 7)), g=r.standard_normal(7), eps=1e-5)


@drill("rmsnorm_backward", 5, "scratchllm/core/ops.py", '''
    def rmsnorm_backward(dy, x, g, eps=1e-5):
        """Backward of y = x * r * g with r = (mean(x^2) + eps)^-1/2 over the last axis.

        dy, x (N, D); g (D,).  Return (dx (N, D), dg (D,)).
        Reach: xhat = x r;  dg = sum_rows(dy * xhat);
               dx = r * (dy g - xhat * mean(dy g * xhat))
        """
''', [
    ("gradient check (float64, < 1e-7)", lambda fn: gradient_check(
        ops.rmsnorm_forward, lambda d, kw: fn(d, **kw), ["x", "g"], **_rmsnorm_inputs())),
    ("equals scratchllm.core.ops.rmsnorm_backward", lambda fn: _rmsnorm_vs_library(fn)),
])
def rmsnorm_backward(dy, x, g, eps=1e-5):
    grads_ = ops.rmsnorm_backward(dy, ops.rmsnorm_forward(x, g, eps)[1])
    return grads_["x"], grads_["g"]


def _rmsnorm_vs_library(fn):
    inp = _rmsnorm_inputs()
    dy = _rng(3).standard_normal(inp["x"].shape)
    dx, dg = fn(dy, **inp)
    want = ops.rmsnorm_backward(dy, ops.rmsnorm_forward(**inp)[1])
    assert_close(dg, want["g"], what="dg")
    return assert_close(dx, want["x"], what="dx")


# ---------------------------------------------------------------------------- sdpa
def _sdpa_inputs(masked_row=False):
    r = _rng(4)
    mask = attention.causal_mask(5)
    if masked_row:
        mask = mask.copy()
        mask[2] = False
    return dict(q=r.standard_normal((2, 3, 5, 4)), k=r.standard_normal((2, 3, 5, 4)),
                v=r.standard_normal((2, 3, 5, 4)), mask=mask, scale=0.5)


@drill("sdpa_backward", 15, "scratchllm/attention/sdpa.py", '''
    def sdpa_backward(dout, q, k, v, mask, scale):
        """Backward of out = softmax(q k^T * scale, masked) v.

        q, k, v, dout (B, H, T, Dh); mask (T, T) bool, True = may attend (a fully masked row
        outputs zeros).  Return (dq, dk, dv), each (B, H, T, Dh).
        Reach: P = softmax(S);  dv = P^T dout;  dP = dout v^T;
               dS = P * (dP - rowsum(dP * P));  dq = scale dS k;  dk = scale dS^T q
        """
''', [
    ("gradient check, causal mask", lambda fn: gradient_check(
        attention.sdpa_forward, lambda d, kw: fn(d, **kw), ["q", "k", "v"], **_sdpa_inputs())),
    ("fully masked row: finite, zero gradient for its query", lambda fn: _sdpa_masked_row(fn)),
])
def sdpa_backward(dout, q, k, v, mask, scale):
    g = attention.sdpa_backward(dout, attention.sdpa_forward(q, k, v, mask, scale)[1])
    return g["q"], g["k"], g["v"]


def _sdpa_masked_row(fn):
    inp = _sdpa_inputs(masked_row=True)
    dq, dk, dv = fn(_rng(5).standard_normal(inp["q"].shape), **inp)
    if not all(np.isfinite(a).all() for a in (dq, dk, dv)):
        raise AssertionError("gradients contain NaN or inf")
    if np.abs(dq[:, :, 2]).max() != 0:
        raise AssertionError("dq of the fully masked query row must be exactly 0")
    return gradient_check(attention.sdpa_forward, lambda d, kw: fn(d, **kw), ["q", "k", "v"],
                          **inp)


# ---------------------------------------------------------------------------- rope
def _rope_inputs():
    inv_freq, _ = rope.rope_frequencies(6)
    return dict(x=_rng(6).standard_normal((2, 5, 6)), positions=np.array([0, 1, 2, 7, 9]),
                inv_freq=inv_freq)


@drill("rope_backward", 10, "scratchllm/attention/rope.py", '''
    def rope_backward(dy, positions, inv_freq):
        """Backward of RoPE, "half" pairing (HF rotate_half): pairs (i, i + Dh/2) of x rotated
        by theta_{t,i} = positions[t] * inv_freq[i].

        dy (..., T, Dh); positions (T,) ints; inv_freq (Dh/2,).  Return dx (..., T, Dh).
        Reach: the rotation is orthogonal, so dx = R(-theta) dy:
               dx = dy * cos - rotate_half(dy * sin),  rotate_half(u) = cat(-u2, u1)
        """
''', [
    ("gradient check", lambda fn: gradient_check(
        rope.rope_forward, lambda d, kw: fn(d, kw["positions"], kw["inv_freq"]), ["x"],
        **_rope_inputs())),
    ("norm preserved: |dx| == |dy| per position", lambda fn: _rope_norm(fn)),
])
def rope_backward(dy, positions, inv_freq):
    cache = rope.rope_forward(np.zeros_like(dy), positions, inv_freq)[1]
    return rope.rope_backward(dy, cache)["x"]


def _rope_norm(fn):
    inp = _rope_inputs()
    dy = _rng(7).standard_normal(inp["x"].shape)
    dx = fn(dy, inp["positions"], inp["inv_freq"])
    return assert_close(np.linalg.norm(dx, axis=-1), np.linalg.norm(dy, axis=-1), what="|dx|")


# ---------------------------------------------------------------------------- gqa
def _gqa_inputs(n_heads=6, n_kv_heads=2):
    r, D, Dh = _rng(8), 10, 4
    return dict(x=r.standard_normal((2, 5, D)), wq=r.standard_normal((D, n_heads * Dh)),
                wk=r.standard_normal((D, n_kv_heads * Dh)),
                wv=r.standard_normal((D, n_kv_heads * Dh)),
                wo=r.standard_normal((n_heads * Dh, D)), n_heads=n_heads, n_kv_heads=n_kv_heads)


@drill("gqa_forward", 20, "scratchllm/attention/gqa.py", '''
    def gqa_forward(x, wq, wk, wv, wo, n_heads, n_kv_heads):
        """Causal grouped-query self-attention, no RoPE, scale Dh^-1/2.

        x (B, T, D); wq (D, H*Dh); wk, wv (D, Hkv*Dh); wo (H*Dh, D).  Return y (B, T, D).
        Reach: q = x wq split into H heads (B, H, T, Dh), k, v into Hkv heads;
               query head h reads KV head h // (H / Hkv);
               o_h = softmax(q_h k^T / sqrt(Dh) + causal mask) v;  y = concat_h(o_h) wo
        """
''', [
    ("equals scratchllm.attention.gqa_forward (H=6, Hkv=2)", lambda fn: _gqa_vs_library(fn, 2)),
    ("MQA (Hkv=1) and MHA (Hkv=H) too", lambda fn: _gqa_vs_library(fn, 1)
     + "; " + _gqa_vs_library(fn, 6)),
    ("causal: a future token changes no earlier output", lambda fn: _gqa_causal(fn)),
])
def gqa_forward(x, wq, wk, wv, wo, n_heads, n_kv_heads):
    return attention.gqa_forward(x, wq, wk, wv, wo, n_heads=n_heads, n_kv_heads=n_kv_heads)[0]


def _gqa_vs_library(fn, n_kv_heads):
    inp = _gqa_inputs(n_kv_heads=n_kv_heads)
    return assert_close(fn(**inp), gqa_forward(**inp), what=f"y (Hkv={n_kv_heads})")


def _gqa_causal(fn):
    return causal_check(fn, _gqa_inputs(), 3)


def causal_check(fn, inp, t):
    """fn(**inp) -> (B, T, ...): changing x at time t changes outputs t.. and none before."""
    y = fn(**inp)
    inp = dict(inp, x=inp["x"].copy())
    inp["x"][:, t] += 1.0
    y2 = fn(**inp)
    assert_close(y2[:, :t], y[:, :t], tol=1e-12, what=f"outputs before the changed x_{t}")
    if np.allclose(y2[:, t:], y[:, t:]):
        raise AssertionError(f"changing x_{t} did not change the outputs from {t} on")
    return "ok"


# ---------------------------------------------------------------------------- balance loss
def _routing(N=12, E=5, K=2):
    r = _rng(9)
    logits = r.standard_normal((N, E))
    topk_idx = np.argsort(-logits, axis=1)[:, :K]
    return logits, topk_idx


def _balance_of_logits(logits, topk_idx):
    probs, sm = ops.softmax_forward(logits)
    loss, bl = moe.balance_loss_forward(probs, topk_idx)
    return loss, (sm, bl)


@drill("balance_loss_backward", 15, "scratchllm/moe/losses.py", '''
    def balance_loss_backward(dloss, logits, topk_idx):
        """Backward of the Switch balance loss L = E * sum_i f_i P_i through the router softmax.

        logits (N, E); topk_idx (N, K) ints: the experts each token was sent to.
        p = softmax(logits);  P_i = mean_n p_ni;  f_i = (slots of expert i) / (N K), a constant.
        Return dlogits (N, E) = dloss * dL/ds.
        Reach: dL/ds_nj = (E / N) p_nj (f_j - sum_i f_i p_ni)
        """
''', [
    ("gradient check", lambda fn: gradient_check(
        _balance_of_logits, lambda d, kw: fn(d, **kw), ["logits"],
        logits=_routing()[0], topk_idx=_routing()[1])),
    ("each row sums to zero (softmax shift invariance)", lambda fn: _balance_rows(fn)),
])
def balance_loss_backward(dloss, logits, topk_idx):
    _, (sm, bl) = _balance_of_logits(logits, topk_idx)
    dprobs = moe.balance_loss_backward(dloss, bl)["probs"]
    return ops.softmax_backward(dprobs, sm)["x"]


def _balance_rows(fn):
    logits, topk_idx = _routing()
    d = fn(np.array(1.3), logits, topk_idx)
    worst = np.abs(d.sum(axis=1)).max() / max(np.abs(d).max(), 1e-300)
    if not worst < 1e-12:
        raise AssertionError(f"a row of dlogits sums to {worst:.1e} x its largest entry, not 0")
    return f"max |row sum| / max |d| = {worst:.0e}"


# ---------------------------------------------------------------------------- router
@drill("topk_router_forward", 10, "scratchllm/moe/router.py", '''
    def topk_router_forward(x, w_router, k):
        """Mixtral's top-k router: logits s = x @ w_router (N, E); p = softmax(s); choose the
        k largest p per token (descending); gates = the chosen p renormalised to sum to 1.

        x (N, D); w_router (D, E).  Return (gates (N, k) float, topk_idx (N, k) int).
        Reach: gates = softmax over the chosen logits only.
        """
''', [
    ("equals scratchllm.moe.router_forward", lambda fn: _router_vs_library(fn, 2)),
    ("k = E: the gates are the full softmax", lambda fn: _router_vs_library(fn, 5)),
])
def topk_router_forward(x, w_router, k):
    (gates, topk_idx, _, _), _ = moe.router_forward(x, w_router, k=k)
    return gates, topk_idx


def _router_vs_library(fn, k):
    r = _rng(10)
    x, w = r.standard_normal((9, 6)), r.standard_normal((6, 5))
    gates, idx = fn(x, w, k)
    want_g, want_i = topk_router_forward(x, w, k)
    if not np.array_equal(np.asarray(idx), want_i):
        raise AssertionError(f"topk_idx differs: got {np.asarray(idx)[0]}, want {want_i[0]} "
                             "(row 0; descending order of probability)")
    return assert_close(gates, want_g, what="gates")


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
def zoh(A, B, delta):
    return ssm.zoh_forward(A, B, delta)[0]


def _zoh_vs_library(fn):
    r = _rng(11)
    A, B, delta = -np.exp(r.standard_normal((3, 4))), r.standard_normal((3, 4)), r.random(3)
    a_bar, b_bar = fn(A, B, delta)
    want_a, want_b = zoh(A, B, delta)
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
def ssm_kernel(A_bar, B_bar, C, L):
    return ssm.ssm_kernel_forward(A_bar, B_bar, C, L)[0]


def _kernel_inputs():
    r = _rng(12)
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
def fft_conv_backward(dy, x, K):
    g = ssm.fft_conv_backward(dy, ssm.fft_conv_forward(x, K)[1])
    return g["x"], g["K"]


def _conv_inputs(T):
    r = _rng(13)
    return dict(x=r.standard_normal((2, 3, T)), K=r.standard_normal((3, T)))


def _conv_direct(fn):
    inp, T = _conv_inputs(13), 13
    x, K = inp["x"], inp["K"]
    dy = _rng(14).standard_normal(x.shape)
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
    r, Bt, T, d, N = _rng(15), 2, 6, 3, 4
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
def selective_scan_backward(dy, x, delta, A, B, C, D):
    g = ssm.selective_scan_backward(dy, ssm.selective_scan_forward(x, delta, A, B, C, D)[1])
    return tuple(g[name] for name in SCAN_INPUTS)


def _scan_vs_library(fn):
    inp = _scan_inputs()
    dy = _rng(16).standard_normal(inp["x"].shape)
    got = fn(dy, **inp)
    want = selective_scan_backward(dy, **inp)
    return "; ".join(assert_close(g, w, what=f"d{name}")
                     for g, w, name in zip(got, want, SCAN_INPUTS))


# ---------------------------------------------------------------------------- bpe merge step
@drill("bpe_merge_step", 25, "scratchllm/tokenizer/train.py", '''
    def bpe_merge_step(word_counts):
        """One step of byte-level BPE training.

        word_counts: {tuple of bytes tokens: count}, e.g. {(b"l", b"o", b"w"): 5, ...}: each
        unique pre-token split into its current tokens, with its count in the corpus.
        Return (best, new_word_counts): best = the most frequent adjacent pair (a, b) counted
        inside words and weighted by their counts, ties to the lexicographically greatest
        (a, b) of bytes; new_word_counts = every word with each occurrence of best, left to
        right, replaced by the single token a + b.  If no word has two tokens: (None, word_counts).
        """
''', [
    ("Sennrich's low/lower/newest/widest, with a tie", lambda fn: _bpe_sennrich(fn)),
    ("overlapping pair merges left to right", lambda fn: _bpe_overlap(fn)),
    ("40 merges on a text equal scratchllm's train_bpe_ref", lambda fn: _bpe_vs_library(fn)),
])
def bpe_merge_step(word_counts):
    return bpe_train.merge_step(word_counts)


def _split(word):
    return tuple(bytes([c]) for c in word.encode())


def _bpe_sennrich(fn):
    words = {_split("low"): 5, _split("lower"): 2, _split("newest"): 6, _split("widest"): 3}
    best, new = fn(words)  # (e, s) and (s, t) both occur 9 times: (s, t) is greater
    if best != (b"s", b"t"):
        raise AssertionError(f"best pair {best!r}, expected (b's', b't') (9 occurrences, the "
                             "greater of the tied (b'e', b's') and (b's', b't'))")
    want = {_split("low"): 5, _split("lower"): 2,
            (b"n", b"e", b"w", b"e", b"st"): 6, (b"w", b"i", b"d", b"e", b"st"): 3}
    if new != want:
        raise AssertionError(f"merged words {new!r}, expected {want!r}")
    return "ok"


def _bpe_overlap(fn):
    best, new = fn({_split("aaa"): 1, _split("aaaa"): 2})
    want = {(b"aa", b"a"): 1, (b"aa", b"aa"): 2}
    if best != (b"a", b"a") or new != want:
        raise AssertionError(f"got {best!r}, {new!r}; expected (b'a', b'a'), {want!r}")
    return "ok"


def _bpe_vs_library(fn):
    text = ("the cat sat on the mat; the rat sat on the cat's hat. " * 3
            + "a tokenizer merges frequent pairs, then the merged tokens merge again.")
    counts = bpe_train.count_chunk_ref(text, (), "gpt2")
    words = {tuple(bytes([b]) for b in w): c for w, c in counts.items()}
    merges = []
    for _ in range(40):
        best, words = fn(words)
        merges.append(best)
    _, want = bpe_train.train_bpe_ref([text], vocab_size=256 + 40)
    if merges != want:
        first = next(i for i, (a, b) in enumerate(zip(merges, want)) if a != b)
        raise AssertionError(f"merge {first} is {merges[first]!r}, expected {want[first]!r}")
    return "40 merges equal"


# ---------------------------------------------------------------------------- moe layer
def _moe_inputs(E=4, D=6, F=5):
    r = _rng(17)
    return dict(x=r.standard_normal((9, D)), w_router=r.standard_normal((D, E)),
                w1=r.standard_normal((E, D, F)), w3=r.standard_normal((E, D, F)),
                w2=r.standard_normal((E, F, D)))


@drill("moe_forward", 20, "scratchllm/moe/layer.py (the chapter's MoELayer.forward)", '''
    def moe_forward(x, w_router, w1, w3, w2, k):
        """A top-k Mixture-of-Experts layer of SwiGLU experts (Mixtral), no capacity limit.

        x (N, D); w_router (D, E); w1, w3 (E, D, F); w2 (E, F, D).  Return y (N, D).
        Reach: p = softmax(x w_router); per token the k largest p, gates g renormalised
               over them;  expert_i(x) = (silu(x w1[i]) * (x w3[i])) w2[i];
               y_n = sum over the chosen i of g_ni expert_i(x_n)
        """
''', [
    ("equals scratchllm.moe.moe_forward (E=4, k=2)", lambda fn: _moe_vs_library(fn)),
    ("k = E: the softmax-weighted mixture of every expert", lambda fn: _moe_dense(fn)),
    ("k = 1: the argmax expert, gate 1", lambda fn: _moe_top1(fn)),
])
def moe_forward(x, w_router, w1, w3, w2, k):
    return moe.moe_forward(x, w_router, w1, w3, w2, k=k)[0].y


def _expert_outputs(x, w1, w3, w2):
    """(E, N, D): every expert on every token, by the library's swiglu pair."""
    return np.stack([ops.swiglu_forward(x, w1[i], w3[i], w2[i])[0] for i in range(len(w1))])


def _moe_vs_library(fn):
    inp = _moe_inputs()
    return assert_close(fn(k=2, **inp), moe_forward(k=2, **inp), what="y")


def _moe_dense(fn):
    inp = _moe_inputs()
    p = ops.softmax_forward(inp["x"] @ inp["w_router"])[0]  # (N, E)
    ys = _expert_outputs(inp["x"], inp["w1"], inp["w3"], inp["w2"])  # (E, N, D)
    return assert_close(fn(k=4, **inp), np.einsum("ne,end->nd", p, ys), what="y (k = E)")


def _moe_top1(fn):
    inp = _moe_inputs()
    best = np.argmax(inp["x"] @ inp["w_router"], axis=1)  # (N,)
    ys = _expert_outputs(inp["x"], inp["w1"], inp["w3"], inp["w2"])  # (E, N, D)
    return assert_close(fn(k=1, **inp), ys[best, np.arange(len(best))], what="y (k = 1)")


# ---------------------------------------------------------------------------- ssm recurrence
def _lti_inputs():
    A_bar, B_bar, C = _kernel_inputs()
    return dict(x=_rng(18).standard_normal((2, 11, 3)), A_bar=A_bar, B_bar=B_bar, C=C,
                D=_rng(19).standard_normal(3))


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
def ssm_recurrent(x, A_bar, B_bar, C, D):
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
def selective_scan_forward(x, delta, A, B, C, D):
    return ssm.selective_scan_forward(x, delta, A, B, C, D)[0]


def _scan_fwd_vs_library(fn):
    inp = _scan_inputs()
    return assert_close(fn(**inp), selective_scan_forward(**inp), what="y")


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


# ---------------------------------------------------------------------------- masks, alibi, flash
@drill("sliding_window_mask", 5, "scratchllm/attention/masks.py", '''
    def sliding_window_mask(T, window):
        """(T, T) bool, True = may attend: causal, and only the last `window` keys (Mistral).

        Reach: query i sees key j iff  i - window < j <= i.
        """
''', [
    ("equals scratchllm.attention.sliding_window_mask (T 7, W 1..8)",
     lambda fn: _mask_vs_library(fn)),
    ("a bool array; window >= T is the causal mask", lambda fn: _mask_properties(fn)),
])
def sliding_window_mask(T, window):
    return attention.sliding_window_mask(T, window)


def _mask_vs_library(fn):
    for W in range(1, 9):
        got = np.asarray(fn(7, W))
        if got.dtype != bool or not np.array_equal(got, attention.sliding_window_mask(7, W)):
            raise AssertionError(f"window {W}: got {got.astype(int).tolist()}")
    return "8 windows equal"


def _mask_properties(fn):
    got = fn(6, 10)
    if not isinstance(got, np.ndarray) or got.dtype != bool:
        raise AssertionError(f"expected a bool array, got {getattr(got, 'dtype', type(got))}")
    if not np.array_equal(got, np.tril(np.ones((6, 6), bool))):
        raise AssertionError("window 10 >= T 6 must give the causal mask")
    return "ok"


@drill("alibi_bias", 5, "scratchllm/attention/positions.py", '''
    def alibi_bias(n_heads, T):
        """ALiBi's (H, T, T) bias added to the attention scores (Press et al. 2021), H a power
        of two.

        Reach: slopes m_h = 2^(-8 h / H) for h = 1..H;  bias[h, i, j] = -m_h |i - j|
        """
''', [
    ("equals alibi_bias(alibi_slopes(H), T, T) for H = 8", lambda fn: assert_close(
        fn(8, 6), attention.alibi_bias(attention.alibi_slopes(8), 6, 6), what="bias (H=8)")),
    ("and for H = 4, T = 3", lambda fn: assert_close(
        fn(4, 3), attention.alibi_bias(attention.alibi_slopes(4), 3, 3), what="bias (H=4)")),
])
def alibi_bias(n_heads, T):
    return attention.alibi_bias(attention.alibi_slopes(n_heads), T, T)


def _flash_inputs(T=13):
    r = _rng(21)
    return [r.standard_normal((3, T, 4)) for _ in range(3)]


@drill("flash_attention_forward", 20, "scratchllm/attention/flash.py", '''
    def flash_attention_forward(q, k, v, block):
        """Causal attention, tiled: never build the (T, T) score matrix. Scale Dh^-1/2.

        q, k, v (H, T, Dh); block: rows and keys per tile (T need not be a multiple).
        Return (out (H, T, Dh), lse (H, T)), lse = log sum_j exp(S_ij) over the allowed keys.
        Reach: per query block, running m (row max), l (row sum), acc (H, bq, Dh); per key
               block S = q k^T scale (masked j > i to -inf), m' = max(m, rowmax S),
               l = exp(m - m') l + rowsum exp(S - m'), acc = exp(m - m') acc + exp(S - m') v,
               m = m'; at the end out = acc / l, lse = m + log l.
        """
''', [
    ("out equals causal sdpa (T 13, blocks 4 and 5)", lambda fn: _flash_vs_sdpa(fn)),
    ("lse is the row logsumexp of the masked scores", lambda fn: _flash_lse(fn)),
    ("peak memory at T = 1024 far below the T x T matrix", lambda fn: _flash_memory(fn)),
])
def flash_attention_forward(q, k, v, block):
    out, cache = attention.flash_sdpa_forward(q[None], k[None], v[None], causal=True,
                                              block_q=block, block_k=block)
    return out[0], cache.lse[0, :, :, 0]


def _flash_vs_sdpa(fn):
    q, k, v = _flash_inputs()
    want = attention.sdpa_forward(q[None], k[None], v[None], attention.causal_mask(13))[0][0]
    for block in (4, 5):
        assert_close(fn(q, k, v, block)[0], want, what=f"out (block {block})")
    return "blocks 4, 5 equal"


def _flash_lse(fn):
    q, k, v = _flash_inputs()
    s = np.where(attention.causal_mask(13), q @ k.swapaxes(-1, -2) / 2.0, -np.inf)  # Dh 4
    m = s.max(-1, keepdims=True)
    want = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]  # (H, T)
    return assert_close(fn(q, k, v, 4)[1], want, what="lse")


def _flash_memory(fn):
    q, k, v = [a.repeat(79, axis=1)[:, :1024] for a in _flash_inputs()]
    tracemalloc.start()
    try:
        fn(q, k, v, 64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    matrix = 3 * 1024 * 1024 * 8
    if not peak < matrix / 4:
        raise AssertionError(f"peak {peak / 2**20:.1f} MiB, the (H, T, T) matrix is "
                             f"{matrix / 2**20:.0f} MiB: a tile is not a row")
    return f"peak {peak / 2**20:.1f} MiB of {matrix / 2**20:.0f}"


# ---------------------------------------------------------------------------- recurrent mixers
def _la_inputs():
    r = _rng(21)
    return r.standard_normal((9, 4)), r.standard_normal((9, 4)), r.standard_normal((9, 3))


@drill("linear_attention_recurrent", 10, "scratchllm/linear_attention/linear.py", '''
    def linear_attention_recurrent(q, k, v):
        """Causal linear attention (Katharopoulos et al. 2020) as an RNN, one sequence, one head.

        q, k (T, Dk); v (T, Dv).  Return o (T, Dv).
        Reach: phi(x) = elu(x) + 1 (x + 1 for x > 0, exp(x) otherwise); S = 0 (Dk, Dv), z = 0 (Dk,);
               for each t: S += outer(phi(k_t), v_t);  z += phi(k_t);
                           o_t = phi(q_t) @ S / (phi(q_t) @ z + 1e-6)
        """
''', [
    ("equals scratchllm.linear_attention (parallel form)", lambda fn: _la_vs_library(fn)),
    ("equals the masked quadratic formula", lambda fn: _la_quadratic(fn)),
])
def linear_attention_recurrent(q, k, v):
    o, _ = linear_attention.linear_attention_forward(q[None, None], k[None, None], v[None, None],
                                                     form="recurrent")
    return o[0, 0]


def _la_vs_library(fn):
    q, k, v = _la_inputs()
    want = linear_attention.linear_attention_forward(q[None, None], k[None, None],
                                                     v[None, None], form="parallel")[0][0, 0]
    return assert_close(fn(q, k, v), want, what="o")


def _la_quadratic(fn):
    q, k, v = _la_inputs()
    fq, fk = (np.where(x > 0, x + 1, np.exp(x)) for x in (q, k))  # elu + 1
    A = np.tril(fq @ fk.T)  # (T, T)
    return assert_close(fn(q, k, v), A @ v / (A.sum(1, keepdims=True) + 1e-6), what="o")


def _delta_inputs(T=7):
    r = _rng(22)
    k = r.standard_normal((T, 4))
    return (r.standard_normal((T, 4)), k / np.linalg.norm(k, axis=1, keepdims=True),
            r.standard_normal((T, 3)), r.uniform(0.1, 0.9, T))


@drill("delta_rule_step", 15, "scratchllm/linear_attention/delta.py", '''
    def delta_rule_step(S, q, k, v, beta):
        """One step of DeltaNet's delta rule (Schlag et al. 2021; Yang et al. 2024).

        S (Dk, Dv) the key -> value memory; q, k (Dk,); v (Dv,); beta a float in (0, 1).
        Return (o (Dv,), S_new (Dk, Dv)).
        Reach: u = S^T k (what the memory holds for k);  S_new = S + beta * outer(k, v - u);
               o = S_new^T q
        """
''', [
    ("T steps equal scratchllm.linear_attention.delta_rule_forward", lambda fn: _delta_seq(fn)),
    ("a unit key written with beta = 1 reads back its value", lambda fn: _delta_recall(fn)),
])
def delta_rule_step(S, q, k, v, beta):
    o, S_new = linear_attention.delta_rule_step(q[None, None], k[None, None], v[None, None],
                                                np.array([[beta]]), None, S[None, None])
    return o[0, 0], S_new[0, 0]


def _delta_seq(fn):
    q, k, v, beta = _delta_inputs()
    S, outs = np.zeros((4, 3)), []
    for t in range(len(beta)):
        o, S = fn(S, q[t], k[t], v[t], float(beta[t]))
        outs.append(o)
    want = linear_attention.delta_rule_forward(q[None, None], k[None, None], v[None, None],
                                               beta[None, None], chunk=3)[0][0, 0]
    return assert_close(np.stack(outs), want, what="o")


def _delta_recall(fn):
    q, k, v, beta = _delta_inputs()
    S = _rng(23).standard_normal((4, 3))  # whatever the memory held before
    o, _ = fn(S, k[0], k[0], v[0], 1.0)
    return assert_close(o, v[0], what="o read back at the written key")


def _ssd_chunk_inputs():
    r = _rng(24)
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
def ssd_chunk(x, a, B, C, S0):
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
