"""Checkpoint conversion from multi-head to grouped-query attention (GQA's uptraining, Ainslie
et al. 2023, arXiv 2305.13245, section 2.1): the K and V projection heads of each group are
mean-pooled into one KV head, then the model is trained a little further.

Math (G = H / Hkv; query head h reads KV head h // G, as sdpa and gqa do):
    Wk_gqa[:, j] = (1/G) sum_{g < G} Wk_mha[:, j G + g],  j = 0 .. Hkv-1 (per Dh columns)
so KV head j pools the consecutive heads jG .. jG+G-1 (the repeat_interleave grouping of
HF repeat_kv), not heads j, j+Hkv, ... (a tile grouping, the classic mistake).

Glossary: D model width, H heads, Hkv KV heads, G = H / Hkv, Dh head dim.
"""
from scratchllm.core.validate import expect_ndim, expect_shape


def mha_to_gqa(wk, wv, n_heads, n_kv_heads):
    """Mean-pool MHA key/value projections (D, H*Dh) to GQA's (D, Hkv*Dh), by group.

    Returns: (wk, wv) of shape (D, Hkv*Dh); KV head j is the mean of heads jG .. jG+G-1.
    """
    if n_kv_heads < 1 or n_heads % n_kv_heads:
        raise ValueError(f"mha_to_gqa: n_heads={n_heads} must be a multiple of n_kv_heads="
                         f"{n_kv_heads} >= 1")
    out = []
    for name, w in (("wk", wk), ("wv", wv)):
        expect_ndim("mha_to_gqa", name, w, 2, "(D, H*Dh)")
        if w.shape[1] % n_heads:
            raise ValueError(f"mha_to_gqa: {name} has shape {w.shape}, expected (D, H*Dh) "
                             f"with H = {n_heads}")
        expect_shape("mha_to_gqa", name, w, wk.shape, "like wk")
        D, Dh = w.shape[0], w.shape[1] // n_heads
        G = n_heads // n_kv_heads
        pooled = w.reshape(D, n_kv_heads, G, Dh).mean(axis=2)  # (D, Hkv, Dh)
        out.append(pooled.reshape(D, n_kv_heads * Dh))  # (D, Hkv*Dh)
    return tuple(out)
