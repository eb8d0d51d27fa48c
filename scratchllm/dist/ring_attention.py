"""Context parallelism: ring attention (Liu et al. 2023, arXiv:2310.01889), the sequence split
over the P ranks of a group, each rank's queries meeting every rank's keys and values as the
key/value blocks travel around the ring, the partial softmax statistics merged online (as
flash attention merges its tiles, Dao et al. 2022, arXiv:2205.14135).

    forward, rank r, step i = 0 .. P-1: the block of rank r - i (k_j, v_j, positions_j)
        s = scale q k_j^T, masked by positions (causal: q_pos >= k_pos)
        m' = max(m, rowmax s);  l = l e^(m - m') + rowsum e^(s - m');  acc = acc e^(m - m') + e^(s - m') v_j
        then pass (k_j, v_j) to rank r + 1 (ring_shift)
    o = acc / l,  lse = m + log l
    backward (P = e^(s - lse), D = rowsum(do * o)), step i: the block of rank r - i and its
    gradient accumulators travelling with it:
        dv_j += P^T do;  dS = P * (do v_j^T - D);  dq += scale dS k_j;  dk_j += scale dS^T q
        then pass (k_j, v_j, dk_j, dv_j) on; after P steps every block is home with its whole
        dk and dv (the ring_shift pair's backward: gradients go back the way the data came,
        here by going on around the ring).

Causal load balance: with contiguous blocks rank P-1's queries see P blocks and rank 0's one.
The zig-zag split cuts the sequence into 2P chunks and gives rank r chunks r and 2P-1-r, so every
rank holds one early and one late chunk and the causal work is equal (`zigzag_positions`).

Glossary: B batch, H heads, T whole sequence, Tl = T/P this rank's tokens, Dh head width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_ndim,
                                      expect_shape)
from scratchllm.dist.collectives import ring_shift_forward


class RingCache(NamedTuple):
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    o: np.ndarray
    lse: np.ndarray   # (B, H, Tl) log-sum-exp of each query row
    group: object
    layout: tuple     # (positions of each rank, causal, scale)


def ring_positions(T, P, zigzag=False):
    """[positions (Tl,) of rank r for r in 0..P-1]: contiguous blocks, or the zig-zag split
    (chunks r and 2P-1-r of 2P)."""
    if T % (2 * P if zigzag else P):
        raise ValueError(f"ring attention: T = {T} does not split into {2 * P if zigzag else P} "
                         f"equal chunks ({'zig-zag' if zigzag else 'contiguous'}, P = {P})")
    if not zigzag:
        return [np.arange(r * T // P, (r + 1) * T // P) for r in range(P)]
    c = T // (2 * P)
    return [np.concatenate([np.arange(r * c, (r + 1) * c),
                            np.arange((2 * P - 1 - r) * c, (2 * P - r) * c)]) for r in range(P)]


def _scores(q, k, qpos, kpos, causal, scale):
    s = scale * np.einsum("bhqd,bhkd->bhqk", q, k)  # (B, H, Tl, Tl)
    if causal:
        s = np.where(qpos[:, None] >= kpos[None, :], s, -np.inf)
    return s


def ring_attention_forward(q, k, v, *, group, causal=True, zigzag=False, scale=None):
    """softmax(scale q k^T, masked) v over the whole sequence, each rank holding its tokens.

    Inputs: q, k, v (B, H, Tl, Dh): this rank's tokens (contiguous block r, or zig-zag chunks
    r and 2P-1-r of the whole sequence of T = P Tl). Returns: (o (B, H, Tl, Dh); RingCache).
    """
    q, k, v = common_float(q, k, v)
    for name, a in (("q", q), ("k", k), ("v", v)):
        expect_float("ring_attention", name, a)
        expect_ndim("ring_attention", name, a, 4, "(B, H, Tl, Dh)")
    expect_shape("ring_attention", "k", k, q.shape, "(B, H, Tl, Dh) like q")
    expect_shape("ring_attention", "v", v, q.shape[:3] + (None,), "(B, H, Tl, Dv) like q")
    P, r = group.size, group.rank
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    pos = ring_positions(q.shape[2] * P, P, zigzag)
    m = np.full(q.shape[:3], -np.inf, q.dtype)  # (B, H, Tl) running row max
    l = np.zeros(q.shape[:3], q.dtype)  # running sum of exponentials
    acc = np.zeros(q.shape[:3] + (v.shape[-1],), q.dtype)  # running numerator
    kj, vj = k, v
    for i in range(P):
        s = _scores(q, kj, pos[r], pos[(r - i) % P], causal, scale)  # fwd: block r - i
        m_new = np.maximum(m, s.max(axis=-1))
        safe = np.where(np.isfinite(m_new), m_new, 0.0)  # rows with nothing yet stay 0
        p = np.exp(s - safe[..., None])  # (B, H, Tl, Tl); masked -> 0
        alpha = np.exp(m - safe)  # rescales the old statistics (0 where m was -inf)
        l = l * alpha + p.sum(axis=-1)
        acc = acc * alpha[..., None] + p @ vj
        m = m_new
        if i < P - 1:  # fwd: pass the block on around the ring
            kj = ring_shift_forward(kj, group=group)[0]
            vj = ring_shift_forward(vj, group=group)[0]
    o = acc / l[..., None]  # (B, H, Tl, Dh)
    lse = np.where(np.isfinite(m), m, 0.0) + np.log(l)
    return o, RingCache(q, k, v, o, lse, group, (tuple(pos), causal, scale))


def ring_attention_backward(dout, cache):
    """See the module docstring: dq stays home, each block's dk and dv travel around the ring
    with it and arrive home after P steps."""
    q, k, v, o, lse, group, (pos, causal, scale) = cache
    expect_dout("ring_attention_backward", dout, o.shape, o.dtype)
    P, r = group.size, group.rank
    D = np.sum(dout * o, axis=-1)  # (B, H, Tl)
    dq = np.zeros_like(q)
    kj, vj, dkj, dvj = k, v, np.zeros_like(k), np.zeros_like(v)
    for i in range(P):
        s = _scores(q, kj, pos[r], pos[(r - i) % P], causal, scale)
        p = np.exp(s - lse[..., None])  # (B, H, Tl, Tl): the softmax's entries for block j
        dvj = dvj + np.swapaxes(p, -1, -2) @ dout  # fwd: o = sum_j P_j v_j
        ds = p * (dout @ np.swapaxes(vj, -1, -2) - D[..., None])  # fwd: P = softmax(s)
        dq += scale * ds @ kj  # fwd: s = scale q k_j^T
        dkj = dkj + scale * np.swapaxes(ds, -1, -2) @ q
        # the block's gradients move on with it; after P moves they are home
        dkj, dvj = (ring_shift_forward(a, group=group)[0] for a in (dkj, dvj))
        if i < P - 1:
            kj, vj = (ring_shift_forward(a, group=group)[0] for a in (kj, vj))
    return {"q": dq, "k": dkj, "v": dvj}
