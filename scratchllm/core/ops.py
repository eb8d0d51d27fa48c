"""Core ops as forward/backward pairs: linear, embedding, rmsnorm, silu, sigmoid, softplus,
swiglu, softmax, log_softmax, cross_entropy.

Every `*_forward(...)` returns `(out, cache)`; every `*_backward(dout, cache)` returns a dict
keyed by the forward's argument names. Weights are stored (d_in, d_out) so that y = x @ W.

Letters (README glossary): BT rows (all leading axes flattened), D features, Din/Dout a
linear's sizes, F FFN hidden size, V vocabulary, T time.
"""
from typing import NamedTuple

import numpy as np
from scipy.special import expit

from scratchllm.core.fp8 import (FP8LinearCache, fp8_active, fp8_linear_backward,
                                 fp8_linear_forward)
from scratchllm.core.frozen import is_frozen
from scratchllm.core.gemm import matmul_add
from scratchllm.core.scatter import add_rows
from scratchllm.core.validate import (expect_dout, expect_finite, expect_float, expect_gated_ffn,
                                      expect_int, expect_integer, expect_linear, expect_shape)


# ---------------------------------------------------------------------------- linear
def matmul_rows(a, M):
    """a @ M for a (..., K) and a matrix M (K, N): one GEMM over all of a's rows when a is
    C-contiguous (its leading axes flattened into a view), where NumPy's matmul would call
    one per (T, K) slice of a (B, T, K) batch (5-15% slower at T = 128: more, smaller
    GEMMs). Returns (..., N); the same products, each row's dot products in BLAS's order."""
    if a.ndim <= 2 or not a.flags.c_contiguous:
        return a @ M  # (..., N)
    return (a.reshape(-1, a.shape[-1]) @ M).reshape(a.shape[:-1] + M.shape[1:])  # (..., N)


class LinearCache(NamedTuple):
    x: np.ndarray
    W: np.ndarray
    has_bias: bool


def linear_forward(x, W, b=None):
    """y = x @ W + b.

    Inputs:  x (..., Din), W (Din, Dout), b (Dout,) or None.
    Returns: y (..., Dout).  Cache: (x, W, has_bias).
    """
    fp8 = fp8_active()
    if fp8 is not None:  # inside core.fp8.fp8_matmuls: the FP8 pair (its cache says so)
        return fp8_linear_forward(x, W, b, spec=fp8)
    expect_float("linear", "x", x, 1)
    expect_linear("linear", x.shape[-1], W, b)
    y = matmul_rows(x, W)  # (..., Dout)
    if b is not None:
        y = y + b  # (..., Dout)
    return y, LinearCache(x, W, b is not None)


def linear_out(cache):
    """(shape, dtype) of a linear's output y = x @ W (+ b), read off its cache: what the dout
    of any backward that ends in this linear must be."""
    return cache.x.shape[:-1] + cache.W.shape[1:], np.result_type(cache.x, cache.W)


def linear_backward(dy, cache, into=None):
    """Math: dx = dy @ W^T, dW = sum over rows of x^T dy, db = sum over rows of dy. (A cache
    made under core.fp8.fp8_matmuls goes to the FP8 pair's backward.)

    into: a (Din, Dout) array (a Param's grad) that x^T dy is added to in place by one gemm
    with beta = 1 (matmul_add), instead of a fresh dW; returned as "W" either way."""
    if isinstance(cache, FP8LinearCache):
        if into is not None:
            raise ValueError("linear_backward: into= is not taken with an FP8 cache")
        return fp8_linear_backward(dy, cache)
    expect_dout("linear_backward", dy, *linear_out(cache), name="dy")
    x, W, has_bias = cache
    Din, Dout = W.shape
    if into is not None:
        expect_shape("linear_backward", "into", into, (Din, Dout), "(Din, Dout)")
    dx = matmul_rows(dy, W.T)  # (..., Din)
    if is_frozen(W):  # core/frozen.py: nothing trains W, skip x^T dy
        dW = np.zeros((Din, Dout), np.result_type(x, dy)) if into is None else into
    elif into is not None:  # fwd: y = x W -> into += x^T dy
        dW = matmul_add(into, x.reshape(-1, Din).T, dy.reshape(-1, Dout))  # (Din, Dout)
    else:
        dW = x.reshape(-1, Din).T @ dy.reshape(-1, Dout)  # (Din, Dout)
    grads = {"x": dx, "W": dW}
    if has_bias:
        grads["b"] = dy.reshape(-1, Dout).sum(axis=0)  # (Dout,)
    return grads


