"""The gradient check of a pair whose forward rounds (the FP8 linear): a documented custom
comparison, because finite differences through a rounding measure its steps (0 inside a step,
about step / h across one), not the straight-through gradient the backward defines.

For y = Q(x) @ Q(W) + b with dout drawn at random, the straight-through definition is
    dx = gradient of  L_d(u) = sum(Q_g(dout; 1 x a) * (u @ W^))           at u = x^
    dW = gradient of  L_w(V) = sum(Q_g(dout; a x 1) * (Q(x^; a x 1) @ V))  at V = W^
    db = gradient of  L_b(c) = sum(dout * c)                               (broadcast over rows)
Each L is smooth (linear), so its gradient is taken by central differences in float64, element
by element, and compared with the backward's at the TOLERANCE of grads.check. So the check
confirms both the matmul algebra (transposes, reshapes, tiles along the right axis) and which
operand is quantised on which tiles in dgrad and wgrad; a backward that skips a quantisation
or tiles along the wrong axis fails it (tests/core/test_fp8.py). The forward is checked
separately: y equals the float matmul of fp8_round's operands.
"""
import numpy as np

from grads.check import TOLERANCE, Report, Row, relative_error


def _central(f, u, h):
    """Central differences of the scalar f at u, element by element."""
    g = np.zeros_like(u)
    for i in np.ndindex(u.shape):
        e = np.zeros_like(u)
        e[i] = h
        g[i] = (f(u + e) - f(u - e)) / (2 * h)
    return g


def _row(name, analytic, numeric, forward_ok=True):
    err = relative_error(analytic, numeric)
    ok = np.shape(analytic) == np.shape(numeric) and err < TOLERANCE and forward_ok
    return Row(name, f"{np.size(numeric)} (straight-through)", err, "ok" if ok else "FAIL")


def check_fp8_linear(x, W, b=None, *, spec, rng, backward=None, label=""):
    """Check fp8_linear's backward (or `backward`, to show the check can fail) against the
    straight-through definition above. x (..., Din), W (Din, Dout), b (Dout,) or None float64;
    spec an FP8Spec. Returns a Report with rows x, W [, b] and `forward`."""
    h = 1e-3  # the L are linear: any step is exact up to rounding
    from scratchllm.core.fp8 import fp8_linear_backward, fp8_linear_forward, fp8_round
    backward = fp8_linear_backward if backward is None else backward
    y, cache = fp8_linear_forward(x, W, b, spec=spec)
    a, w = spec.act_tile, spec.weight_block
    x_hat = fp8_round(x, spec.fmt, None if a is None else (1, a))
    W_hat = fp8_round(W, spec.fmt, None if w is None else (w, w))
    want_y = x_hat @ W_hat + (0 if b is None else b)
    report = Report(label=label)
    report.rows.append(Row("forward", f"{y.size} (= float matmul of Q(x), Q(W))",
                           relative_error(y, want_y),
                           "ok" if relative_error(y, want_y) < TOLERANCE else "FAIL"))
    dout = rng.standard_normal(y.shape)
    dout_copy = dout.copy()
    grads = backward(dout, cache)
    if not np.array_equal(dout, dout_copy):
        report.rows.append(Row("dout", "-", float("nan"), "FAIL"))  # backward mutated dout
    Din, Dout = W.shape
    rows = None if a is None else (a, 1)
    dy_d = fp8_round(dout, spec.grad_fmt, None if a is None else (1, a))
    dy_w = fp8_round(dout.reshape(-1, Dout), spec.grad_fmt, rows)
    x_w = fp8_round(x_hat.reshape(-1, Din), spec.fmt, rows)
    report.rows.append(_row("x", grads["x"], _central(
        lambda u: np.sum(dy_d * (u @ W_hat)), x_hat, h)))
    report.rows.append(_row("W", grads["W"], _central(
        lambda v: np.sum(dy_w * (x_w @ v)), W_hat, h)))
    if b is not None:
        report.rows.append(_row("b", grads.get("b"), _central(
            lambda c: np.sum(dout * c), b, h)))
    return report
