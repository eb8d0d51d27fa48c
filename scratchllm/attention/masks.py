"""Boolean attention masks, (Tq, Tk) with True = may attend: causal, sliding window (Mistral,
arXiv 2310.06825), attention sinks (StreamingLLM, arXiv 2309.17453), block-sparse.

Glossary: T time, W window, S sink tokens.
"""
import numpy as np

from scratchllm.core.validate import expect_integer


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