# ---------------------------------------------------------------------------- embedding
class EmbeddingCache(NamedTuple):
    ids: np.ndarray
    vocab_size: int
    d_model: int
    dtype: np.dtype


def embedding_forward(ids, E):
    """out = E[ids]: a row lookup.

    Inputs:  ids (...) integers in [0, V), E (V, D).
    Returns: out (..., D).  Cache: (ids, V).
    """
    expect_int("embedding", "ids", ids)
    expect_float("embedding", "E", E)
    expect_shape("embedding", "E", E, (None, None), "(V, D)")
    if ids.size and (ids.min() < 0 or ids.max() >= E.shape[0]):
        raise ValueError(f"embedding: ids must lie in [0, {E.shape[0]}), got values in "
                         f"[{ids.min()}, {ids.max()}]")
    return E[ids], EmbeddingCache(ids, *E.shape, E.dtype)  # (..., D)


def embedding_backward(dout, cache, into=None):
    """Math: dE[v] = sum of dout over the positions where ids == v (repeats accumulate).

    into: a (V, D) array to add dE to in place (a Param's grad: only the rows of ids are
    touched), instead of a fresh (V, D) of zeros; returned as "E" either way."""
    ids, V, D, dtype = cache
    expect_dout("embedding_backward", dout, ids.shape + (D,), dtype)
    dE = np.zeros((V, D), dtype=dout.dtype) if into is None else into  # (V, D)
    add_rows(dE, ids.reshape(-1), dout.reshape(-1, D))  # np.add.at, or its fused twin's bits
    return {"E": dE}


# ---------------------------------------------------------------------------- rmsnorm
class RMSNormCache(NamedTuple):
    x: np.ndarray
    g: np.ndarray
    rstd: np.ndarray


def rmsnorm_forward(x, g, eps=1e-5):
    """y = x / sqrt(mean(x^2) + eps) * g   (Zhang & Sennrich 2019), over the last axis.

    Inputs:  x (..., D), g (D,).
    Returns: y (..., D).  Cache: (x, g, rstd); xhat = x * rstd is recomputed.
    """
    check_rmsnorm_inputs(x, g)
    eps = expect_finite("rmsnorm", "eps", eps, 0, open_low=True)
    with np.errstate(over="ignore"):  # an overflowing row is rescaled below
        ms = np.mean(x * x, axis=-1, keepdims=True)  # (..., 1)
    rstd = 1.0 / np.sqrt(ms + eps)  # (..., 1)
    if not np.isfinite(ms).all():  # x * x overflowed (float32 |x| > 1.8e19, float16 > 255)
        rstd = _rescaled_rstd(x, eps, rstd)
    with np.errstate(invalid="ignore"):  # inf * NaN in a row holding inf: NaN, as documented
        return x * rstd * g, RMSNormCache(x, g, rstd)  # (..., D)


def check_rmsnorm_inputs(x, g):
    """x (..., D) float with D >= 1, g (D,): rmsnorm's checks, shared by its fused twin."""
    expect_float("rmsnorm", "x", x, 1)
    if x.shape[-1] == 0:
        raise ValueError(f"rmsnorm: x has shape {x.shape}: D = 0 features (nothing to "
                         f"normalise)")
    expect_shape("rmsnorm", "g", g, (x.shape[-1],), "the last axis of x")


