"""Calibrated int4 weights: GPTQ (Frantar et al. 2022, arXiv 2210.17323), the same storage as
round-to-nearest (serve/weights.py: 4-bit codes, one float32 scale per group of `group_size`
consecutive input rows of each output column) with the codes chosen to keep a Linear's
outputs on calibration inputs, not each weight, close to the float ones.

A Linear y = x W, W (Din, Dout), seen on calibration inputs X (N, Din). Each output column w
(Din,) is quantised on its own, and the error that matters is the output's:
    E(q) = ||X w − X q||²  =  (w − q)ᵀ H (w − q),   H = XᵀX (the same H for every column).
GPTQ quantises the input rows i = 0, 1, ..., Din−1 in order. After row i is rounded, the rows
not yet quantised absorb its error so E stays smallest (optimal brain surgeon, OBS):
    δ = −(w_i − q_i) / [H⁻¹]_ii · H⁻¹[:, i]       (the remaining rows' update)
    H⁻¹ ← H⁻¹ − H⁻¹[:, i] H⁻¹[i, :] / [H⁻¹]_ii      (row and column i eliminated)
Those eliminated inverses are the rows of the upper Cholesky factor U of H⁻¹ = UᵀU, scaled:
row i of U is H⁻¹_(i)[i, i:] / sqrt([H⁻¹_(i)]_ii), so the whole pass needs one factorisation:
    err_i = (w_i − q_i) / U_ii,      w_(i+1:) −= U_(i, i+1:) err_i     (all columns at once)
Lazy batches: inside a block of B rows the updates go to the block only; the rest of W gets
the block's errors in one matrix product, W_(after) −= U_(block, after)ᵀ Err (GPTQ's §3 step
2). A group's scale is max|w| / 7 over its rows when the pass reaches the group's first row
(the rows already carry the earlier groups' corrections), then fixed: q = clip(round(w / s),
−8, 7). Dampening: H + λ·mean(diag H)·I (λ = damp, 0.01) keeps H⁻¹ well conditioned; an
input never seen (H_ii = 0) gets H_ii = 1 and a zero row.

With H = I (uncorrelated inputs) U is diagonal: nothing propagates and GPTQ is round-to-
nearest; the further X's features are from uncorrelated, the more it gains.

gptq_weights walks an LM's blocks in order: each block's Linear inputs are read off its
forward cache (core.ops.LinearCache) on the calibration ids with the blocks before it already
quantised (so errors are compensated as they will be met), the block's weights are quantised,
then the block runs again to feed the next; the head last. A stacked (E, Din, Dout) of MoE
experts is E matrices, each with the H of the tokens routed to it. Weights no LinearCache
records, and experts no calibration token picks, fall back to round-to-nearest, counted
apart.

Glossary: Din, Dout a matrix's input and output widths; N calibration rows (tokens); g group
size; B the lazy-batch block.
"""
import numpy as np

from scratchllm.core.ops import LinearCache
from scratchllm.core.validate import expect_float, expect_int, expect_integer, expect_ndim
from scratchllm.serve.quantize import Quantized, quantize
from scratchllm.serve.weights import quantizable


def _upper_inverse_cholesky(h, damp):
    """(U with H⁻¹ = UᵀU, dead rows): H (Din, Din) damped, unseen inputs given H_ii = 1."""
    h = np.array(h, dtype=np.float64)  # (Din, Din)
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    h[np.diag_indices_from(h)] += damp * np.mean(np.diag(h))
    hinv = np.linalg.inv(h)
    return np.linalg.cholesky((hinv + hinv.T) / 2).T, dead  # (Din, Din) upper


def _group_scales(W, group_size):
    """max|w| / 7 over each group of rows of W (Din, Dout) -> (Din / g, Dout), float32 values
    (as stored); an all-zero group gets 1."""
    amax = np.abs(W.reshape(-1, group_size, W.shape[1])).max(axis=1)  # (G, Dout)
    return np.where(amax > 0, amax / 7.0, 1.0).astype(np.float32).astype(np.float64)


