"""The contrastive (InfoNCE) loss with in-batch negatives (van den Oord et al. 2018,
arXiv 1807.03748; as used for embedding models, e.g. SimCSE arXiv 2104.08821 and CLIP
arXiv 2103.00020 for the symmetric form).

Row i of q is a query and row i of k its positive; the other B − 1 rows of k are its
negatives, for free:
    S = q kᵀ / τ                 (B, B) similarities over temperature
    L = mean_i CE(S_i, i)        = −(1/B) Σ_i log softmax(S_i)_i
    symmetric (CLIP): L = (CE over rows + CE over columns) / 2
Backward (the cross-entropy pair, then the matmul):
    dS = (softmax(S) − I) / B  (rows; columns add the same on Sᵀ)
    dq = dS k / τ,   dk = dSᵀ q / τ
Embeddings are usually L2-normalised first (then S is a cosine over τ): that is the caller's
step, so this pair stays one idea.

Glossary: B batch (query/positive pairs), D embedding width, τ temperature.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.ops import cross_entropy_backward, cross_entropy_forward
from scratchllm.core.validate import (expect_dout, expect_finite, expect_float, expect_shape)


class InfoNCECache(NamedTuple):
    q: np.ndarray
    k: np.ndarray
    temperature: float
    rows: object  # the cross-entropy cache over rows of S
    cols: object  # over columns (symmetric), or None


def info_nce_forward(q, k, *, temperature=0.05, symmetric=False):
    """InfoNCE with in-batch negatives: row i of k is the positive of row i of q.

    Inputs:  q, k (B, D) one float dtype; temperature τ > 0; symmetric: also the loss of k
             against q (CLIP), averaged.
    Returns: loss, 0-d array.  Cache: q, k, τ and the cross-entropy caches.
    """
    fn = "info_nce"
    expect_float(fn, "q", q)
    expect_shape(fn, "q", q, (None, None), "(B, D)")
    expect_shape(fn, "k", k, q.shape, "(B, D) like q")
    expect_float(fn, "k", k)
    expect_finite(fn, "temperature", temperature, 0, open_low=True)
    B = q.shape[0]
    S = q @ k.T / temperature  # (B, B)
    targets = np.arange(B)  # (B,) the diagonal
    loss, rows = cross_entropy_forward(S, targets)
    cols = None
    if symmetric:
        loss_t, cols = cross_entropy_forward(np.ascontiguousarray(S.T), targets)
        loss = np.asarray((loss + loss_t) / 2, dtype=q.dtype)
    return loss, InfoNCECache(q, k, temperature, rows, cols)


def info_nce_backward(dloss, cache):
    """Math: dS = (softmax(S) − I)/B by cross_entropy_backward (rows; for symmetric, half of
    each direction, the columns' gradient transposed back); S = q kᵀ/τ gives
    dq = dS k/τ, dk = dSᵀ q/τ.
    Reference: van den Oord et al. 2018 (arXiv 1807.03748) eq. (4); Radford et al. 2021
    (arXiv 2103.00020) Figure 3 (the symmetric loss).  Returns {q, k}."""
    q, k, temperature, rows, cols = cache
    expect_dout("info_nce_backward", dloss, (), q.dtype, name="dloss")
    half = 0.5 if cols is not None else 1.0
    dS = cross_entropy_backward(np.asarray(half * dloss, q.dtype), rows)["logits"]  # (B, B)
    if cols is not None:  # fwd: loss_t = CE(Sᵀ)
        dS = dS + cross_entropy_backward(np.asarray(half * dloss, q.dtype), cols)["logits"].T
    # fwd: S = q kᵀ / τ
    return {"q": dS @ k / temperature, "k": dS.T @ q / temperature}