def _rescaled_rstd(x, eps, rstd):
    """rstd of the rows whose mean square overflowed, from x / s with s = max|x| per row:
    rstd = (1/s) / sqrt(mean((x/s)^2) + eps/s^2), every term representable. A row holding
    inf gets NaN (a documented choice: with several infinite entries the limit depends on
    their rates, and one rule for every inf row is easier to reason about)."""
    s = np.max(np.abs(x), axis=-1, keepdims=True)  # (..., 1)
    big = np.isfinite(s) & (s > 1)  # (..., 1) finite rows only: inf/NaN inputs stay NaN
    holds_inf = np.isinf(s)  # (..., 1) a row holding inf has no limit: all NaN
    s = np.where(big, s, 1).astype(x.dtype)  # (..., 1)
    xs = x / s  # (..., D)
    r = (1 / s) / np.sqrt(np.mean(xs * xs, axis=-1, keepdims=True) + eps / s / s)  # (..., 1)
    return np.where(holds_inf, np.nan, np.where(big, r, rstd)).astype(rstd.dtype)  # (..., 1)


def rmsnorm_backward(dy, cache):
    """Math: with xhat = x r, r = (mean(x^2) + eps)^-1/2 and dxhat = dy * g,
        dg = sum over rows of dy * xhat
        dx = r * (dxhat - xhat * mean(dxhat * xhat))      (the mean term comes from dr/dx)
    """
    x, g, rstd = cache
    expect_dout("rmsnorm_backward", dy, x.shape, np.result_type(x, g), name="dy")
    D = x.shape[-1]
    xhat = x * rstd  # (..., D)
    dg = (dy * xhat).reshape(-1, D).sum(axis=0)  # (D,)
    dxhat = dy * g  # (..., D)
    dx = rstd * (dxhat - xhat * np.mean(dxhat * xhat, axis=-1, keepdims=True))  # (..., D)
    return {"x": dx, "g": dg}


# ---------------------------------------------------------------------------- activations
class InputCache(NamedTuple):
    """The cache of an element-wise op that recomputes everything from its input."""
    x: np.ndarray


class SigmoidCache(NamedTuple):
    y: np.ndarray


def silu_forward(x):
    """y = x * sigmoid(x)  (sigmoid via scipy's overflow-free expit).  Cache: (x,)."""
    expect_float("silu", "x", x)
    return x * expit(x), InputCache(x)


def silu_backward(dy, cache):
    """Math: dy/dx = s + x s (1 - s) = s (1 + x (1 - s)), with s = sigmoid(x)."""
    expect_dout("silu_backward", dy, cache.x.shape, cache.x.dtype, name="dy")
    s = expit(cache.x)
    return {"x": dy * s * (1 + cache.x * (1 - s))}


def sigmoid_forward(x):
    """y = 1 / (1 + e^-x), by scipy's expit (no overflow for large |x|).  Cache: (y,)."""
    expect_float("sigmoid", "x", x)
    y = expit(x)
    return y, SigmoidCache(y)


def sigmoid_backward(dy, cache):
    """Math: dy/dx = y (1 - y)."""
    expect_dout("sigmoid_backward", dy, cache.y.shape, cache.y.dtype, name="dy")
    return {"x": dy * cache.y * (1 - cache.y)}


def softplus_forward(x):
    """y = log(1 + e^x) = logaddexp(0, x) (no overflow).  Cache: (x,)."""
    expect_float("softplus", "x", x)
    return np.logaddexp(x.dtype.type(0), x), InputCache(x)


def softplus_backward(dy, cache):
    """Math: softplus'(x) = sigmoid(x)."""
    expect_dout("softplus_backward", dy, cache.x.shape, cache.x.dtype, name="dy")
    return {"x": dy * expit(cache.x)}


# ---------------------------------------------------------------------------- swiglu
class SwiGLUCache(NamedTuple):
    up_a: LinearCache
    up_b: LinearCache
    act: InputCache
    down: LinearCache
    silu_a: np.ndarray
    b: np.ndarray


def swiglu_forward(x, W1, W3, W2):
    """y = (silu(x @ W1) * (x @ W3)) @ W2   (Shazeer 2020, the Llama FFN).

    Inputs:  x (..., D), W1 (D, F), W3 (D, F), W2 (F, D).
    Returns: y (..., D).  Cache: the children's caches and the two gate halves.
    """
    expect_gated_ffn("swiglu", x, W1, W3, W2)
    a, up_a = linear_forward(x, W1)  # (..., F)
    b, up_b = linear_forward(x, W3)  # (..., F)
    s, act = silu_forward(a)  # (..., F)
    y, down = linear_forward(s * b, W2)  # (..., D)
    return y, SwiGLUCache(up_a, up_b, act, down, s, b)


