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

from scratchllm.core.ops import linear_backward, linear_forward
from scratchllm.core.validate import expect_dout, expect_float, expect_instance, expect_shape

POOLINGS = ("mean", "cls")


class PoolingCache(NamedTuple):
    shape: tuple         # h's shape (B, T, D)
    dtype: object
    kind: str
    weights: np.ndarray  # (B, T, 1) m / Σ m for "mean", None for "cls"


def pool_forward(h, mask=None, *, kind="mean"):
    """h (B, T, D) -> e (B, D): the masked mean over tokens ("mean") or the first token
    ("cls"). mask (B, T) bool, True for real tokens (None: all; "cls" takes no mask). A row
    without tokens is an error (its mean would be 0/0)."""
    fn = "pool_forward"
    expect_float(fn, "h", h)
    expect_shape(fn, "h", h, (None, None, None), "(B, T, D)")
    if kind not in POOLINGS:
        raise ValueError(f"{fn}: kind must be one of {POOLINGS}, got {kind!r}")
    if kind == "cls":
        if mask is not None:
            raise ValueError(f"{fn}: kind='cls' reads the first token only; a mask would be "
                             f"ignored")
        return h[:, 0], PoolingCache(h.shape, h.dtype, kind, None)  # (B, D)
    m = np.ones(h.shape[:2], bool) if mask is None else np.asarray(mask)  # (B, T)
    if m.shape != h.shape[:2] or m.dtype != bool:
        raise ValueError(f"{fn}: mask must be bool of shape {h.shape[:2]}, got {m.dtype} "
                         f"{m.shape}")
    n = m.sum(axis=1, keepdims=True)  # (B, 1)
    if (n == 0).any():
        raise ValueError(f"{fn}: rows {np.nonzero(n[:, 0] == 0)[0].tolist()} have no token "
                         f"in mask: their mean is undefined")
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
    expect_instance("sequence_head_forward", "w", w, HeadWeights)
    e, c_pool = pool_forward(h, mask, kind=kind)  # (B, D)
    logits, c_lin = linear_forward(e, w.W, w.b)  # (B, C)
    return logits, SequenceHeadCache(c_pool, c_lin)


def sequence_head_backward(dlogits, cache):
    """The linear pair's backward, then the pooling's.  Returns {"h", "w": HeadWeights}."""
    g = linear_backward(dlogits, cache.linear)  # fwd: logits = e W + b
    dh = pool_backward(g["x"], cache.pool)["h"]  # fwd: e = pool(h)
    return {"h": dh, "w": HeadWeights(g["W"], g.get("b"))}
