"""Native Sparse Attention (NSA: Yuan et al. 2025, arXiv 2502.11089 §3): three branches over
the same queries, mixed by learned gates,
    o_t = σ(g_cmp) Attn(q_t, K̃_cmp, Ṽ_cmp) + σ(g_slc) Attn(q_t, K_slc, V_slc)
          + σ(g_win) Attn(q_t, K_win, V_win)
- compressed: each block of l keys (and values) becomes one token, K̃_j = Σ_i φ_i k_{jl+i}
  (a learned weighting of the block's positions: the paper's MLP φ reduced to its linear
  part); query t sees the blocks that end at or before t;
- selected: the compressed branch's attention, summed over the heads, ranks the blocks
  (p_cmp shared as the importance score, §3.3.2); each query keeps its own block and its
  n − 1 best complete earlier blocks, and attends to their tokens s <= t;
- sliding window: the last w tokens.
The selection is an index choice: no gradient flows through it (as in the paper). The
selected and window branches gather their keys (attention/sparse.py's gather pair: O(T·n·l)
and O(T·w)), the compressed branch attends T/l tokens: O(T²/l), not O(T²).
nsa_forward_ref computes the same three branches with dense (T, T) masks (sdpa): the masked
dense reference.

Backward: dg_c = σ'(g_c) <do, o_c>, do_c = σ(g_c) do; each branch's own backward
(topk_sparse_attention_backward, sdpa_backward); the compression's K̃ = C k (C[j, jl+i] = φ_i)
gives dk += Cᵀ dK̃ and dφ_i = Σ_j <dK̃_j, k_{jl+i}> (and the same for v).

Overlapping compression blocks (the paper's stride d < l, §3.3.1: K̃_i from the l tokens from
i d on, nb = (T − l) // d + 1 of them, visible once they have ended) take `stride` (d must
divide l); the selection blocks stay the l-token blocks j l .. j l + l − 1 (the paper's
l' = l), and a selection block's importance is the paper's eq. 9 (§3.3.2) with r = l' / d = l / d:
    p_slc[j] = Σ_{m=0}^{r−1} Σ_{n=0}^{r−1} p_cmp[r j − m − n]     (indices below 0 dropped)
that is p_slc = p_cmp M with M[i, j] = #{(m, n) : r j − m − n = i} = min(k + 1, 2r − 1 − k)
for k = r j − i in 0 .. 2r − 2 (selection_weights); the identity at d = l. As printed, the sum
runs over the compressed blocks that start at or before selection block j: block r j lies
inside it, blocks r j − k with 0 < k < r straddle its start, and those with k >= r end before
it. Every one of them has ended when block j has, so no query sees a later block through it.
nsa_mlp.py has the paper's MLP compressor on these blocks.

Glossary: B batch, H query heads, Hkv KV heads, T time, Dh head dim, l block, d stride of the
compression blocks, nb compressed blocks, n selected blocks per query, w window.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.sdpa import check_heads, sdpa_backward, sdpa_forward
from scratchllm.attention.sparse import (topk_sparse_attention_backward,
                                         topk_sparse_attention_forward)
from scratchllm.core.ops import sigmoid_backward, sigmoid_forward, softmax_forward
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_integer,
                                      expect_shape)
from scratchllm.specs import Mask


class NSACache(NamedTuple):
    k: np.ndarray  # (B, Hkv, T, Dh)
    v: np.ndarray
    phi: np.ndarray  # (l,)
    outs: tuple  # (o_cmp, o_slc, o_win), each (B, H, T, Dh)
    gates: tuple  # (sigmoid value, its cache)
    branches: tuple  # (sdpa cache, sparse cache, sparse cache)


def _check(fn, q, k, v, phi, gates, block, n_select, window):
    B, H, T, Dh, Hkv, Tk = check_heads(fn, q, k, v)
    if Tk != T:
        raise ValueError(f"{fn}: k has {Tk} positions and q {T}; NSA here is self-attention")
    expect_integer(fn, "block", block, 1, T)
    expect_integer(fn, "n_select", n_select, 1)
    expect_integer(fn, "window", window, 1)
    expect_shape(fn, "phi", phi, (block,), "(block,) compression weights")
    expect_shape(fn, "gates", gates, (B, H, T, 3), "(B, H, T, 3) gate logits (cmp, slc, win)")
    expect_float(fn, "phi", phi)
    expect_float(fn, "gates", gates)


def block_starts(T, block, stride=None):
    """The first token of each complete compression block: 0, d, 2d, ... (d = stride, default
    the block l: no overlap), (nb,) ints with nb = (T − l) // d + 1 (0 when T < l)."""
    stride = block if stride is None else stride
    return np.arange(0, T - block + 1, stride)  # (nb,)


