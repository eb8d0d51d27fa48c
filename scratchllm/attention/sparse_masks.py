"""Fixed sparse attention patterns and document masks, as boolean arrays (True = may attend)
that enter a layer as Mask(array=...):

- Sparse Transformer (Child et al. 2019, arXiv 1904.10509 §4.2), stride l, causal:
    strided   A_i = {j <= i : i - j < l}  ∪  {j <= i : (i - j) mod l = 0}
    fixed     A_i = {j <= i : floor(j / l) = floor(i / l)}  ∪  {j <= i : j mod l >= l - c}
  (the two heads' patterns as one union mask; with l ≈ sqrt(T) every token reaches every
  earlier one in two layers, at O(T sqrt T) cost instead of O(T^2)).
- BigBird (Zaheer et al. 2020, arXiv 2007.14062 §2, its block form, Appendix D): in blocks
  of b tokens, each query block sees a window of w blocks centred on itself, r random blocks
  (drawn from a seeded rng) and the g global blocks; the global blocks see everything.
  Bidirectional (an encoder), or causal on request.
- Document masking for packed sequences (Llama 3, arXiv 2407.21783 §3.2): several documents
  share one row of a batch; a token attends only to earlier tokens of its own document, and
  its position restarts at 0 at each document's start, so the packed row computes what
  each document alone would.  packed_mask joins it with a layer's own Mask (causal, a
  sliding window, or none): a window counts positions, and inside one document the packed
  row's distances are the document's own.
- mask_receptive_field: how many tokens each query can draw on after L layers of a mask: the
  boolean matrix power M^L (a path i -> j through L hops, each hop allowed by M).

Glossary: T time, l stride, c summary tokens per stride (fixed), b block, w window blocks,
r random blocks, g global blocks, L layers.
"""
import numpy as np

from scratchllm.attention.masks import mask_array
from scratchllm.core.validate import expect_instance, expect_int, expect_integer, expect_ndim
from scratchllm.specs import Mask


def _ij(T):
    return np.arange(T)[:, None], np.arange(T)[None, :]  # (T, 1), (1, T)


def strided_mask(T, stride):
    """(T, T) bool: Sparse Transformer's strided pattern (the previous `stride` tokens, and
    every stride-th token before them), causal."""
    expect_integer("strided_mask", "T", T, 0)
    expect_integer("strided_mask", "stride", stride, 1)
    i, j = _ij(T)
    return (j <= i) & ((i - j < stride) | ((i - j) % stride == 0))  # (T, T)


