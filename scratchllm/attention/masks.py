"""Boolean attention masks, (Tq, Tk) with True = may attend: causal, sliding window (Mistral,
arXiv 2310.06825), attention sinks (StreamingLLM, arXiv 2309.17453), block-sparse, chunked; and
mask_array, which turns a Mask spec (scratchllm.specs: causal, window, n_sink, block,
n_global, or an explicit array) into the array sdpa applies. The fixed sparse patterns
(Sparse Transformer's strided and fixed, BigBird), document masking for packed sequences and
the receptive field after L layers are in sparse_masks.py; they enter a layer as
Mask(array=...). padding_mask: a batch's padded keys (transformers' attention_mask) masked
out of a layer's own Mask.

Positions: with Tq queries against Tk keys, query i sits at position i + Tk - Tq (the last Tq
of Tk tokens, as flash_sdpa aligns them); key j at position j.

Glossary: T time, Tq/Tk query/key lengths, W window, S sink tokens.
"""
import numpy as np

from scratchllm.core.validate import expect_integer, expect_ndim
from scratchllm.specs import Mask


def causal_mask(T):
    """(T, T) bool: query i may attend key j iff j <= i."""
    expect_integer("causal_mask", "T", T, 0)
    return np.tril(np.ones((T, T), dtype=bool))  # (T, T)


def sliding_window_mask(T, window):
    """(T, T) bool: causal, and only the last `window` keys (i - window < j <= i) (Mistral)."""
    expect_integer("sliding_window_mask", "T", T, 0)
    expect_integer("sliding_window_mask", "window", window, 1)  # 0 would mask every key
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j <= i) & (j > i - window)  # (T, T)


def attention_sink_mask(T, window, n_sink):
    """(T, T) bool: sliding window plus the first n_sink tokens (StreamingLLM, 2309.17453)."""
    expect_integer("attention_sink_mask", "T", T, 0)
    expect_integer("attention_sink_mask", "window", window, 1)
    expect_integer("attention_sink_mask", "n_sink", n_sink, 0)
    j = np.arange(T)[None, :]
    return sliding_window_mask(T, window) | ((j < n_sink) & causal_mask(T))  # (T, T)


def block_sparse_mask(T, block, global_tokens=0):
    """(T, T) bool, causal: own block and the previous block, plus the leading global tokens."""
    expect_integer("block_sparse_mask", "T", T, 0)
    expect_integer("block_sparse_mask", "block", block, 1)
    expect_integer("block_sparse_mask", "global_tokens", global_tokens, 0)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    local = (i // block - j // block) <= 1
    return (j <= i) & (local | (j < global_tokens))  # (T, T)


def chunked_causal_mask(T, chunk):
    """(T, T) bool: causal within chunks of `chunk` positions: j <= i and j // chunk ==
    i // chunk (chunked local attention: Llama 4's chunked_attention layers)."""
    expect_integer("chunked_causal_mask", "T", T, 0)
    expect_integer("chunked_causal_mask", "chunk", chunk, 1)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j <= i) & (j // chunk == i // chunk)  # (T, T)


def mask_array(mask, Tq, Tk, fn="mask_array"):
    """The boolean array a Mask stands for, True = may attend.

    Inputs:  mask a Mask or None; Tq, Tk the query and key lengths (Tq <= Tk for a causal
             pattern: query i sits at position i + Tk - Tq); fn the caller, named in errors.
    Returns: None when every query may attend every key (mask None, or Mask(causal=False));
             mask.array itself when the Mask holds one (broadcastable to (B, H, Tq, Tk));
             else the (Tq, Tk) rows of the named pattern over Tk positions, built by
             block_sparse_mask, chunked_causal_mask, attention_sink_mask,
             sliding_window_mask or causal_mask.
    """
    if mask is None:
        return None
    if not isinstance(mask, Mask):
        raise TypeError(f"{fn}: mask must be a Mask or None, got {type(mask).__name__}; an "
                        f"explicit boolean array goes in as Mask(array=...)")
    if mask.array is not None:
        return mask.array
    if not mask.causal:
        return None
    if Tk < Tq:
        raise ValueError(f"{fn}: a causal Mask places query i at position i + Tk - Tq, "
                         f"so it needs Tq <= Tk; got Tq={Tq}, Tk={Tk}")
    if mask.block is not None:
        full = block_sparse_mask(Tk, mask.block, mask.n_global)  # (Tk, Tk)
    elif mask.chunk is not None:
        full = chunked_causal_mask(Tk, mask.chunk)  # (Tk, Tk)
    elif mask.n_sink:
        full = attention_sink_mask(Tk, mask.window, mask.n_sink)  # (Tk, Tk)
    elif mask.window is not None:
        full = sliding_window_mask(Tk, mask.window)  # (Tk, Tk)
    else:
        full = causal_mask(Tk)  # (Tk, Tk)
    return full[Tk - Tq:]  # (Tq, Tk): the last Tq query positions


def padding_mask(attention_mask, mask=None, Tq=None, fn="padding_mask"):
    """A layer's Mask with a padded batch's keys masked out: Mask(array=...) for sdpa.

    Inputs:  attention_mask (B, Tk) ints or bools, 1/True = a real token, 0/False = padding
             (transformers' attention_mask); mask the layer's own Mask (None or
             Mask(causal=False): everywhere); Tq the query length (default Tk; a causal
             mask needs it); fn the caller, named in errors.
    Returns: Mask(array=keep) with keep (B, 1, 1, Tk) bool (every query reads the row's real
             keys), or (B, 1, Tq, Tk): that AND the layer's own pattern.
    A query row every key of which is padding gives zeros in sdpa (a row of only padding).
    """
    am = np.asarray(attention_mask)
    expect_ndim(fn, "attention_mask", am, 2, "(B, Tk)")
    if not (am.dtype == np.bool_ or np.issubdtype(am.dtype, np.integer)) or (
            am.size and not np.isin(am, (0, 1)).all()):
        raise ValueError(f"{fn}: attention_mask must hold 0/1 (or bool) values, 1 = a real "
                         f"token, got dtype {am.dtype} with values {np.unique(am)[:5]}")
    keep = am.astype(bool)[:, None, None, :]  # (B, 1, 1, Tk)
    own = mask_array(mask, am.shape[1] if Tq is None else Tq, am.shape[1], fn)
    return Mask(array=keep if own is None else keep & own)
