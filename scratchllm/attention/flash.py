"""Tiled (Flash) attention: FlashAttention-2 (Dao 2023, arXiv 2307.08691) in NumPy. The same
numbers as sdpa, but the (Tq, Tk) score matrix is never held: keys are visited in blocks with
an online softmax, and the backward recomputes each block of P from the row logsumexp.

Forward, for one block of query rows against key blocks j = 1, 2, ... (S_j = scale q k_j^T
+ bias_j, masked entries -inf):
    m_j = max(m_{j-1}, rowmax(S_j))                    running row max
    l_j = exp(m_{j-1} - m_j) l_{j-1} + rowsum(exp(S_j - m_j))
    A_j = exp(m_{j-1} - m_j) A_{j-1} + exp(S_j - m_j) v_j
Why the rescaling is exact: softmax is unchanged by a shift of the row, and A_j = sum over the
keys seen so far of exp(S - m_j) v. Changing the reference from m_{j-1} to m_j multiplies
every earlier term by exp(m_{j-1} - m_j), so the old A and l are rescaled by that factor and
the new block's terms are added. After the last block out = A / l and L = m + log l (the
row's logsumexp), so that P = exp(S - L) without any row max or sum. Only out and L are kept.
Backward, per block, with P = exp(S - L) recomputed:
    dv += P^T dout,  dP = dout v^T,  dS = P * (dP - D),  dq += scale dS k,  dk += scale dS^T q
    D_i = rowsum(dP * P)_i = sum_j P_ij (dout_i . v_j) = dout_i . (sum_j P_ij v_j)
        = rowsum(dout * out)_i,
so the softmax backward's row term is computed once from out, without any full row of P.

Masks: a Mask's causal, window and n_sink, built tile by tile from positions as the masks.py
arrays would be (True = may attend; an explicit array or a block pattern is sdpa's): query
row i sits at position i + Tk - Tq (bottom-right aligned, so a query block of the last Tq
tokens lines up with the whole key sequence); causal keeps keys j <= pos; window W keeps
j > pos - W; n_sink keeps the first S keys as well (attention_sink_mask).
Sink logits (gpt-oss, `sinks=`): row i of head h has one more softmax column of logit
sinks[h] and no value; the online softmax starts from it (m_0 = sinks[h], l_0 = 1,
A_0 = 0), so L includes it and P_sink = exp(sinks[h] - L). Its gradient: dP_sink = 0 (no
value), so dS_sink = -P_sink D and dsinks[h] = -sum_rows P_sink D; the key columns'
dS = P (dP - D) is unchanged, as D = rowsum(dout * out) already sums only the keys (the
sink adds nothing to out). ALiBi (positions.py) adds
-slope_h |pos - j| inside each block, and its slope gradient is the sum of dS times that
distance. Grouped K/V heads as in sdpa: the G query heads of a KV head are stacked along the
rows, so each block is one (G*bq, Dh) @ (Dh, bk) product. Extra memory: out, L, dq and the
blocks, O(B H T + B H bq bk); no (Tq, Tk) array.

Two twins (core/twins.use_fused, chosen in the forward and carried by the cache): these
NumPy loops, all heads of a block in one batched product (the readable twin, and ALiBi's
path), and flash_lanes.py's, the same loops per KV head on threads with each tile's
elementwise work in one Numba loop (flash_kernels.py); tests/attention/test_flash.py checks
that they agree.

Glossary: B batch, Tq/Tk query/key lengths, H query heads, Hkv KV heads, G = H / Hkv, Dh head
dim, Dv value head dim, W window, S sink tokens; bq, bk query and key block sizes.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.flash_lanes import backward_lanes, forward_lanes
from scratchllm.attention.sdpa import check_heads
from scratchllm.core.twins import use_fused
from scratchllm.core.validate import (common_float, expect_dout, expect_finite, expect_float,
                                      expect_integer, expect_shape)
from scratchllm.specs import Mask


class FlashOptions(NamedTuple):
    scale: float
    causal: bool
    window: int       # None = no window
    n_sink: int
    block_q: int
    block_k: int
    fused: bool       # not SCRATCHLLM_READABLE: flash_lanes.py's twin (without ALiBi)


class FlashCache(NamedTuple):
    q: np.ndarray      # (B, H, Tq, Dh)
    k: np.ndarray      # (B, Hkv, Tk, Dh)
    v: np.ndarray      # (B, Hkv, Tk, Dv)
    alibi_slopes: np.ndarray  # (H,) or None
    sinks: np.ndarray  # (H,) sink logits or None
    out: np.ndarray    # (B, H, Tq, Dv)
    lse: np.ndarray    # (B, Hkv, G*Tq, 1) row logsumexp, -inf for a fully masked row
    opts: FlashOptions


def _options(q, k, v, mask, scale, block):
    """FlashOptions of a call, its inputs checked: the Mask's causal, window and n_sink (an
    array or a block pattern is sdpa's), the scale (default Dh^-1/2), the tiles (block: an
    int for both, or a pair (bq, bk)), and the twin, chosen once for forward and backward."""
    fn = "flash_sdpa"
    Dh = check_heads(fn, q, k, v)[3]
    if mask is not None and not isinstance(mask, Mask):
        raise TypeError(f"{fn}: mask must be a Mask or None, got {type(mask).__name__}")
    if mask is not None and (mask.array is not None or mask.block is not None
                             or mask.chunk is not None):
        raise ValueError(f"{fn}: tiles causal, window and n_sink masks; a mask array or a "
                         f"block pattern needs sdpa_forward, and so do chunks")
    block_q, block_k = block if isinstance(block, tuple) and len(block) == 2 else (block, block)
    expect_integer(fn, "block", block_q, 1)
    expect_integer(fn, "block", block_k, 1)
    scale = Dh ** -0.5 if scale is None else expect_finite(fn, "scale", scale)
    causal = mask is not None and mask.causal
    return FlashOptions(scale, causal, mask.window if causal else None,
                        mask.n_sink if causal else 0, int(block_q), int(block_k), use_fused())


def _check_per_head(q, alibi_slopes, sinks):
    """alibi_slopes and sinks: None or a float (H,) array."""
    for name, a in (("alibi_slopes", alibi_slopes), ("sinks", sinks)):
        if a is not None:
            expect_float("flash_sdpa", name, a)
            expect_shape("flash_sdpa", name, a, (q.shape[1],), "(H,): one per query head")


def _block_keep(opts, i0, i1, j0, j1, offset):
    """Which (query i, key j) pairs of the block may attend: True (all), False (none) or a
    (bq, bk) bool array. Query i sits at position i + offset."""
    if not opts.causal:
        return True
    first, last = i0 + offset, i1 - 1 + offset  # the block's first and last positions
    if j0 > last:  # every key after every query
        return False
    if opts.window is not None and j1 - 1 <= first - opts.window and j0 >= opts.n_sink:
        return False  # every key older than every query's window, and no sink
    in_window = opts.window is None or j0 > last - opts.window or j1 - 1 < opts.n_sink
    if j1 - 1 <= first and in_window:  # every key at or before every query, inside its window
        return True
    pos = np.arange(i0, i1)[:, None] + offset  # (bq, 1)
    j = np.arange(j0, j1)[None, :]  # (1, bk)
    keep = j <= pos  # (bq, bk)
    if opts.window is not None:
        keep &= (j > pos - opts.window) | (j < opts.n_sink)
    return True if keep.all() else (keep if keep.any() else False)


def _scores(qb, kb, slopes, keep, opts, i0, i1, j0, j1, offset):
    """S = scale qb kb^T - slope |pos - j|, masked to -inf: (B, Hkv, G*bq, bk)."""
    B, Hkv, R, _ = qb.shape
    s = qb @ kb.swapaxes(-1, -2)  # (B, Hkv, G*bq, bk)
    s *= np.asarray(opts.scale, s.dtype)
    s5 = s.reshape(B, Hkv, -1, i1 - i0, j1 - j0)  # (B, Hkv, G, bq, bk), a view
    if slopes is not None:
        s5 += slopes * _distance(i0, i1, j0, j1, offset).astype(s.dtype)
    if keep is not True:
        np.copyto(s5, np.asarray(-np.inf, s.dtype), where=~keep)
    return s


def _distance(i0, i1, j0, j1, offset):
    """-|pos - j| for the block: (bq, bk), ALiBi's bias per unit slope."""
    return -np.abs(np.arange(i0, i1)[:, None] + offset - np.arange(j0, j1)[None, :])  # (bq, bk)


