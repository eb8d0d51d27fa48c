"""One vector per sequence from an encoder's hidden states, and the heads on it: sentence
embeddings, sequence classifiers and cross-encoder rerankers.

    mean   e_b = Σ_t m_bt h_bt / Σ_t m_bt     (mean over the real tokens, m the padding mask:
                                            Sentence-BERT, Reimers & Gurevych 2019,
                                            arXiv 1908.10084)
    cls    e_b = h_b0                       (the first token, BERT's [CLS]: Devlin et al.
                                            2018, arXiv 1810.04805)
    head   logits = e W + b                 (B, C): a sequence classifier with C classes;
                                            C = 1 is a cross-encoder reranker's relevance
                                            score of a (query, document) pair, trained over
                                            each query's candidates by softmax cross-entropy
                                            (Nogueira & Cho 2019, arXiv 1901.04085)
Backward:  mean: dh_bt = m_bt de_b / Σ_t m_bt;  cls: dh_b0 = de_b, 0 at t > 0;
           head: the linear pair's, then the pooling's.

Glossary: B batch, T time, D width, C classes.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.ops import linear_backward, linear_forward, linear_out
from scratchllm.core.validate import (common_float, expect_dout, expect_float, expect_instance,
                                      expect_linear, expect_shape)

POOLINGS = ("mean", "cls")


class PoolingCache(NamedTuple):
    shape: tuple         # h's shape (B, T, D)
    dtype: object
    kind: str
    weights: np.ndarray  # (B, T, 1) m / Σ m for "mean", None for "cls"


def check_pool(fn, h, mask, kind):
    """pool_forward's inputs under the caller's name: h (B, T, D) float, kind one of POOLINGS,
    mask None or bool (B, T) with a token in every row ("cls" takes none). Returns the mask
    as a (B, T) bool array (all True for None), or None for "cls"."""
    expect_float(fn, "h", h)
    expect_shape(fn, "h", h, (None, None, None), "(B, T, D)")
    if kind not in POOLINGS:
        raise ValueError(f"{fn}: kind must be one of {POOLINGS}, got {kind!r}")
    if kind == "cls":
        if mask is not None:
            raise ValueError(f"{fn}: kind='cls' reads the first token only; a mask would be "
                             f"ignored")
        return None
    m = np.ones(h.shape[:2], bool) if mask is None else np.asarray(mask)  # (B, T)
    if m.shape != h.shape[:2] or m.dtype != bool:
        raise ValueError(f"{fn}: mask must be bool of shape {h.shape[:2]}, got {m.dtype} "
                         f"{m.shape}")
    empty = np.nonzero(m.sum(axis=1) == 0)[0]
    if empty.size:
        raise ValueError(f"{fn}: rows {empty.tolist()} have no token in mask: their mean is "
                         f"undefined")
    return m


def pool_forward(h, mask=None, *, kind="mean"):
    """h (B, T, D) -> e (B, D): the masked mean over tokens ("mean") or the first token
    ("cls"). mask (B, T) bool, True for real tokens (None: all; "cls" takes no mask). A row
    without tokens is an error (its mean would be 0/0)."""
    m = check_pool("pool_forward", h, mask, kind)  # (B, T) bool, or None for "cls"
    if kind == "cls":
        return h[:, 0], PoolingCache(h.shape, h.dtype, kind, None)  # (B, D)
    n = m.sum(axis=1, keepdims=True)  # (B, 1)
    wts = (m / n)[..., None].astype(h.dtype)  # (B, T, 1)
    return (wts * h).sum(axis=1), PoolingCache(h.shape, h.dtype, kind, wts)  # (B, D)


def pool_backward(de, cache):
    """Math: the module docstring's Backward.  Returns {"h": dh}."""
    shape, dtype, kind, wts = cache
    expect_dout("pool_backward", de, (shape[0], shape[2]), dtype, name="de")
    if kind == "cls":
        dh = np.zeros(shape, dtype)  # (B, T, D)
        dh[:, 0] = de  # fwd: e = h[:, 0]
        return {"h": dh}
    return {"h": wts * de[:, None, :]}  # fwd: e = Σ_t w_t h_t  -> dh_t = w_t de


class HeadWeights(NamedTuple):
    W: np.ndarray  # (D, C)
    b: np.ndarray  # (C,) or None


class SequenceHeadCache(NamedTuple):
    pool: PoolingCache
    linear: tuple


def sequence_head_forward(h, w, mask=None, *, kind="cls"):
    """logits = pool(h) W + b: h (B, T, D), w HeadWeights -> (B, C) (C = 1: a reranker's
    score). mask and kind as pool_forward's."""
    fn = "sequence_head_forward"
    expect_instance(fn, "w", w, HeadWeights)
    h, w = common_float(h, w)
    check_pool(fn, h, mask, kind)
    expect_float(fn, "W", w.W)
    expect_linear(fn, h.shape[2], w.W, w.b)
    e, c_pool = pool_forward(h, mask, kind=kind)  # (B, D)
    logits, c_lin = linear_forward(e, w.W, w.b)  # (B, C)
    return logits, SequenceHeadCache(c_pool, c_lin)


def sequence_head_backward(dlogits, cache):
    """The linear pair's backward, then the pooling's.  Returns {"h", "w": HeadWeights}."""
    expect_dout("sequence_head_backward", dlogits, *linear_out(cache.linear), name="dlogits")
    g = linear_backward(dlogits, cache.linear)  # fwd: logits = e W + b
    dh = pool_backward(g["x"], cache.pool)["h"]  # fwd: e = pool(h)
    return {"h": dh, "w": HeadWeights(g["W"], g.get("b"))}