def fixed_mask(T, stride, n_summary=1):
    """(T, T) bool: Sparse Transformer's fixed pattern (the own stride-block, and the last
    n_summary tokens of every block: the "summary" cells), causal."""
    expect_integer("fixed_mask", "T", T, 0)
    expect_integer("fixed_mask", "stride", stride, 1)
    expect_integer("fixed_mask", "n_summary", n_summary, 1, stride)
    i, j = _ij(T)
    return (j <= i) & ((i // stride == j // stride) | (j % stride >= stride - n_summary))


def bigbird_mask(T, block, *, n_random, rng, n_window=3, n_global=1, causal=False):
    """(T, T) bool: BigBird's block pattern (window + random + global blocks).

    Inputs:  T a multiple of block; n_random r random key blocks per query block, drawn
             without replacement from the blocks outside its window and the globals, by
             `rng` (np.random.Generator: a seed fixes the pattern); n_window w (odd) blocks
             centred on the query's own; n_global g leading blocks that attend and are
             attended everywhere; causal keeps only j <= i (and draws random blocks from
             the past).
    Returns: (T, T) bool.
    """
    fn = "bigbird_mask"
    expect_integer(fn, "block", block, 1)
    expect_integer(fn, "T", T, block)
    if T % block:
        raise ValueError(f"{fn}: T={T} must be a multiple of block={block}")
    expect_integer(fn, "n_random", n_random, 0)
    expect_integer(fn, "n_window", n_window, 1)
    if n_window % 2 == 0:
        raise ValueError(f"{fn}: n_window={n_window} must be odd (centred on the own block)")
    expect_integer(fn, "n_global", n_global, 0)
    expect_instance(fn, "rng", rng, np.random.Generator)
    nb = T // block
    qb, kb = _ij(nb)
    blocks = (np.abs(qb - kb) <= n_window // 2) | (qb < n_global) | (kb < n_global)  # (nb, nb)
    if causal:
        blocks &= kb <= qb
    for q in range(n_global, nb):
        free = np.flatnonzero(~blocks[q] & ((kb[0] <= q) if causal else True))
        pick = rng.choice(free, size=min(n_random, free.size), replace=False)
        blocks[q, pick] = True
    mask = np.repeat(np.repeat(blocks, block, axis=0), block, axis=1)  # (T, T)
    if causal:
        i, j = _ij(T)
        mask &= j <= i
    return mask


def document_mask(doc_ids, causal=True):
    """Attention inside each packed document only (Llama 3's document masking).

    Inputs:  doc_ids (T,) or (B, T) ints, the document of each token (non-decreasing along
             a row is usual but not required: equal ids are one document).
    Returns: (T, T) or (B, 1, T, T) bool (one mask for all heads): same document, and
             j <= i when causal.  Pair with document_positions for RoPE.
    """
    doc_ids = np.asarray(doc_ids)
    expect_int("document_mask", "doc_ids", doc_ids)
    if doc_ids.ndim not in (1, 2):
        expect_ndim("document_mask", "doc_ids", doc_ids, 2, "(T,) or (B, T)")
    same = doc_ids[..., :, None] == doc_ids[..., None, :]  # (..., T, T)
    if causal:
        same &= np.tri(doc_ids.shape[-1], dtype=bool)
    return same if doc_ids.ndim == 1 else same[:, None]  # (T, T) | (B, 1, T, T)


def packed_mask(mask, doc_ids):
    """A layer's Mask restricted to each packed document: Mask(array=...) for a packed batch.

    Inputs:  mask the layer's Mask (plain causal, causal with a window, or causal=False) or
             None (everywhere); doc_ids (B, T) ints (document_mask's).
    Returns: Mask(array=(B, 1, T, T) bool): the layer's pattern AND the same document.
    A window W keeps i - j < W, which inside one document is the distance within it; chunks
    of C start at each document's first token (Llama 4's chunks of a left-padded row start
    at its first real token in transformers too: masking_utils.chunked_overlay); sinks
    (the row's first keys) and block patterns are not a document's own, so they are refused.
    """
    if mask is not None:
        expect_instance("packed_mask", "mask", mask, Mask)
    if mask is not None and (mask.n_sink or mask.block is not None or mask.array is not None):
        raise ValueError(f"packed_mask: mask={mask!r} keeps keys by their place in the row "
                         f"(sinks, blocks or an explicit array), not in a document; packing "
                         f"takes a causal mask, a sliding window or causal=False")
    doc_ids = np.asarray(doc_ids)
    expect_ndim("packed_mask", "doc_ids", doc_ids, 2, "(B, T)")
    causal = mask is not None and mask.causal
    docs = document_mask(doc_ids, causal=causal)  # (B, 1, T, T)
    if mask is not None and mask.chunk is not None:  # chunks from each document's start
        c = document_positions(doc_ids) // mask.chunk  # (B, T) each token's chunk
        return Mask(array=docs & (c[:, :, None] == c[:, None, :])[:, None])  # (B, 1, T, T)
    own = None if mask is None else mask_array(mask, doc_ids.shape[1], doc_ids.shape[1])
    return Mask(array=docs if own is None else docs & own)  # (B, 1, T, T)


def document_positions(doc_ids):
    """Positions that restart at 0 at the start of each document: (T,) or (B, T) ints.

    A token's position counts the tokens of its own document before it (each run of equal
    ids along a row is one document), so RoPE sees what each document alone would.
    """
    doc_ids = np.asarray(doc_ids)
    expect_int("document_positions", "doc_ids", doc_ids)
    rows = np.atleast_2d(doc_ids)  # (B, T)
    T = rows.shape[1]
    start = np.ones(rows.shape, dtype=bool)  # (B, T): a document starts here
    start[:, 1:] = rows[:, 1:] != rows[:, :-1]
    t = np.broadcast_to(np.arange(T), rows.shape)  # (B, T)
    first = np.maximum.accumulate(np.where(start, t, 0), axis=1)  # (B, T) its document's start
    return (t - first).reshape(doc_ids.shape)


def mask_receptive_field(mask, n_layers):
    """How many tokens each query can draw on after n_layers layers of `mask`.

    Inputs:  mask (T, T) bool (True = may attend; the diagonal should be set, so a token
             keeps its own information, as every causal pattern here does); n_layers L >= 1.
    Returns: (T,) ints, row sums of the boolean power M^L (j reaches i through L hops).
    """
    mask = np.asarray(mask)
    if mask.ndim != 2 or mask.shape[0] != mask.shape[1] or mask.dtype != bool:
        raise ValueError(f"mask_receptive_field: mask must be a square bool (T, T) array, "
                         f"got {mask.dtype} {mask.shape}")
    expect_integer("mask_receptive_field", "n_layers", n_layers, 1)
    m = mask.astype(np.int64)  # (T, T)
    reach = m
    for _ in range(n_layers - 1):
        reach = np.minimum(reach @ m, 1)  # (T, T) 0/1: keep the counts from growing
    return reach.sum(axis=1)