def compress_matrix(phi, T, stride=None):
    """C (nb, T) with C[j, j d + i] = φ_i: the compression K̃ = C k of complete blocks."""
    block = phi.shape[0]
    starts = block_starts(T, block, stride)  # (nb,)
    C = np.zeros((len(starts), T), phi.dtype)  # (nb, T)
    for j, s in enumerate(starts):
        C[j, s:s + block] = phi
    return C


def cmp_mask(T, block, stride=None):
    """(T, nb) bool: compression block j is visible to query t iff it ends at or before t."""
    ends = block_starts(T, block, stride) + block - 1  # (nb,)
    return ends[None, :] <= np.arange(T)[:, None]  # (T, nb)


def selection_weights(T, block, stride):
    """M (nb, T // l): the paper's eq. 9 as a matrix, p_slc = p_cmp M, for compression blocks of
    l = block tokens at stride d and selection blocks of l tokens (r = l / d, d must divide l):
    M[i, j] = #{(m, n) : 0 <= m, n < r, r j − m − n = i} (the module docstring)."""
    if block % stride:
        raise ValueError(f"selection_weights: stride={stride} must divide block={block} (the "
                         f"paper's eq. 9 sums l / d compressed blocks per selection block)")
    r, nb = block // stride, len(block_starts(T, block, stride))
    k = r * np.arange(T // block)[None, :] - np.arange(nb)[:, None]  # (nb, T // l): r j − i
    return np.where((k >= 0) & (k <= 2 * r - 2), np.minimum(k + 1, 2 * r - 1 - k), 0)


def nsa_indices(q, k_cmp, block, n_select, window, stride=None):
    """The selected and window branches' key indices, (B, T, n·l) and (B, T, w), -1 padded.

    Importance of block j for query t: Σ_h softmax over the visible compressed blocks of
    q_t · K̃_j / √Dh (the compressed branch's attention, §3.3.2), mapped onto the l-token
    selection blocks by eq. 9 (selection_weights) when the compression blocks overlap
    (stride d < l; d must divide l).
    Query t keeps its own block and the n − 1 most important complete blocks before it
    (fewer when fewer exist).
    """
    if stride is not None and block % stride:
        raise ValueError(f"nsa_indices: stride={stride} must divide block={block} (the "
                         f"selection's eq. 9)")
    B, H, T, Dh = q.shape
    G = H // k_cmp.shape[1]
    vis = cmp_mask(T, block, stride)  # (T, nb)
    s = np.einsum("bhtd,bhjd->bhtj", q, np.repeat(k_cmp, G, axis=1)) * Dh ** -0.5  # (B,H,T,nb)
    p = softmax_forward(np.where(vis, s, -np.inf))[0]  # (B, H, T, nb)
    p = np.nan_to_num(p).sum(axis=1)  # (B, T, nb) importance, summed over heads
    if stride is not None and stride != block:
        p = p @ selection_weights(T, block, stride)  # (B, T, T // l) eq. 9
        vis = cmp_mask(T, block)  # (T, T // l) the selection blocks that have ended
    nb = p.shape[-1]
    t = np.arange(T)
    own = t // block  # (T,)
    p = np.where(vis & (np.arange(nb)[None, :] != own[:, None]), p, -np.inf)  # (B, T, nb)
    top = np.argsort(-p, axis=-1, kind="stable")[..., :n_select - 1]  # (B, T, n-1)
    ok = np.take_along_axis(p, top, -1) > -np.inf  # (B, T, n-1)
    blocks = np.concatenate([np.broadcast_to(own[None, :, None], (B, T, 1)),
                             np.where(ok, top, -1)], axis=-1)  # (B, T, n) -1 = none
    tok = blocks[..., None] * block + np.arange(block)  # (B, T, n, l)
    tok = np.where((blocks[..., None] >= 0) & (tok <= t[None, :, None, None]), tok, -1)
    slc = np.sort(tok.reshape(B, T, -1), axis=-1)  # (B, T, n l), -1 first
    win = t[:, None] - window + 1 + np.arange(window)  # (T, w)
    win = np.broadcast_to(np.where(win >= 0, win, -1), (B, T, window)).copy()  # (B, T, w)
    return slc, win


def _branches_inputs(fn, q, k, v, phi, gates, block, n_select, window):
    _check(fn, q, k, v, phi, gates, block, n_select, window)
    C = compress_matrix(phi, q.shape[2])  # (nb, T)
    k_cmp = np.einsum("jt,bhtd->bhjd", C, k)  # (B, Hkv, nb, Dh)
    v_cmp = np.einsum("jt,bhtd->bhjd", C, v)  # (B, Hkv, nb, Dh)
    slc, win = nsa_indices(q, k_cmp, block, n_select, window)
    return k_cmp, v_cmp, slc, win


def _gated(gates, outs):
    g, g_cache = sigmoid_forward(gates)  # (B, H, T, 3)
    return sum(g[..., c, None] * o for c, o in enumerate(outs)), (g, g_cache)


def nsa_branches(q, k, v, cmp, gates, idx):
    """The three branches on given compressed tokens, gated: cmp (k_cmp, v_cmp, visibility
    (T, nb)), idx (selected, window) key indices. Returns (o, outs, gates, caches)."""
    k_cmp, v_cmp, vis = cmp
    o_cmp, c_cmp = sdpa_forward(q, k_cmp, v_cmp, Mask(array=vis))  # (B, H, T, Dh)
    o_slc, c_slc = topk_sparse_attention_forward(q, k, v, idx[0])  # (B, H, T, Dh)
    o_win, c_win = topk_sparse_attention_forward(q, k, v, idx[1])  # (B, H, T, Dh)
    outs = (o_cmp, o_slc, o_win)
    o, g = _gated(gates, outs)
    return o, outs, g, (c_cmp, c_slc, c_win)


def nsa_branches_grads(do, outs, g, caches):
    """Reverse of nsa_branches: {q, k, v (the selected and window branches'), k_cmp,
    v_cmp, gates}."""
    (g, g_cache), (c_cmp, c_slc, c_win) = g, caches
    # fwd: o = Σ_c σ(g_c) o_c
    dg = np.stack([np.sum(do * o, axis=-1) for o in outs], axis=-1)  # (B, H, T, 3)
    d_gates = sigmoid_backward(dg, g_cache)["x"]
    g_cmp = sdpa_backward(g[..., 0, None] * do, c_cmp)
    g_slc = topk_sparse_attention_backward(g[..., 1, None] * do, c_slc)
    g_win = topk_sparse_attention_backward(g[..., 2, None] * do, c_win)
    return {"q": g_cmp["q"] + g_slc["q"] + g_win["q"], "k": g_slc["k"] + g_win["k"],
            "v": g_slc["v"] + g_win["v"], "k_cmp": g_cmp["k"], "v_cmp": g_cmp["v"],
            "gates": d_gates}


def nsa_forward(q, k, v, phi, gates, *, block, n_select, window):
    """Native sparse attention: compressed + selected + sliding-window branches, gated.

    Inputs:  q (B, H, T, Dh); k, v (B, Hkv, T, Dh); phi (block,) the compression weights;
             gates (B, H, T, 3) gate logits; block l; n_select n blocks per query (its own
             included); window w.
    Returns: o (B, H, T, Dh).  Cache: NSACache (k, v, φ, the three branch outputs and caches,
             the gates).
    """
    q, k, v, phi, gates = common_float(q, k, v, phi, gates)
    k_cmp, v_cmp, slc, win = _branches_inputs("nsa", q, k, v, phi, gates, block, n_select,
                                              window)
    o, outs, g, caches = nsa_branches(
        q, k, v, (k_cmp, v_cmp, cmp_mask(q.shape[2], block)), gates, (slc, win))
    return o, NSACache(k, v, phi, outs, g, caches)


def nsa_forward_ref(q, k, v, phi, gates, *, block, n_select, window):
    """The masked dense reference: the same selection, each branch as sdpa under its (T, T)
    boolean mask (compressed: over the nb compressed tokens). Forward only: (o, None)."""
    k_cmp, v_cmp, slc, win = _branches_inputs("nsa_ref", q, k, v, phi, gates, block,
                                              n_select, window)
    B, T = q.shape[0], q.shape[2]
    return nsa_masked_dense(q, k, v, (k_cmp, v_cmp, cmp_mask(T, block)), gates, (slc, win)), None


def nsa_masked_dense(q, k, v, cmp, gates, idx):
    """The gated branches as sdpa under dense masks: cmp (k_cmp, v_cmp, visibility (T, nb)),
    idx (selected, window) key indices, -1 padded, made (B, T, T) boolean masks. -> o."""
    B, T = q.shape[0], q.shape[2]
    outs = [sdpa_forward(q, cmp[0], cmp[1], Mask(array=cmp[2]))[0]]
    for ix in idx:
        dense = np.zeros((B, T, T + 1), bool)  # (B, T, T+1): column T takes the -1 padding
        np.put_along_axis(dense, np.where(ix < 0, T, ix), True, axis=-1)
        outs.append(sdpa_forward(q, k, v, Mask(array=dense[:, None, :, :T]))[0])
    return _gated(gates, outs)[0]


def _blocks(a, block):
    """(B, Hkv, T, Dh) -> (B, Hkv, nb, l, Dh): the complete blocks of l tokens."""
    nb = a.shape[2] // block
    return a[:, :, :nb * block].reshape(a.shape[:2] + (nb, block, a.shape[3]))


def nsa_backward(do, cache):
    """Math: the module docstring's Backward (the branches' backwards are those of sdpa and
    of the gathered sparse attention).  Returns {q, k, v, phi, gates}.
    Reference: Yuan et al. 2025 (arXiv 2502.11089) §3 (the forward)."""
    k, v, phi, outs, g, caches = cache
    expect_dout("nsa_backward", do, outs[0].shape, outs[0].dtype, name="do")
    gb = nsa_branches_grads(do, outs, g, caches)  # fwd: o = Σ_c σ(g_c) o_c
    C = compress_matrix(phi, k.shape[2])  # (nb, T)  fwd: K̃ = C k, Ṽ = C v
    dk = gb["k"] + np.einsum("jt,bhjd->bhtd", C, gb["k_cmp"])
    dv = gb["v"] + np.einsum("jt,bhjd->bhtd", C, gb["v_cmp"])
    dphi = (np.einsum("bhjd,bhjid->i", gb["k_cmp"], _blocks(k, phi.shape[0]))
            + np.einsum("bhjd,bhjid->i", gb["v_cmp"], _blocks(v, phi.shape[0])))  # (l,)
    return {"q": gb["q"], "k": dk, "v": dv, "phi": dphi, "gates": gb["gates"]}