def gptq_quantize(w, h, *, group_size=32, damp=0.01, block=128, act_order=False):
    """GPTQ int4 of one Linear weight w (Din, Dout) seen through H = XᵀX (Din, Din).

    Inputs:  w float (Din, Dout); h (Din, Din) symmetric positive semi-definite; group_size
             even, dividing Din; damp λ >= 0; block: the lazy batch, rounded up to a multiple
             of group_size; act_order: visit the rows by decreasing H_ii (the inputs with the
             most energy first, while many rows remain to absorb their error), with every
             group's scale fixed beforehand from w ("static groups", so the groups stay
             contiguous in Din and the storage is unchanged).
    Returns: a Quantized of wᵀ (Dout, Din) in quantize's int4 layout (groups along Din), so
             np.swapaxes(q.dequantize(), 0, 1) is the quantised (Din, Dout).
    """
    fn = "gptq_quantize"
    expect_float(fn, "w", w)
    expect_ndim(fn, "w", w, 2, "(Din, Dout)")
    Din, Dout = w.shape
    if np.shape(h) != (Din, Din):
        raise ValueError(f"{fn}: h must be (Din, Din) = {(Din, Din)}, got {np.shape(h)}")
    expect_integer(fn, "group_size", group_size, 2)
    if Din % group_size or group_size % 2:
        raise ValueError(f"{fn}: group_size={group_size} must be even and divide Din={Din}")
    if not damp >= 0:
        raise ValueError(f"{fn}: damp must be >= 0, got {damp!r}")
    g = group_size
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(Din)  # (Din,)
    U, dead = _upper_inverse_cholesky(np.asarray(h)[np.ix_(order, order)], damp)
    W = np.array(w, dtype=np.float64)  # (Din, Dout)
    W[order[dead]] = 0.0
    scales = _group_scales(W, g) if act_order else np.empty((Din // g, Dout))  # (G, Dout)
    W = W[order]  # (Din, Dout) in visiting order, updated in place
    q = np.empty((Din, Dout), np.int8)  # the codes, in visiting order
    B = -(-max(block, 1) // g) * g
    for b0 in range(0, Din, B):
        b1 = min(b0 + B, Din)
        err = np.empty((b1 - b0, Dout))  # (B, Dout) the block's scaled errors
        for i in range(b0, b1):
            if not act_order and i % g == 0:  # the group's scale, from its rows as they are now
                scales[i // g] = _group_scales(W[i:i + g], g)[0]
            s = scales[order[i] // g]  # (Dout,)
            q[i] = np.clip(np.rint(W[i] / s), -8, 7)
            err[i - b0] = (W[i] - q[i] * s) / U[i, i]
            W[i + 1:b1] -= np.outer(U[i, i + 1:b1], err[i - b0])  # inside the block
        W[b1:] -= U[b0:b1, b1:].T @ err  # (Din − b1, Dout) the rest, at once
    codes = np.empty((Dout, Din), np.uint8)
    codes[:, order] = (q.T + 8).astype(np.uint8)  # (Dout, Din) in 0..15, back in Din order
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)  # (Dout, Din/2) low nibble = even entry
    return Quantized(packed, scales.T.astype(np.float32), "int4", g, w.dtype)


def _key(array):
    """Where an array's numbers live: (address, shape, strides); a view names its slice."""
    return array.__array_interface__["data"][0], array.shape, array.strides


def _slices(name, w):
    """{_key: (name, i)} of a quantizable weight: itself (i None), or each expert w[i] of a
    stacked (E, Din, Dout)."""
    if w.ndim == 2:
        return {_key(w): (name, None)}
    return {_key(w[i]): (name, i) for i in range(w.shape[0])}


def _linear_inputs(cache, wanted, found):
    """Walk a forward cache; for every LinearCache whose W is one of `wanted` (_key -> (name,
    expert)), add XᵀX of its inputs to found[(name, expert)] (float64)."""
    if isinstance(cache, LinearCache):
        slot = wanted.get(_key(cache.W))
        if slot is not None:
            x = cache.x.reshape(-1, cache.x.shape[-1]).astype(np.float64)  # (N, Din)
            found[slot] = found.get(slot, 0.0) + x.T @ x
        return
    if isinstance(cache, (tuple, list)):
        for c in cache:
            _linear_inputs(c, wanted, found)
    elif hasattr(cache, "__dict__") and not isinstance(cache, np.ndarray):
        for c in vars(cache).values():
            _linear_inputs(c, wanted, found)


def _quantize_one(w, h, group_size, damp, act_order):
    """(Quantized of wᵀ, by GPTQ?): GPTQ with h, or round to nearest without calibration
    inputs (h None: no LinearCache showed this matrix, or an expert no calibration token
    picked)."""
    if h is None or not np.any(h):
        return quantize(np.ascontiguousarray(w.T), "int4", group_size=group_size), False
    return gptq_quantize(w, h, group_size=group_size, damp=damp, act_order=act_order), True


def gptq_weights(model, calibration, *, group_size=32, damp=0.01, act_order=False):
    """An LM whose Linear weights are GPTQ int4 (dequantised: simulated, as quantize_weights),
    calibrated on token ids; the original model is unchanged.

    Inputs:  model an LM; calibration ids (B, T) (a few windows of held-in text); group_size
             dividing every Linear's Din; damp and act_order as gptq_quantize's.
    Returns: (the quantised model, report {"params", "float_bytes", "quantized_bytes" as
             quantize_weights', "gptq": weights quantised by GPTQ, "rtn": weights no
             LinearCache showed and experts no calibration token picked, quantised
             round-to-nearest}).
    """
    expect_int("gptq_weights", "calibration", calibration)
    expect_ndim("gptq_weights", "calibration", calibration, 2, "(B, T)")
    twin = model.replica()
    params = {name: p for name, p in twin.named_parameters() if quantizable(name, p.data)}
    report = dict(params=0, float_bytes=0, quantized_bytes=0, gptq=0, rtn=0)
    x = twin.residual_stream(calibration)[0]  # (B, T, D) x_0
    stages = [(f"layers.{i}.", layer.forward) for i, layer in enumerate(twin.layers)]
    stages.append(("", twin.head_forward))
    for prefix, forward in stages:
        mine = {n: p for n, p in params.items() if n.startswith(prefix)}
        wanted = {k: v for n, p in mine.items() for k, v in _slices(n, p.data).items()}
        found = {}
        _linear_inputs(forward(x)[1], wanted, found)
        for name, p in mine.items():
            w = p.data  # (Din, Dout) or (E, Din, Dout)
            experts = [None] if w.ndim == 2 else range(w.shape[0])
            out = np.empty_like(w)
            for i in experts:
                wi = w if i is None else w[i]
                try:
                    q, calibrated = _quantize_one(wi, found.get((name, i)), group_size, damp,
                                                  act_order)
                except ValueError as e:
                    raise ValueError(f"gptq_weights: {name} {wi.shape}: {e}") from None
                (out if i is None else out[i])[...] = q.dequantize().T
                report["gptq" if calibrated else "rtn"] += wi.size
                report["quantized_bytes"] += q.nbytes
            p.data = out
            report["params"] += w.size
            report["float_bytes"] += w.nbytes
            del params[name]
        if prefix:
            x = forward(x)[0]  # (B, T, D) through the quantised block
    return twin, report
