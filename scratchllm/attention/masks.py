"""Boolean attention masks, (Tq, Tk) with True = may attend: causal, sliding window (Mistral,
arXiv 2310.06825), attention sinks (StreamingLLM, arXiv 2309.17453), block-sparse.

Glossary: T time, W window, S sink tokens.
"""
import numpy as np


def causal_mask(T):
    """(T, T) bool: query i may attend key j iff j <= i."""
    return np.tril(np.ones((T, T), dtype=bool))  # (T, T)


def sliding_window_mask(T, window):
    """(T, T) bool: causal, and only the last `window` keys (i - window < j <= i) (Mistral)."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    return (j <= i) & (j > i - window)  # (T, T)


def attention_sink_mask(T, window, n_sink):
    """(T, T) bool: sliding window plus the first n_sink tokens (StreamingLLM, 2309.17453)."""
    j = np.arange(T)[None, :]
    return sliding_window_mask(T, window) | ((j < n_sink) & causal_mask(T))  # (T, T)


def block_sparse_mask(T, block, global_tokens=0):
    """(T, T) bool, causal: own block and the previous block, plus the leading global tokens."""
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    local = (i // block - j // block) <= 1
    return (j <= i) & (local | (j < global_tokens))  # (T, T)
