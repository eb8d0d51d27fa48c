"""Sequences at different positions in one call: what continuous batching needs. Decoding
(one token each, decode_rows) is the LM's own decode with one position per row on the
cache's views; forward_rows feeds t tokens per row (a prompt's rest after a prefix-cache hit,
the target's check of k drafted tokens), which LM.prefill (from position 0) does not.

forward_rows: row b holds starts[b] tokens and feeds t more at positions starts[b] ..
starts[b] + t - 1 (chunked prefill):
    x = E[ids] (* sqrt(D)) (+ P[positions])
    per attention layer:  q, k, v = project(x) with RoPE at each row's own positions;
                          store k, v at those slots of sequence b in the cache;
                          read the batch's keys padded to the longest row and attend query j
                          of row b to keys 0 .. starts[b] + j only (a (B, 1, t, L) mask)
    per MLA layer:        q_nope, q_pe, ckv, k_pe = mla_project(x) at the same positions;
                          store [ckv | k_pe] (the latent) at those slots; attend in the
                          absorbed form against the rows' latents under the same mask
                          (mla_latent_attention, what the MLA's own decode step runs)
    the Block around each layer (norms, residuals, FFN) is the LM's own (block_rows); the
    scores' and the logits' soft caps as the model's config says (LM.unembed)
So one call serves the whole batch; each row's numbers are those of its own forward (the
padded keys get probability exactly 0).

Glossary: B rows, t tokens per row, D model width, H heads, Hkv KV heads, Dh head dim,
L longest row, Dc KV latent, dr rope dim.
"""
import numpy as np

from scratchllm.attention import (MLA, AttentionWeights, MLAWeights, make_rope, merge_heads,
                                  mla_project_forward, output_gate_forward, project_qkv_forward,
                                  sdpa_forward, sinusoidal_positions)
from scratchllm.attention.mla import mla_latent_attention
from scratchllm.core.ops import linear_forward
from scratchllm.core.validate import expect_int, expect_shape
from scratchllm.serve.pool import PagedCache, cache_layers
from scratchllm.serve.views import KernelView
from scratchllm.specs import Mask


def rows_supported(model):
    """Whether decode_rows serves this model: full causal GQA or MLA layers (cache_layers)
    whose RoPE, if any, does not depend on the length (dynamic NTK does: each row would need
    its own frequencies)."""
    cache_layers(model)
    for layer in model.layers:
        rope = layer.mixer.spec.rope
        if rope is not None and (rope.scaling or {}).get("rope_type") == "dynamic":
            return False
    return True


def attention_weights(attn):
    """An Attention Module's arrays as the pair's AttentionWeights (None for an option off)."""
    params = (getattr(attn, name) for name in AttentionWeights._fields)
    return AttentionWeights(*(None if p is None else p.data for p in params))


def _store(cache, layer, seqs, starts, lengths, *streams):
    """Write each row's streams (B, heads, t, W) at its positions: all t tokens, or only the
    first lengths[b] of row b (a padded row's padding is never stored)."""
    if lengths is None:
        cache.write(layer, seqs, starts, *streams)
        return
    for b, n in enumerate(lengths):
        cache.write(layer, seqs[b:b + 1], starts[b:b + 1], *(x[b:b + 1, :, :n] for x in streams))


def _attend_rows_mla(a, mla, cache, layer, seqs, starts, lengths=None):
    """_attend_rows of an MLA layer: a (B, t, D) -> (B, t, D), storing each row's latents."""
    spec, w = mla.spec, mla_weights(mla)
    positions = starts[:, None] + np.arange(a.shape[1])  # (B, t)
    rope = make_rope(spec.rope, spec.qk_rope_head_dim, positions)
    (q_nope, q_pe, ckv, k_pe), _ = mla_project_forward(a, w, spec=spec, rope=rope)
    lat = np.concatenate([ckv, k_pe[:, 0]], axis=-1)[:, None]  # (B, 1, t, Dc+dr)
    _store(cache, layer, seqs, starts, lengths, lat)
    ends = starts + (a.shape[1] if lengths is None else np.asarray(lengths))  # (B,)
    (lats,) = cache.read(layer, seqs, ends)  # (B, 1, L, Dc+dr)
    keep = np.arange(lats.shape[2]) <= positions[:, :, None]  # (B, t, L) causal, own keys
    return mla_latent_attention(q_nope, q_pe, lats[:, 0], keep, w, spec)  # (B, t, D)


def _attend_rows(a, attn, cache, layer, seqs, starts, lengths=None):
    """a (B, t, D) normed inputs of tokens at starts[b] .. + t - 1 -> the attention output
    (B, t, D), storing each row's k, v (only its first lengths[b] with lengths: a padded
    row's padding is never stored)."""
    if isinstance(attn, MLA):
        return _attend_rows_mla(a, attn, cache, layer, seqs, starts, lengths)
    spec, w = attn.spec, attention_weights(attn)
    positions = starts[:, None] + np.arange(a.shape[1])  # (B, t)
    rope = None if spec.rope is None else make_rope(spec.rope, attn.head_dim, positions)
    (q, k, v), _ = project_qkv_forward(a, w, spec=spec, rope=rope)  # (B, H|Hkv, t, Dh)
    _store(cache, layer, seqs, starts, lengths, k, v)
    if lengths is None and _fused_decode(cache, a.shape[1]):  # the quantised pool in the kernel
        scale = attn.head_dim ** -0.5 if spec.scale is None else spec.scale
        view = KernelView(cache, layer, seqs, starts + 1)  # each row with its new token
        o = view.attend(q, scale, spec.softcap, w.sinks)  # (B, H, 1, Dh)
    else:
        K, V = cache.read(layer, seqs, starts + (a.shape[1] if lengths is None else
                                                 np.asarray(lengths)))  # (B, Hkv, L, Dh)
        keep = np.arange(K.shape[2]) <= positions[:, :, None]  # (B, t, L) causal, own keys
        o, _ = sdpa_forward(q, K, V, Mask(array=keep[:, None]), spec.scale, sinks=w.sinks,
                            softcap=spec.softcap)  # (B, H, t, Dh)
    o = merge_heads(o)  # (B, t, H*Dh)
    if spec.output_gate:  # gated attention (Qwen3-Next)
        o = output_gate_forward(a, o, w.wg, w.bg)[0]
    y, _ = linear_forward(o, w.wo, w.bo)  # (B, t, D)
    return y


