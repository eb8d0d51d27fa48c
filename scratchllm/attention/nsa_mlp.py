"""NSA's compression as the paper has it (Yuan et al. 2025, arXiv 2502.11089 §3.3.1, eq. 7):
overlapping blocks of l keys at stride d, each mapped to one key by a learnable MLP φ with an
intra-block position encoding,
    K̃_cmp = { φ(k_{i d} .. k_{i d + l − 1}) : 0 <= i <= (T − l) / d }
    φ(X) = gelu(vec(X + E) W1 + b1) W2 + b2,    X, E (l, Dh),  vec: (l, Dh) -> (l·Dh,)
one φ for the keys and one for the values, shared by the heads. nsa_mlp_forward runs NSA's
three gated branches (nsa.py: compressed, selected, sliding window) on these tokens, the
selection ranking the l-token blocks by the compressed attention summed as the paper's eq. 9
(nsa.py's selection_weights).

Backward: φ is core's gelu_mlp pair (linear, gelu, linear); dE = Σ over blocks of dX; the
blocks overlap when d < l, so dk_s = Σ over the blocks that hold token s of their row for s
(a scatter-add: the backward of the gather X = k[blocks]); then nsa.py's branch backwards.

Glossary: B batch, H query heads, Hkv KV heads, T time, Dh head dim, l block, d stride, nb
compressed blocks, F the MLP's hidden width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.nsa import (block_starts, cmp_mask, nsa_branches_grads,
                                      nsa_branches, nsa_masked_dense, nsa_indices)
from scratchllm.attention.sdpa import check_heads
from scratchllm.core.gelu import gelu_mlp_backward, gelu_mlp_forward
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_instance,
                                      expect_integer, expect_linear, expect_shape)
from scratchllm.specs import NSASpec


class CompressWeights(NamedTuple):
    """The compression MLP φ of one stream (keys or values)."""
    pos: np.ndarray  # (l, Dh) the intra-block position encoding E
    w1: np.ndarray   # (l·Dh, F)
    b1: np.ndarray   # (F,)
    w2: np.ndarray   # (F, Dh)
    b2: np.ndarray   # (Dh,)


class CompressCache(NamedTuple):
    idx: np.ndarray   # (nb, l) the token of each block row
    shape: tuple      # x's shape (B, Hkv, T, Dh)
    mlp: tuple        # gelu_mlp's cache


def check_compress(fn, w, block, Dh, prefix=""):
    """One compression MLP's CompressWeights under the caller's name `fn` (field names after
    `prefix`, "k_" or "v_" in NSAWeights): pos (block, Dh), w1 (block·Dh, F), b1 (F,),
    w2 (F, Dh), b2 (Dh,), all float."""
    for name, a in zip(CompressWeights._fields, w):
        expect_float(fn, prefix + name, a)
    expect_shape(fn, prefix + "pos", w.pos, (block, Dh), "(block, Dh)")
    expect_linear(fn, block * Dh, w.w1, w.b1, (prefix + "w1", prefix + "b1"))
    expect_linear(fn, w.w1.shape[1], w.w2, w.b2, (prefix + "w2", prefix + "b2"), d_out=Dh)


def nsa_compress_forward(x, w, *, block, stride):
    """φ on every complete block of l tokens at stride d.

    Inputs:  x (B, Hkv, T, Dh); w CompressWeights; block l; stride d (1 <= d <= l).
    Returns: (B, Hkv, nb, Dh), nb = (T − l) // d + 1.  Cache: the block rows, x's shape and
             the MLP's cache.
    """
    fn = "nsa_compress_forward"
    expect_instance(fn, "w", w, CompressWeights)
    x, w = common_float(x, w)
    expect_float(fn, "x", x)
    expect_shape(fn, "x", x, (None, None, None, None), "(B, Hkv, T, Dh)")
    B, Hkv, T, Dh = x.shape
    expect_integer(fn, "block", block, 1, T)
    expect_integer(fn, "stride", stride, 1, block)
    check_compress(fn, w, block, Dh)
    idx = block_starts(T, block, stride)[:, None] + np.arange(block)  # (nb, l)
    X = x[:, :, idx] + w.pos  # (B, Hkv, nb, l, Dh)
    Z = X.reshape(B, Hkv, len(idx), block * Dh)  # (B, Hkv, nb, l·Dh)
    y, c = gelu_mlp_forward(Z, w.w1, w.b1, w.w2, w.b2)  # (B, Hkv, nb, Dh)
    return y, CompressCache(idx, x.shape, c)


def nsa_compress_backward(dy, cache):
    """Math: the module docstring's Backward (gelu_mlp's backward, the position sum, the
    scatter-add over overlapping blocks).  Returns {"x": dx, "w": CompressWeights}."""
    idx, shape, c = cache
    B, Hkv, T, Dh = shape
    expect_dout("nsa_compress_backward", dy, (B, Hkv, len(idx), Dh), c.down.x.dtype, name="dy")
    g = gelu_mlp_backward(dy, c)  # fwd: y = φ(Z)
    dX = g["x"].reshape(B, Hkv, idx.shape[0], idx.shape[1], Dh)  # fwd: Z = vec(X + E)
    dx = np.zeros(shape, dy.dtype)  # (B, Hkv, T, Dh)
    np.add.at(dx, (slice(None), slice(None), idx), dX)  # fwd: X = x[blocks] (overlapping)
    return {"x": dx, "w": CompressWeights(dX.sum(axis=(0, 1, 2)), g["W1"], g["b1"], g["W2"],
                                          g["b2"])}


class NSAWeights(NamedTuple):
    """The two compression MLPs: the keys' (k_*) and the values' (v_*)."""
    k_pos: np.ndarray  # (l, Dh)
    k_w1: np.ndarray   # (l·Dh, F)
    k_b1: np.ndarray   # (F,)
    k_w2: np.ndarray   # (F, Dh)
    k_b2: np.ndarray   # (Dh,)
    v_pos: np.ndarray
    v_w1: np.ndarray
    v_b1: np.ndarray
    v_w2: np.ndarray
    v_b2: np.ndarray


class NSAMLPCache(NamedTuple):
    outs: tuple    # (o_cmp, o_slc, o_win), each (B, H, T, Dh)
    gates: tuple   # (sigmoid value, its cache)
    branches: tuple
    k_cmp: CompressCache
    v_cmp: CompressCache


def _inputs(fn, q, k, v, w, gates, spec):
    expect_instance(fn, "spec", spec, NSASpec)
    expect_instance(fn, "w", w, NSAWeights)
    B, H, T, Dh, Hkv, Tk = check_heads(fn, q, k, v)
    if Tk != T:
        raise ValueError(f"{fn}: k has {Tk} positions and q {T}; NSA here is self-attention")
    if spec.block > T:
        raise ValueError(f"{fn}: spec.block={spec.block} is longer than the T={T} tokens")
    expect_shape(fn, "v", v, (B, Hkv, T, Dh), "(B, Hkv, T, Dh) like k: one MLP compresses both")
    expect_float(fn, "gates", gates)
    expect_shape(fn, "gates", gates, (B, H, T, 3), "(B, H, T, 3) gate logits (cmp, slc, win)")
    wk, wv = CompressWeights(*w[:5]), CompressWeights(*w[5:])
    check_compress(fn, wk, spec.block, Dh, "k_")
    check_compress(fn, wv, spec.block, Dh, "v_")
    return wk, wv, spec.stride or spec.block


def nsa_mlp_forward(q, k, v, w, gates, *, spec):
    """Native sparse attention with the paper's MLP compression over overlapping blocks.

    Inputs:  q (B, H, T, Dh); k, v (B, Hkv, T, Dh); w NSAWeights (the two MLPs); gates
             (B, H, T, 3) gate logits; spec NSASpec(block, stride, n_select, window).
    Returns: o (B, H, T, Dh).  Cache: the branches' outputs and caches, the gates, the two
             compressions' caches.
    """
    q, k, v, w, gates = common_float(q, k, v, w, gates)
    wk, wv, stride = _inputs("nsa_mlp", q, k, v, w, gates, spec)
    k_cmp, c_k = nsa_compress_forward(k, wk, block=spec.block, stride=stride)  # (B,Hkv,nb,Dh)
    v_cmp, c_v = nsa_compress_forward(v, wv, block=spec.block, stride=stride)  # (B,Hkv,nb,Dh)
    idx = nsa_indices(q, k_cmp, spec.block, spec.n_select, spec.window, stride)
    vis = cmp_mask(q.shape[2], spec.block, stride)  # (T, nb)
    o, outs, g, caches = nsa_branches(q, k, v, (k_cmp, v_cmp, vis), gates, idx)
    return o, NSAMLPCache(outs, g, caches, c_k, c_v)


def nsa_mlp_backward(do, cache):
    """The branches' backward (nsa.py), then each compression's.  Returns {q, k, v, w
    (NSAWeights), gates}.  Reference: Yuan et al. 2025 (arXiv 2502.11089) §3 (the forward)."""
    outs, g, caches, c_k, c_v = cache
    expect_dout("nsa_mlp_backward", do, outs[0].shape, outs[0].dtype, name="do")
    gb = nsa_branches_grads(do, outs, g, caches)  # fwd: o = Σ_c σ(g_c) o_c
    gk = nsa_compress_backward(gb["k_cmp"], c_k)  # fwd: K̃ = φ_K(blocks of k)
    gv = nsa_compress_backward(gb["v_cmp"], c_v)  # fwd: Ṽ = φ_V(blocks of v)
    return {"q": gb["q"], "k": gb["k"] + gk["x"], "v": gb["v"] + gv["x"],
            "w": NSAWeights(*gk["w"], *gv["w"]), "gates": gb["gates"]}


def _phi_loop(x, w, block, stride):
    """φ block by block, the tanh GELU written out: (B, Hkv, nb, Dh)."""
    out = []
    for s in block_starts(x.shape[2], block, stride):
        z = (x[:, :, s:s + block] + w.pos).reshape(x.shape[0], x.shape[1], -1)  # (B, Hkv, l·Dh)
        h = z @ w.w1 + w.b1  # (B, Hkv, F)
        h = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h ** 3)))
        out.append(h @ w.w2 + w.b2)  # (B, Hkv, Dh)
    return np.stack(out, axis=2)


def nsa_mlp_forward_ref(q, k, v, w, gates, *, spec):
    """The reference: φ applied block by block in a loop, then each branch as sdpa under its
    dense (T, T) mask (nsa.py's nsa_masked_dense). Forward only: (o, None)."""
    q, k, v, w, gates = common_float(q, k, v, w, gates)
    wk, wv, stride = _inputs("nsa_mlp_ref", q, k, v, w, gates, spec)
    k_cmp, v_cmp = _phi_loop(k, wk, spec.block, stride), _phi_loop(v, wv, spec.block, stride)
    idx = nsa_indices(q, k_cmp, spec.block, spec.n_select, spec.window, stride)
    vis = cmp_mask(q.shape[2], spec.block, stride)  # (T, nb)
    return nsa_masked_dense(q, k, v, (k_cmp, v_cmp, vis), gates, idx), None
