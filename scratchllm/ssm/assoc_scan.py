"""The parallel (associative) scan of a linear recurrence: Blelloch's up-sweep/down-sweep
(Blelloch 1990, "Prefix sums and their applications", CMU-CS-90-190; for linear recurrences
§1.4 there, and Martin & Cundy 2018, arXiv 1709.04057), and the selective scan on top of it.

The recurrence h_t = a_t h_{t-1} + b_t (h_{-1} = 0) is a prefix "sum" under the operator on
pairs (a, b), each pair the affine map h -> a h + b:
    (a1, b1) • (a2, b2) = (a1 a2, a2 b1 + b2)      first apply (a1, b1), then (a2, b2)
It is associative (composition of affine maps) but not commutative, so every combine keeps
the earlier element on the left; the identity is (1, 0). h_t is the b of the inclusive
prefix e_0 • e_1 • ... • e_t.

Blelloch on n = 2^k elements (T padded with identities):
    up-sweep   for s = 1, 2, 4, ..., n/2:   x[i] = x[i - s] • x[i]   at i = 2s-1, 4s-1, ...
               (a balanced tree of partial products; x[n-1] is the total)
    down-sweep x[n-1] = identity;  for s = n/2, ..., 2, 1:  at the same i,
               left = x[i - s];  x[i - s] = x[i];  x[i] = x[i] • left
               (each node hands its prefix to its left child, and prefix • left-total to its
               right child: x becomes the exclusive prefix)
    inclusive  P_t = X_t • e_t   (one more combine per element)
Work and depth: the up-sweep does n - 1 combines in log2 n rounds, the down-sweep n - 1 in
log2 n rounds, the inclusive step n in one: work 3n - 2 = O(n) combines (the sequential scan
does n - 1), depth 2 log2 n + 1 = O(log n). Each round here is one vectorised NumPy step over
all its i and all lanes, so the Python loop runs 2 log2 n times, not T.

Backward (λ_t = dL/dh_t including the future, the adjoint recurrence):
    λ_t = dh_t + a_{t+1} λ_{t+1}     λ_{T-1} = dh_{T-1}
    db_t = λ_t                       da_t = λ_t h_{t-1}
The adjoint is the same kind of recurrence run backwards in time, so associative_scan_backward
*is* the forward scan on the reversed sequences (coefficients a_{t+1}, inputs dh_t).

Glossary: B batch, T time (axis 1 of every array), the trailing axes are independent lanes
(channels d, state N); n = T padded to a power of two.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import common_float, expect_dout, expect_float, expect_shape


class AssocScanCache(NamedTuple):
    a: np.ndarray  # (B, T, ...)
    h: np.ndarray  # (B, T, ...) the states (what the backward needs for da)


def _check(fn, a, b):
    expect_float(fn, "a", a, min_ndim=2)
    expect_float(fn, "b", b)
    expect_shape(fn, "b", b, a.shape, "(B, T, ...) like a")


def _combine(a1, b1, a2, b2):
    """(a1, b1) • (a2, b2) = (a1 a2, a2 b1 + b2): apply the earlier map, then the later."""
    return a1 * a2, a2 * b1 + b2


def blelloch(a, b):
    """Inclusive scan of h_t = a_t h_{t-1} + b_t along axis 1 by up-sweep/down-sweep.

    Inputs: a, b (B, T, ...). Returns h (B, T, ...). Math: the module docstring.
    """
    batch, T = a.shape[:2]
    n = 1 << max(T - 1, 0).bit_length()  # the next power of two >= T
    pad = [(0, 0), (0, n - T)] + [(0, 0)] * (a.ndim - 2)
    A = np.pad(a, pad, constant_values=1).swapaxes(0, 1).copy()  # (n, B, ...) identities past T
    Bv = np.pad(b, pad).swapaxes(0, 1).copy()  # (n, B, ...)
    s = 1
    while s < n:  # up-sweep: x[i] = x[i-s] • x[i] at i = 2s-1, 4s-1, ...
        i = np.arange(2 * s - 1, n, 2 * s)
        A[i], Bv[i] = _combine(A[i - s], Bv[i - s], A[i], Bv[i])
        s *= 2
    A[n - 1], Bv[n - 1] = 1, 0  # the exclusive prefix of the last element starts as identity
    s = n // 2
    while s >= 1:  # down-sweep: left child gets the prefix, right gets prefix • left total
        i = np.arange(2 * s - 1, n, 2 * s)
        left_a, left_b = A[i - s].copy(), Bv[i - s].copy()
        A[i - s], Bv[i - s] = A[i], Bv[i]
        A[i], Bv[i] = _combine(A[i], Bv[i], left_a, left_b)
        s //= 2
    # inclusive: P_t = X_t • e_t, and h_t = b of P_t (h_{-1} = 0 drops the a part)
    h = a.swapaxes(0, 1) * Bv[:T] + b.swapaxes(0, 1)  # (T, B, ...)
    return np.ascontiguousarray(h.swapaxes(0, 1))  # (B, T, ...)


def associative_scan_forward(a, b):
    """h_t = a_t h_{t-1} + b_t (h_{-1} = 0) by Blelloch's parallel scan along axis 1.

    Inputs:  a, b (B, T, ...) one float dtype (the trailing axes are independent lanes).
    Returns: h (B, T, ...).  Cache: (a, h) (AssocScanCache).
    Work 3n - 2 combines, depth 2 log2 n + 1 (n = T padded to a power of two): the module
    docstring.
    """
    a, b = common_float(a, b)
    _check("associative_scan_forward", a, b)
    h = blelloch(a, b)  # (B, T, ...)
    return h, AssocScanCache(a, h)


def associative_scan_forward_ref(a, b):
    """The sequential scan, one step per t: the twin of associative_scan_forward.

    Inputs:  a, b (B, T, ...).  Returns: h (B, T, ...).  Cache: (a, h).
    """
    a, b = common_float(a, b)
    _check("associative_scan_forward_ref", a, b)
    h = np.empty_like(b)  # (B, T, ...)
    prev = np.zeros_like(b[:, 0])  # (B, ...)
    for t in range(a.shape[1]):
        prev = a[:, t] * prev + b[:, t]
        h[:, t] = prev
    return h, AssocScanCache(a, h)


def associative_scan_backward(dh, cache):
    """The adjoint recurrence, computed by the same parallel scan run in reverse time.

    Math:  λ_t = dh_t + a_{t+1} λ_{t+1} (λ_{T-1} = dh_{T-1});  db_t = λ_t;  da_t = λ_t h_{t-1}.
    The reversed sequence g_s = λ_{T-1-s} obeys g_s = a'_s g_{s-1} + dh_{T-1-s} with
    a'_s = a_{T-s} (a'_0 unused: g_{-1} = 0), a forward scan: `blelloch` is called on it.
    The scan itself is Blelloch 1990 §1.4.
    Reference: Martin & Cundy 2018 (arXiv 1709.04057) §3 (the backward of a linear
    recurrence is a linear recurrence in reverse).
    Returns {a, b}.
    """
    a, h = cache
    expect_dout("associative_scan_backward", dh, h.shape, h.dtype, name="dh")
    a_rev = np.concatenate([np.zeros_like(a[:, :1]), a[:, :0:-1]], axis=1)  # (B, T, ...) a'_s
    lam = blelloch(a_rev, dh[:, ::-1])[:, ::-1]  # (B, T, ...) λ_t, back in forward time
    h_prev = np.concatenate([np.zeros_like(h[:, :1]), h[:, :-1]], axis=1)  # (B, T, ...) h_{t-1}
    # fwd: h_t = a_t h_{t-1} + b_t  ->  da_t = λ_t h_{t-1}, db_t = λ_t
    return {"a": lam * h_prev, "b": np.ascontiguousarray(lam)}


# ---------------------------------------------------------------------------- selective scan
class SelectiveAssocCache(NamedTuple):
    inputs: tuple  # (x, delta, A, B, C, D)
    scan: AssocScanCache  # over lanes (B, T, d, N)


def selective_scan_assoc_forward(x, delta, A, B, C, D):
    """Mamba's selective scan with the state recurrence done by the parallel scan.

    Inputs:  x, delta (B, T, d); A (d, N); B, C (B, T, N); D (d,) (as selective_scan_forward).
    Math:    a_t = exp(Δ_t A), b_t = Δ_t B_t x_t (B, T, d, N), h = associative scan (a, b),
             y_t = <C_t, h_t> + D x_t.  The same y as scratchllm.ssm.selective_scan_forward, with
             O(log T) depth instead of T (and the (B, T, d, N) states held for the backward).
    Returns: y (B, T, d).  Cache: SelectiveAssocCache.
    """
    x, delta, A, B, C, D = common_float(x, delta, A, B, C, D)
    _check("selective_scan_assoc_forward", x, delta)
    batch, T, d = x.shape
    expect_shape("selective_scan_assoc_forward", "A", A, (d, None), "(d, N)")
    N = A.shape[1]
    for name, arr in (("B", B), ("C", C)):
        expect_shape("selective_scan_assoc_forward", name, arr, (batch, T, N), "(B, T, N)")
    expect_shape("selective_scan_assoc_forward", "D", D, (d,), "(d,)")
    a = np.exp(delta[..., None] * A)  # (B, T, d, N)
    b = delta[..., None] * B[:, :, None, :] * x[..., None]  # (B, T, d, N)
    h, scan = associative_scan_forward(a, b)  # (B, T, d, N)
    y = np.einsum("btdn,btn->btd", h, C) + D * x  # (B, T, d)
    return y, SelectiveAssocCache((x, delta, A, B, C, D), scan)


def selective_scan_assoc_backward(dy, cache):
    """Backward of selective_scan_assoc_forward: the chain rule around associative_scan_backward.

    Math (a = exp(ΔA), b = Δ B x, h = scan(a, b)):
        dh_t = C_t dy_t;  {da, db} = associative_scan_backward(dh)   (the reverse-time scan)
        dΔ = Σ_n (da a A + db B x);  dA = Σ_{b,t} da a Δ;  dB = Σ_d db Δ x;
        dx = Σ_n db Δ B + D dy;  dC = Σ_d dy h;  dD = Σ_{b,t} dy x.
    Reference: Gu & Dao 2023 (arXiv 2312.00752) §3.3 (the selective scan).
    Returns {x, delta, A, B, C, D}.
    """
    (x, delta, A, B, C, D), scan = cache
    expect_dout("selective_scan_assoc_backward", dy, x.shape, x.dtype, name="dy")
    a, h = scan
    # fwd: y = <C, h> + D x  ->  dh = C dy, dC = Σ_d dy h
    g = associative_scan_backward(C[:, :, None, :] * dy[..., None], scan)  # (B, T, d, N) each
    da_a = g["a"] * a  # (B, T, d, N): dL/d(ΔA)
    db = g["b"]  # (B, T, d, N)
    # fwd: a = exp(Δ A); b = Δ B x
    return {
        "x": D * dy + delta * np.einsum("btdn,btn->btd", db, B),
        "delta": np.einsum("btdn,dn->btd", da_a, A) + x * np.einsum("btdn,btn->btd", db, B),
        "A": np.einsum("btdn,btd->dn", da_a, delta),
        "B": np.einsum("btdn,btd->btn", db, delta * x),
        "C": np.einsum("btd,btdn->btn", dy, h),
        "D": np.sum(dy * x, axis=(0, 1)),
    }