def mla_weights(mla):
    """An MLA Module's arrays as the pairs' MLAWeights (None for the absent query form)."""
    params = (getattr(mla, name, None) for name in MLAWeights._fields)
    return MLAWeights(*(None if p is None else p.data for p in params))


def _fused_decode(cache, t):
    """Whether one token per row attends through qattention's kernel: on a quantised
    PagedCache made with kernel=True."""
    return t == 1 and isinstance(cache, PagedCache) and cache.kernel


def block_rows(block, i, x, cache, seqs, starts, lengths=None):
    """One Block on t tokens per sequence from its own position: x (B, t, D) -> (B, t, D),
    its attention reading and growing layer i of `cache` (the Block's own body around it);
    lengths (B,): each row's real tokens, the rest padding (not stored)."""
    def attend(a):
        return _attend_rows(a, block.mixer, cache, i, seqs, starts, lengths), None
    return block.body(x, attend)[0]


def forward_rows(model, ids, cache, seqs, starts):
    """t tokens per sequence, each sequence from its own position: ids (B, t) of sequences
    seqs (held in cache, a PagedCache or ContiguousCache, with room for t more tokens each)
    at positions starts[b] .. starts[b] + t - 1 (starts (B,) = the tokens each holds) ->
    logits (B, t, V); each sequence's cache grows by t (a prompt's rest after a prefix hit:
    chunked prefill)."""
    return model.unembed(trunk_rows(model, ids, cache, seqs, starts))  # (B, t, V)


def prefill_rows(model, prompts, cache, seqs, starts):
    """Batched prefill: several prompts of different lengths in one forward. prompts[b] (a
    list of ids) are sequence seqs[b]'s tokens at positions starts[b] .. (0 for a fresh
    prompt, the cached prefix's length after a prefix hit); the rows are right-padded to the
    longest, each row's queries attend only its own keys (causal: a real token never sees
    padding) and only real tokens are stored. Returns each row's last real token's logits
    (B, V): each row's numbers are those of its own forward (padding costs compute, nothing
    else; a capacity-limited MoE would let padding take expert slots: dropless only)."""
    n = np.array([len(p) for p in prompts])
    if len(prompts) == 0 or n.min() < 1:
        raise ValueError(f"prefill_rows: need one or more non-empty prompts, got lengths "
                         f"{n.tolist()}")
    ids = np.zeros((len(prompts), int(n.max())), np.int64)  # (B, t), padded with id 0
    for b, p in enumerate(prompts):
        ids[b, :len(p)] = p
    x = trunk_rows(model, ids, cache, seqs, starts, n)  # (B, t, D)
    return model.unembed(x[np.arange(len(prompts)), n - 1])  # (B, V)


def trunk_rows(model, ids, cache, seqs, starts, lengths=None):
    """forward_rows up to the last block: the hidden states x_L (B, t, D) before the final
    norm (what the head and the MTP modules read); lengths as block_rows'."""
    ids, starts = np.asarray(ids), np.asarray(starts)
    expect_int("forward_rows", "ids", ids)
    expect_int("forward_rows", "starts", starts)
    expect_shape("forward_rows", "starts", starts, ids.shape[:1], "(B,) for ids (B, t)")
    cfg = model.cfg
    positions = starts[:, None] + np.arange(ids.shape[1])  # (B, t)
    x, _ = model.embed.forward(ids)  # (B, t, D)
    if cfg.embed_scale:
        x = x * np.asarray(cfg.d_model ** 0.5, x.dtype)  # (B, t, D)
    if cfg.positions == "sinusoidal":
        table = sinusoidal_positions(int(positions.max()) + 1, cfg.d_model)  # (L, D)
        x = x + table[positions].astype(x.dtype)  # (B, t, D)
    elif cfg.positions == "learned":
        x = x + model.pos.forward(positions)[0]  # (B, t, D)
    for i, layer in enumerate(model.layers):
        x = block_rows(layer, i, x, cache, seqs, starts, lengths)  # (B, t, D)
    return x  # (B, t, D)


def decode_rows(model, ids_t, cache, seqs, positions):
    """One token per sequence at its own position: ids_t (B,) at positions (B,) ints (= the
    tokens each holds) -> logits (B, V): the LM's own decode with one position per row, on
    the cache's views (each row attends only its own keys: their key_mask; on a quantised
    PagedCache made with kernel=True its GQA layers read the codes in qattention's kernel,
    views.KernelView)."""
    positions = np.asarray(positions)
    expect_int("decode_rows", "positions", positions)
    return model.decode(np.asarray(ids_t), cache.views(seqs, positions), positions)  # (B, V)