def swiglu_backward(dy, cache):
    """Reverse of the forward, each step through the smaller pairs."""
    expect_dout("swiglu_backward", dy, *linear_out(cache.down), name="dy")
    up_a, up_b, act, down, s, b = cache
    g_down = linear_backward(dy, down)  # fwd: y = m @ W2      -> dm, dW2
    dm = g_down["x"]  # (..., F)
    da = silu_backward(dm * b, act)["x"]  # fwd: m = silu(a) * b -> da = silu'(a) dm b
    g_a = linear_backward(da, up_a)  # fwd: a = x @ W1
    g_b = linear_backward(dm * s, up_b)  # fwd: b = x @ W3     -> db = dm * silu(a)
    return {"x": g_a["x"] + g_b["x"], "W1": g_a["W"], "W3": g_b["W"], "W2": g_down["W"]}


# ---------------------------------------------------------------------------- softmax
def _safe_max(x, axis):
    """Row max for the stable shift; 0 for a fully masked (all -inf) row so no inf - inf."""
    m = np.max(x, axis=axis, keepdims=True)
    return np.where(np.isfinite(m), m, 0).astype(x.dtype)


def _at_the_limit(fn, x, axis):
    """x, refused when its axis is empty, with each row holding exactly one +inf replaced by
    its limit's logits: 0 there and -inf elsewhere, so softmax gives the exact one-hot and
    log_softmax [.., 0, ..] (-inf elsewhere). A row with several +inf has no limit (it depends
    on their rates): it gives NaN."""
    if x.shape[axis] == 0:
        raise ValueError(f"{fn}: x has shape {x.shape}: axis {axis} is empty (no entries to "
                         f"normalise over)")
    pos = np.isposinf(x)
    if not pos.any():
        return x
    one = np.sum(pos, axis=axis, keepdims=True) == 1
    return np.where(one, np.where(pos, 0, -np.inf), x).astype(x.dtype)


class SoftmaxCache(NamedTuple):
    y: np.ndarray  # softmax(x), or log_softmax(x) in a LogSoftmaxCache
    axis: int


class LogSoftmaxCache(NamedTuple):
    y: np.ndarray
    axis: int


def softmax_forward(x, axis=-1):
    """y = exp(x - max) / sum exp(x - max). A fully masked (-inf) row gives zeros; a row with
    one +inf gives its limit, the one-hot (_at_the_limit).

    Inputs: x (...), any axis.  Returns: y, same shape.  Cache: (y, axis).
    """
    expect_float("softmax", "x", x, 1)
    expect_integer("softmax", "axis", axis, -x.ndim, x.ndim - 1)
    x = _at_the_limit("softmax", x, axis)  # (...)
    e = np.exp(x - _safe_max(x, axis))  # (...)
    total = np.sum(e, axis=axis, keepdims=True, dtype=_acc(x))  # (..., 1, ...)
    with np.errstate(invalid="ignore"):  # a row with several +inf: inf / inf, NaN (no limit)
        y = (e / np.where(total > 0, total, 1)).astype(x.dtype)  # (...)
    return y, SoftmaxCache(y, axis)


def _acc(x):
    """The dtype to sum exponentials in: float32 for float16 (65,504 overflows over a large
    vocabulary: 128k terms near 1), else x's own."""
    return np.float32 if x.dtype == np.float16 else x.dtype


def softmax_backward(dy, cache):
    """Math: dx = y * (dy - sum(dy * y)); zero where y is zero (masked entries)."""
    y, axis = cache
    expect_dout("softmax_backward", dy, y.shape, y.dtype, name="dy")
    return {"x": y * (dy - np.sum(dy * y, axis=axis, keepdims=True))}


