"""What a quantised KV cache costs in accuracy: the error of every attention layer's outputs,
and the perplexity of held-out text decoded token by token through the quantised cache.

    attention error of layer l   ||sdpa(q, K~, V~) - sdpa(q, K, V)|| / ||sdpa(q, K, V)||  (causal;
                                 q, K, V the layer's own from a float forward; K~ = deq(quant(K)))
                                 each query reads the keys a decoding step would read
    KV perplexity                exp of the mean next-token cross-entropy when every token is
                                 fed through LM.decode reading a PagedCache in kv_dtype (teacher
                                 forcing): the error compounds through the layers, as in serving
Reference: arXiv 2402.02750 (KV caches quantised per token).

Glossary: B windows, T tokens per window, H heads, Hkv KV heads, Dh head dim.
"""
import numpy as np

from scratchllm.attention import sdpa_forward
from scratchllm.core.validate import expect_int, expect_ndim
from scratchllm.serve.pool import PagedCache, attention_layers
from scratchllm.serve.quantize import quantize
from scratchllm.specs import Mask


def _round_trip(x, kv_dtype):
    """x (B, Hkv, T, Dh) as the cache returns it: one group per token per head."""
    return x if kv_dtype == "float32" else quantize(x, kv_dtype).dequantize()


def kv_attention_error(model, ids, kv_dtype):
    """Relative error of each attention layer's causal outputs when K and V are read back from
    a kv_dtype cache. ids (B, T) -> [error per layer] (0 for "float32")."""
    expect_int("kv_attention_error", "ids", ids)
    expect_ndim("kv_attention_error", "ids", ids, 2, "(B, T)")
    attention_layers(model)
    if any(layer.mixer.spec.impl != "sdpa" for layer in model.layers):
        raise ValueError("kv_attention_error: reads the sdpa kernel's cache; build the model "
                         "with attn_impl='sdpa'")
    _, cache = model.forward(ids)
    errors = []
    for layer, block in zip(model.layers, cache.blocks):
        c = block.mixer.inner  # the layer's GQACache
        spec = layer.mixer.spec
        B, Hkv, T, Dh = c.k.shape
        q = c.attend.q.reshape(B, spec.n_heads, T, Dh)  # (B, H, T, Dh) from the grouped rows
        o, _ = sdpa_forward(q, c.k, c.v, Mask(causal=True), c.attend.scale)  # (B, H, T, Dh)
        o_q, _ = sdpa_forward(q, _round_trip(c.k, kv_dtype), _round_trip(c.v, kv_dtype),
                              Mask(causal=True), c.attend.scale)  # (B, H, T, Dh)
        errors.append(float(np.linalg.norm(o_q - o) / np.linalg.norm(o)))
    return errors


def kv_cross_entropy(model, windows, kv_dtype, *, block_size=16):
    """Mean next-token cross-entropy (nats/token) of windows (B, T + 1) ids, every token fed
    through LM.decode on a PagedCache in kv_dtype (targets windows[:, 1:])."""
    expect_int("kv_cross_entropy", "windows", windows)
    expect_ndim("kv_cross_entropy", "windows", windows, 2, "(B, T + 1)")
    B, T = windows.shape[0], windows.shape[1] - 1
    per_seq = -(-T // block_size)
    cache = PagedCache(model, B * per_seq, block_size, kv_dtype)
    seqs = list(range(B))
    for s in seqs:
        cache.blocks.add(s, [0])  # one token: nothing cached to share
        cache.blocks.reserve(s, T)
    views = cache.views(seqs, 0)
    total = 0.0
    for t in range(T):
        logits = model.decode(windows[:, t], views, t).astype(np.float64)  # (B, V)
        z = logits - logits.max(axis=1, keepdims=True)  # (B, V)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))  # (B, V)
        total -= logp[np.arange(B), windows[:, t + 1]].sum()
    return total / (B * T)