def _rows(a, G, i0, i1):
    """Rows i0:i1 of every head of a (B, H, T, X) array, grouped: (B, Hkv, G*bq, X)."""
    B, H, _, X = a.shape
    return a[:, :, i0:i1].reshape(B, H // G, G * (i1 - i0), X)  # (B, Hkv, G*bq, X)


def _blocks(opts, Tq, Tk):
    """(i0, i1, [(j0, j1, keep)]) per query block, fully masked key blocks left out."""
    offset = Tk - Tq
    for i0 in range(0, Tq, opts.block_q):
        i1 = min(i0 + opts.block_q, Tq)
        ks = []
        for j0 in range(0, Tk, opts.block_k):
            j1 = min(j0 + opts.block_k, Tk)
            keep = _block_keep(opts, i0, i1, j0, j1, offset)
            if keep is not False:
                ks.append((j0, j1, keep))
        yield i0, i1, ks


def flash_sdpa_forward(q, k, v, *, mask=None, scale=None, alibi_slopes=None, sinks=None,
                       block=128):
    """out = softmax(q k^T * scale + alibi, masked) v, tiled; equals sdpa_forward.

    Inputs:  q (B, H, Tq, Dh), k (B, Hkv, Tk, Dh), v (B, Hkv, Tk, Dv), H a multiple of Hkv;
             mask a Mask (causal, window, n_sink: as causal_mask / sliding_window_mask /
             attention_sink_mask, query i at position i + Tk - Tq) or None (attend
             everywhere); scale defaults to Dh^-1/2; alibi_slopes (H,) or None; sinks (H,)
             or None: gpt-oss's per-head sink logits (as sdpa_forward's); block the tile
             size, an int for both or a pair (bq, bk).
    Returns: out (B, H, Tq, Dv); a fully masked query row gives zeros.
    Cache:   FlashCache: the inputs, out and the row logsumexp L (B, Hkv, G*Tq, 1).
    """
    q, k, v, sinks = common_float(q, k, v, sinks)
    opts = _options(q, k, v, mask, scale, block)
    _check_per_head(q, alibi_slopes, sinks)
    B, H, Tq, Dh = q.shape
    Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
    G = H // Hkv
    slopes = None if alibi_slopes is None else alibi_slopes.reshape(Hkv, G, 1, 1)  # (Hkv,G,1,1)
    out = np.zeros((B, H, Tq, Dv), q.dtype)  # (B, H, Tq, Dv)
    lse = np.full((B, Hkv, G * Tq, 1), -np.inf, q.dtype)  # (B, Hkv, G*Tq, 1)
    if opts.fused and alibi_slopes is None:  # the fused twin: these loops per lane, threaded
        forward_lanes(q, k, v, sinks, opts, list(_blocks(opts, Tq, Tk)), out, lse)
        return out, FlashCache(q, k, v, alibi_slopes, sinks, out, lse, opts)
    for i0, i1, ks in _blocks(opts, Tq, Tk):
        qb = _rows(q, G, i0, i1)  # (B, Hkv, G*bq, Dh)
        m, l = _start(sinks, qb.shape[:3], G, i1 - i0, q.dtype)  # (B, Hkv, G*bq, 1) max, sum
        acc = np.zeros(qb.shape[:3] + (Dv,), q.dtype)  # (B, Hkv, G*bq, Dv)
        for j0, j1, keep in ks:
            s = _scores(qb, k[:, :, j0:j1], slopes, keep, opts, i0, i1, j0, j1, Tk - Tq)
            m_new = np.maximum(m, s.max(axis=-1, keepdims=True))  # (B, Hkv, G*bq, 1)
            ref = np.where(np.isfinite(m_new), m_new, 0)  # (B, Hkv, G*bq, 1): no inf - inf
            p = _exp_shift(s, ref)  # exp(S - ref) in place  (B, Hkv, G*bq, bk)
            alpha = np.exp(m - ref)  # (B, Hkv, G*bq, 1) rescales the earlier blocks
            l = alpha * l + p.sum(axis=-1, keepdims=True)  # (B, Hkv, G*bq, 1)
            acc = alpha * acc + p @ v[:, :, j0:j1]  # (B, Hkv, G*bq, Dv)
            m = m_new
        seen = l > 0  # (B, Hkv, G*bq, 1)
        ob = np.divide(acc, l, out=np.zeros_like(acc), where=seen)  # (B, Hkv, G*bq, Dv)
        out[:, :, i0:i1] = ob.reshape(B, H, i1 - i0, Dv)
        lse5 = lse.reshape(B, Hkv, G, Tq, 1)  # (B, Hkv, G, Tq, 1), a view
        lse5[:, :, :, i0:i1] = np.where(seen, m + np.log(np.where(seen, l, 1)),
                                        -np.inf).reshape(B, Hkv, G, i1 - i0, 1)
    return out, FlashCache(q, k, v, alibi_slopes, sinks, out, lse, opts)


def _exp_shift(s, ref):
    """exp(s - ref) in place, s (B, Hkv, G*bq, bk), ref (B, Hkv, G*bq, 1) (flash_kernels'
    online_block_ and probs_block_ do this inside one loop)."""
    s -= ref
    return np.exp(s, out=s)


def _softmax_grad(dp, p, d_row, c):
    """c P (dP - D) in place of dp (B, Hkv, G*bq, bk), d_row (B, Hkv, G*bq, 1)
    (flash_kernels.softmax_grad_ in one loop)."""
    dp -= d_row
    np.multiply(dp, p, out=dp)
    if c != 1:
        dp *= np.asarray(c, dp.dtype)
    return dp


def _sink_rows(sinks, shape, G, bq):
    """sinks[h] on each of the G*bq grouped rows of every head: (B, Hkv, G*bq, 1)."""
    B, Hkv, _ = shape
    return np.broadcast_to(sinks.reshape(1, Hkv, G, 1, 1), (B, Hkv, G, bq, 1)).reshape(
        B, Hkv, G * bq, 1)  # (B, Hkv, G*bq, 1)


def _start(sinks, shape, G, bq, dtype):
    """The online softmax before any key block: m = -inf, l = 0; with sinks the sink column
    is already seen: m = sinks[h], l = exp(sinks[h] - m) = 1 (and A = 0: no value)."""
    if sinks is None:
        m = np.full(shape + (1,), -np.inf, dtype)  # (B, Hkv, G*bq, 1)
        return m, np.zeros_like(m)
    m = _sink_rows(sinks.astype(dtype), shape, G, bq).copy()  # (B, Hkv, G*bq, 1)
    return m, np.ones_like(m)


def flash_sdpa_backward(dout, cache):
    """Gradients of flash_sdpa_forward, block by block from the row logsumexp.

    Math (S = scale q k^T + bias, P = exp(S - L), D = rowsum(dout * out)):
        dv = P^T dout,  dP = dout v^T,  dS = P * (dP - D),
        dq = scale dS k,  dk = scale dS^T q,  dslope_h = sum_ij dS_hij * (-|pos_i - j|),
        dsinks_h = -sum_i exp(sinks_h - L_i) D_i   (the sink column: dP = 0, dS = -P D).
    D = rowsum(dP * P) because rowsum_j P_ij dout_i . v_j = dout_i . out_i (module docstring).
    Reference: Dao 2023 (arXiv 2307.08691) Algorithm 2; Dao-AILab/flash-attention
    flash_attn/flash_attn_triton.py.
    """
    q, k, v, alibi_slopes, sinks, out, lse, opts = cache
    expect_dout("flash_sdpa_backward", dout, out.shape, out.dtype)
    B, H, Tq, Dh = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    G = H // Hkv
    if opts.fused and alibi_slopes is None:  # the fused twin (flash_lanes.py)
        dq, dk, dv, dsinks = backward_lanes(dout, cache, list(_blocks(opts, Tq, Tk)))
        grads = {"q": dq, "k": dk, "v": dv}
        return grads if sinks is None else {**grads, "sinks": dsinks.reshape(H)}
    slopes = None if alibi_slopes is None else alibi_slopes.reshape(Hkv, G, 1, 1)  # (Hkv,G,1,1)
    dq = np.zeros_like(q)  # (B, H, Tq, Dh)
    dk, dv = np.zeros_like(k), np.zeros_like(v)  # (B, Hkv, Tk, Dh), (B, Hkv, Tk, Dv)
    dslopes, dsinks = np.zeros((Hkv, G), q.dtype), np.zeros((Hkv, G), q.dtype)  # (Hkv, G)
    lse5 = lse.reshape(B, Hkv, G, Tq, 1)  # (B, Hkv, G, Tq, 1)
    for i0, i1, ks in _blocks(opts, Tq, Tk):
        qb, dob = _rows(q, G, i0, i1), _rows(dout, G, i0, i1)  # (B, Hkv, G*bq, Dh|Dv)
        d_row = np.sum(dob * _rows(out, G, i0, i1), axis=-1, keepdims=True)  # D (B,Hkv,G*bq,1)
        L = lse5[:, :, :, i0:i1].reshape(d_row.shape)  # (B, Hkv, G*bq, 1)
        L = np.where(np.isfinite(L), L, np.inf)  # a fully masked row: P = exp(-inf) = 0
        if sinks is not None:  # fwd: sink column, P_s = exp(sink - L), no value -> dS_s = -P_s D
            p_sink = np.exp(_sink_rows(sinks.astype(q.dtype), L.shape[:3], G, i1 - i0) - L)
            dsinks -= (p_sink * d_row).reshape(B, Hkv, G, i1 - i0).sum(axis=(0, 3))  # (Hkv, G)
        dqb = np.zeros_like(qb)  # (B, Hkv, G*bq, Dh)
        for j0, j1, keep in ks:
            kb, vb = k[:, :, j0:j1], v[:, :, j0:j1]  # (B, Hkv, bk, Dh|Dv)
            s = _scores(qb, kb, slopes, keep, opts, i0, i1, j0, j1, Tk - Tq)
            p = _exp_shift(s, L)  # fwd: P = exp(S - L)  (B, Hkv, G*bq, bk)
            dv[:, :, j0:j1] += p.swapaxes(-1, -2) @ dob  # fwd: out = P v -> dv = P^T dout
            dp = dob @ vb.swapaxes(-1, -2)  # fwd: out = P v -> dP = dout v^T  (B,Hkv,G*bq,bk)
            c = 1.0 if slopes is not None else opts.scale  # the scale after ALiBi's gradient
            ds = _softmax_grad(dp, p, d_row, c)  # fwd: P = softmax(S) -> c P (dP - D)
            if slopes is not None:  # fwd: S += slope * dist -> dslope = sum dS * dist
                dist = _distance(i0, i1, j0, j1, Tk - Tq)  # (bq, bk)
                dslopes += np.einsum("bgxij,ij->gx", ds.reshape(
                    B, Hkv, G, i1 - i0, j1 - j0), dist.astype(ds.dtype))
                ds *= np.asarray(opts.scale, ds.dtype)  # fwd: S = scale q k^T
            dqb += ds @ kb  # fwd: S = scale q k^T -> dq = scale dS k
            dk[:, :, j0:j1] += ds.swapaxes(-1, -2) @ qb  # -> dk = scale dS^T q (G heads sum)
        dq[:, :, i0:i1] = dqb.reshape(B, H, i1 - i0, Dh)
    grads = {"q": dq, "k": dk, "v": dv}
    if alibi_slopes is not None:
        grads["alibi_slopes"] = dslopes.reshape(H)  # (H,)
    if sinks is not None:
        grads["sinks"] = dsinks.reshape(H)  # (H,)
    return grads