def log_softmax_forward(x, axis=-1):
    """y = x - logsumexp(x). A fully masked (-inf) row gives -inf (and zero gradient); a row
    with one +inf gives its limit, 0 there and -inf elsewhere (_at_the_limit).

    Inputs: x (...).  Returns: y, same shape.  Cache: (y, axis); softmax = exp(y) is recomputed.
    """
    expect_float("log_softmax", "x", x, 1)
    expect_integer("log_softmax", "axis", axis, -x.ndim, x.ndim - 1)
    x = _at_the_limit("log_softmax", x, axis)  # (...)
    shifted = x - _safe_max(x, axis)  # (...)
    total = np.sum(np.exp(shifted), axis=axis, keepdims=True, dtype=_acc(x))  # (..., 1, ...)
    live = total > 0
    with np.errstate(invalid="ignore"):  # a row with several +inf: NaN (no limit)
        y = np.where(live, shifted - np.log(np.where(live, total, 1)), -np.inf).astype(x.dtype)
    return y, LogSoftmaxCache(y, axis)


def log_softmax_backward(dy, cache):
    """Math: dx = dy - softmax(x) * sum(dy), with softmax(x) = exp(y)."""
    y, axis = cache
    expect_dout("log_softmax_backward", dy, y.shape, y.dtype, name="dy")
    p = np.exp(y)  # (...)
    return {"x": np.where(np.isfinite(y), dy - p * np.sum(dy, axis=axis, keepdims=True), 0)}


# ---------------------------------------------------------------------------- cross-entropy
class CrossEntropyCache(NamedTuple):
    log_softmax: LogSoftmaxCache
    logits_shape: tuple
    rows: np.ndarray
    cols: np.ndarray
    n_valid: int


def checked_targets(logits, targets, ignore_index):
    """Check cross-entropy inputs; return (targets flattened (BT,), mask of counted rows)."""
    expect_float("cross_entropy", "logits", logits, 1)
    expect_int("cross_entropy", "targets", targets)
    expect_shape("cross_entropy", "targets", targets, logits.shape[:-1], "logits.shape[:-1]")
    V = logits.shape[-1]
    flat_t = targets.reshape(-1)  # (BT,)
    keep = flat_t != ignore_index  # (BT,)
    bad = keep & ((flat_t < 0) | (flat_t >= V))
    if bad.any():
        raise ValueError(f"cross_entropy: targets must lie in [0, {V}) or equal ignore_index="
                         f"{ignore_index}, got {flat_t[bad][0]}")
    return flat_t, keep


def cross_entropy_forward(logits, targets, ignore_index=-100):
    """loss = -mean over non-ignored n of log_softmax(logits)[n, targets[n]].

    Inputs:  logits (..., V), targets (...) integers in [0, V) or ignore_index.
    Returns: loss, a 0-d array of logits' dtype (0 when every target is ignored).
    Cache:   the log_softmax cache and the (row, target) pairs that count.
    """
    flat_t, keep = checked_targets(logits, targets, ignore_index)  # (BT,), (BT,)
    V = logits.shape[-1]
    logp, ls_cache = log_softmax_forward(logits.reshape(-1, V))  # (BT, V)
    rows, cols = np.nonzero(keep)[0], flat_t[keep]
    n_valid = len(rows)
    loss = -logp[rows, cols].sum(dtype=_acc(logits)) / max(n_valid, 1)  # float16: in float32
    cache = CrossEntropyCache(ls_cache, logits.shape, rows, cols, n_valid)
    return np.asarray(loss, dtype=logits.dtype), cache


def cross_entropy_backward(dloss, cache):
    """Math: dlogp[n, t_n] = -dloss / n_valid; then the log_softmax backward gives
    dlogits = dloss / n_valid * (softmax - onehot(t)) on counted rows, 0 on ignored ones."""
    ls_cache, logits_shape, rows, cols, n_valid = cache
    logp = ls_cache.y  # (BT, V)
    expect_dout("cross_entropy_backward", dloss, (), logp.dtype, name="dloss")
    dlogp = np.zeros_like(logp)  # (BT, V)
    if n_valid:
        dlogp[rows, cols] = -np.asarray(dloss, dtype=logp.dtype) / n_valid
    dlogits = log_softmax_backward(dlogp, ls_cache)["x"]  # (BT, V); ignored rows stay 0
    return {"logits": dlogits.reshape(logits_shape)}
