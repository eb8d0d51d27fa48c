"""One decode step for sequences at different positions in one batch: what continuous batching
needs, and what LM.decode (one position for the whole batch) does not give.

Row b holds lengths[b] = positions[b] tokens and feeds its next token at positions[b]:
    x_b = E[id_b] (* sqrt(D)) (+ P[positions[b]])
    per attention layer:  q_b, k_b, v_b = project(x_b) with RoPE at positions[b];
                          store k_b, v_b at slot positions[b] of sequence b in the cache;
                          read the batch's keys padded to max(positions) + 1 and attend row b
                          to its first positions[b] + 1 keys only (a (B, 1, 1, L) mask)
    the Block around each layer (norms, residuals, FFN) is the LM's own
So one call serves the whole running batch; each row's numbers are those of its own decode
(the padded keys get probability exactly 0).

Glossary: B rows, D model width, H heads, Hkv KV heads, Dh head dim, L longest row + 1.
"""
import numpy as np

from scratchllm.attention import (AttentionWeights, make_rope, merge_heads, project_qkv_forward,
                                  sdpa_forward, sinusoidal_positions)
from scratchllm.core.ops import linear_forward
from scratchllm.core.validate import expect_int, expect_shape
from scratchllm.serve.pool import attention_layers
from scratchllm.specs import Mask


def rows_supported(model):
    """Whether decode_rows serves this model: full causal GQA layers (attention_layers) whose
    RoPE, if any, does not depend on the length (dynamic NTK does: each row would need its own
    frequencies)."""
    attention_layers(model)
    for layer in model.layers:
        rope = layer.mixer.spec.rope
        if rope is not None and (rope.scaling or {}).get("rope_type") == "dynamic":
            return False
    return True


def _weights(attn):
    """An Attention Module's arrays as the pair's AttentionWeights (None for an option off)."""
    params = (getattr(attn, name) for name in AttentionWeights._fields)
    return AttentionWeights(*(None if p is None else p.data for p in params))


def _attend_rows(a, attn, cache, layer, seqs, positions):
    """a (B, D) normed inputs -> the attention output (B, D), storing each row's k, v."""
    spec, w = attn.spec, _weights(attn)
    rope = None
    if spec.rope is not None:
        rope = make_rope(spec.rope, attn.head_dim, positions[:, None])  # (B, 1) positions
    (q, k, v), _ = project_qkv_forward(a[:, None], w, spec=spec, rope=rope)  # (B, H|Hkv, 1, Dh)
    cache.write(layer, seqs, positions, k, v)
    K, V = cache.read(layer, seqs, positions + 1)  # (B, Hkv, L, Dh)
    keep = np.arange(K.shape[2])[None, :] <= positions[:, None]  # (B, L)
    o, _ = sdpa_forward(q, K, V, Mask(array=keep[:, None, None, :]), spec.scale,
                        sinks=w.sinks)  # (B, H, 1, Dh)
    y, _ = linear_forward(merge_heads(o), w.wo, w.bo)  # (B, 1, D)
    return y[:, 0]  # (B, D)


def decode_rows(model, ids_t, cache, seqs, positions):
    """One token per sequence at its own position: ids_t (B,) of sequences seqs (held in
    cache, a PagedCache or ContiguousCache, with room for one more token each) at positions
    (B,) ints (= the tokens each holds) -> logits (B, V); each sequence's cache grows by one."""
    ids_t, positions = np.asarray(ids_t), np.asarray(positions)
    expect_int("decode_rows", "ids_t", ids_t)
    expect_int("decode_rows", "positions", positions)
    expect_shape("decode_rows", "positions", positions, ids_t.shape, "(B,) like ids_t")
    cfg = model.cfg
    x, _ = model.embed.forward(ids_t[:, None])  # (B, 1, D)
    if cfg.embed_scale:
        x = x * np.asarray(cfg.d_model ** 0.5, x.dtype)  # (B, 1, D)
    if cfg.positions == "sinusoidal":
        table = sinusoidal_positions(int(positions.max()) + 1, cfg.d_model)  # (L, D)
        x = x + table[positions][:, None].astype(x.dtype)  # (B, 1, D)
    elif cfg.positions == "learned":
        x = x + model.pos.forward(positions[:, None])[0]  # (B, 1, D)
    x = x[:, 0]  # (B, D)
    for i, layer in enumerate(model.layers):
        def attend(a, layer=layer, i=i):
            return _attend_rows(a, layer.mixer, cache, i, seqs, positions), None
        x = layer._body(x, attend)[0]  # the Block's own residual body around the mixer
    h, _ = model.norm.forward(x)  # (B, D)
    return (model.embed.attend(h) if model.head is None else model.head.forward(h))[0]
