"""Context parallelism inside the model (ring attention, Liu et al. 2023, arXiv:2310.01889;
the zig-zag causal split of Megatron-LM's context parallelism and Llama 3's long-context
training, arXiv:2407.21783 §3.3.2): every sequence is split along T over the P ranks of a
context-parallel group, rank r holding the zig-zag chunks r and 2P-1-r of each sequence
(dist.ring_positions), so every rank has one early and one late chunk and the causal work is
equal.

    embedding, norms, FFNs, head, loss   per token: each rank runs them on its Tl = T/P tokens
    attention                            q, k, v of this rank's tokens (RoPE at their whole-
                                         sequence positions), then ring attention: the key/value
                                         blocks go around the ring, the softmax statistics
                                         merge online (dist/ring_attention.py), then wo
    loss                                 (1/P) sum_r CE_r, each CE_r the mean over rank r's
                                         tokens (equal counts, so it is the whole mean)
    gradients                            each rank's partial (its tokens), summed over the
                                         group after the backward (one bucketed all-reduce)

Every rank builds the whole model from the seed, and the weights stay replicated (the summed
gradients and the optimizer are the same on every rank): a checkpoint is a one-process one.

Glossary: B batch, T whole sequence, Tl = T/P this rank's tokens, D width, H heads, Hkv KV
heads, G = H / Hkv, Dh head width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.qkv import QKV, project_qkv_backward, project_qkv_forward
from scratchllm.attention.rope import make_rope
from scratchllm.attention.sdpa import (merge_heads, repeat_kv_backward, repeat_kv_forward,
                                       split_heads)
from scratchllm.core import fused
from scratchllm.core.nn import NO_DRAWS
from scratchllm.core.ops import linear_backward, linear_forward, linear_out
from scratchllm.core.validate import expect_dout, expect_linear, expect_ndim
from scratchllm.dist import (all_reduce_grads, bytes_per_step, ring_attention_backward,
                             ring_attention_forward, ring_positions)
from scratchllm.lm import LM
from scratchllm.lm.model import LossCache
from scratchllm.specs import AttentionSpec, FFNSpec, Mask


class CPAttentionCache(NamedTuple):
    qkv: tuple    # project_qkv_forward's QKVCache
    rep: tuple    # repeat_kv_forward's cache (G > 1), else None
    ring: tuple   # RingCache
    lin_o: tuple  # the output projection's cache


def cp_attention_forward(x, w, *, spec, group):
    """Grouped-query self-attention over the whole sequence, this rank holding the zig-zag
    chunks group.rank and 2P-1-group.rank of it: y = concat_h ring_sdpa(q_h, k, v) @ wo (+ bo).

    Inputs:  x (B, Tl, D) this rank's tokens; w an AttentionWeights (qkv.py; biases and a
             QK-norm as the spec says); spec an AttentionSpec with a plain causal (or full)
             mask and no position bias, sinks or soft-cap; group the context-parallel group.
    Returns: (y (B, Tl, D), CPAttentionCache). RoPE turns each token by its position in the
    whole sequence of T = P Tl tokens.
    """
    expect_ndim("cp_attention", "x", x, 3, "(B, Tl, D)")
    P, Tl = group.size, x.shape[1]
    pos = ring_positions(P * Tl, P, zigzag=True)[group.rank]  # (Tl,)
    rope = None if spec.rope is None else make_rope(spec.rope, spec.dh(x.shape[2]), pos,
                                                    seq_len=P * Tl)
    (q, k, v), c_qkv = project_qkv_forward(x, w, spec=spec, rope=rope,
                                           caller="cp_attention")  # (B, H|Hkv, Tl, Dh)
    rep, G = None, spec.n_heads // spec.n_kv_heads
    if G > 1:  # fwd: query head h reads KV head h // G
        k, rep = repeat_kv_forward(k, G)  # (B, H, Tl, Dh)
        v, _ = repeat_kv_forward(v, G)
    o, c_ring = ring_attention_forward(q, k, v, group=group, causal=spec.mask.causal,
                                       zigzag=True, scale=spec.scale)  # (B, H, Tl, Dh)
    D = x.shape[2]
    expect_linear("cp_attention", spec.n_heads * spec.dh(D), w.wo, w.bo, ("w.wo", "w.bo"),
                  d_out=D)
    y, lin_o = linear_forward(merge_heads(o), w.wo, w.bo)  # (B, Tl, D)
    return y, CPAttentionCache(c_qkv, rep, c_ring, lin_o)


def cp_attention_backward(dy, cache):
    """The reverse of cp_attention_forward through the pairs: the output linear, ring
    attention (dq at home; dk, dv around the ring and home again), the KV sharing (a sum over
    each group of G query heads) and the projections with RoPE.
    Returns {"x": dx (B, Tl, D), "w": AttentionWeights of gradients (None where w had None)}."""
    c_qkv, rep, c_ring, lin_o = cache
    expect_dout("cp_attention_backward", dy, *linear_out(lin_o), name="dy")
    g_o = linear_backward(dy, lin_o)  # fwd: y = merge_heads(o) @ wo + bo
    g = ring_attention_backward(split_heads(g_o["x"], c_qkv.n_heads), c_ring)  # fwd: o = ring
    dk, dv = g["k"], g["v"]  # (B, H, Tl, Dh)
    if rep is not None:  # fwd: k = repeat(k): sum over each group
        dk, dv = repeat_kv_backward(dk, rep)["kv"], repeat_kv_backward(dv, rep)["kv"]
    g_qkv = project_qkv_backward(QKV(g["q"], dk, dv), c_qkv)  # fwd: q, k, v = project(x)
    return {"x": g_qkv["x"], "w": g_qkv["w"]._replace(wo=g_o["W"], bo=g_o.get("b"))}


def check_context_parallel(cfg, P, seq_len=None):
    """ValueError naming what of cfg (and seq_len) context parallelism over P ranks does not
    cover: attention layers with a plain causal (or full) mask and no position bias, sinks,
    soft-cap or output gate; dense FFNs (an MoE's balance loss is per data shard, and a
    shard's tokens would be spread over the ranks); no MTP; T a multiple of 2P."""
    bad = []
    if cfg.mtp is not None:
        bad.append("MTP modules (they read the next tokens across the chunks)")
    for i, spec in enumerate(cfg.layers):
        m = spec.mixer
        if not isinstance(m, AttentionSpec):
            bad.append(f"layer {i}'s mixer {type(m).__name__} (ring attention replaces GQA "
                       f"attention only)")
        elif m.mask not in (Mask(), Mask(causal=False)) or m.position_bias is not None or \
                m.sinks or m.softcap is not None or m.output_gate:
            bad.append(f"layer {i}'s attention (a plain causal or full mask, no position "
                       f"bias, sinks, soft-cap or output gate)")
        if not isinstance(spec.ffn, FFNSpec):
            bad.append(f"layer {i}'s FFN {type(spec.ffn).__name__} (dense FFNs only: an MoE's "
                       f"balance loss is computed per data shard)")
    if seq_len is not None and seq_len % (2 * P):
        bad.append(f"--seq-len {seq_len} (the zig-zag split needs a multiple of 2 x {P})")
    if bad:
        raise ValueError(f"--cp {P}: context parallelism does not cover {cfg.name}'s "
                         f"{'; '.join(bad)}")


class ContextParallelLM(LM):
    """This rank's share of an LM of cfg over a context-parallel group: every weight, the
    zig-zag chunks group.rank and 2P-1-group.rank of every sequence. loss, loss_backward and
    cross_entropy take the whole (B, T) ids and targets, as LM's; the loss is the whole
    sequence's mean on every rank, and after loss_backward every rank holds the whole
    gradient."""

    serial_shards = True  # data-parallel threads run their shards one at a time (parallel.py)

    def __init__(self, cfg, group, *, rng, dtype=np.float32):
        check_context_parallel(cfg, group.size)
        super().__init__(cfg, rng=rng, dtype=dtype)
        self.group, self.twin_groups = group, []
        for layer in self.layers:
            self._ring(layer.mixer)

    def _ring(self, mixer):
        """mixer.forward / backward become cp_attention_forward / _backward (instance
        attributes: the Module and its Param names stay the one-process LM's)."""
        def forward(x, positions=None, mask=None):
            if positions is not None or mask is not None:
                raise ValueError("context parallel: positions and masks come from the zig-zag "
                                 "split (no packed documents)")
            return cp_attention_forward(x, mixer._weights(), spec=mixer.spec, group=self.group)

        def backward(dy, cache):
            g = cp_attention_backward(dy, cache)
            return mixer.add_grads(dict(g["w"]._asdict(), x=g["x"]))

        mixer.forward, mixer.backward = forward, backward

    def _mine(self, ids, doc_ids):
        """(this rank's token positions (Tl,), ids[:, positions]) for whole ids (B, T)."""
        if doc_ids is not None:
            raise ValueError("context parallel (--cp) with packed documents (--pack-documents) "
                             "is not available: train one or the other")
        self._check_ids("ContextParallelLM", "ids", ids)
        check_context_parallel(self.cfg, self.group.size, ids.shape[1])
        pos = ring_positions(ids.shape[1], self.group.size, zigzag=True)[self.group.rank]
        return pos, ids[:, pos]

    def forward(self, ids=None, *, input_ids=None, doc_ids=None):
        raise TypeError("ContextParallelLM.forward: a rank holds a share of each sequence; "
                        "train with loss / loss_backward, and run the whole model from its "
                        "checkpoint (train.checkpoint.load_model)")

    def _local_logits(self, ids, doc_ids):
        pos, mine = self._mine(ids, doc_ids)
        x, c_emb = self._embed_forward(mine, positions=np.broadcast_to(pos, mine.shape))
        logits, cache = self.trunk_forward(x)  # (B, Tl, V)
        return pos, logits, cache._replace(embed=c_emb)

    def loss(self, ids, targets, doc_ids=None):
        """The whole sequences' mean cross-entropy (on every rank; collective)."""
        pos, logits, cache = self._local_logits(ids, doc_ids)
        ce, c_ce = fused.CROSS_ENTROPY.forward(logits, targets[:, pos])  # this rank's mean
        ce = self.group.sum_scalar(ce) / self.group.size
        return np.asarray(ce, self.dtype), LossCache(cache, c_ce, float(ce), 0.0)

    def loss_backward(self, dloss, cache):
        """fwd: loss = (1/P) sum_r CE_r: this rank's part, then the gradients summed over the
        group (every rank's tokens reach every weight)."""
        d = np.asarray(dloss / self.group.size, self.dtype)
        dlogits = fused.CROSS_ENTROPY.backward(d, cache.ce_cache)["logits"]
        self.backward(dlogits, cache.lm)
        all_reduce_grads(self.parameters(), self.group)

    def cross_entropy(self, ids, targets, doc_ids=None):
        pos, logits, _ = self._local_logits(ids, doc_ids)
        ce = fused.CROSS_ENTROPY.forward(logits, targets[:, pos])[0]
        return self.group.sum_scalar(ce) / self.group.size

    def replica(self):
        """A data-parallel thread's twin: the same Params' data (its own .grad; its
        gradients all-reduced over the group by its own loss_backward) and its ring on a
        twin of the group (Group.twin: each thread's messages apart); collective, made in
        the same order on every rank."""
        twin = ContextParallelLM(self.cfg, self.group.twin(), rng=NO_DRAWS, dtype=self.dtype)
        for p, q in zip(self.parameters(), twin.parameters()):
            q.data = p.data
        self.twin_groups.append(twin.group)  # (not the twin: a Module in a list attribute
        return twin                          # would join this model's Params)

    def groups(self):
        """This model's context-parallel group and its threads' twins' (for the bytes sent)."""
        return [self.group] + self.twin_groups

    def bytes_per_step(self, batch, seq_len):
        """{collective: bytes this rank sends over the group in one step on `batch` sequences
        of seq_len}: per attention layer the ring's k and v blocks (B, H, Tl, Dh), P - 1
        moves forward, and backward P moves of dk, dv plus P - 1 of k, v; then the
        gradients' bucketed all-reduce."""
        P = self.group.size
        if P == 1:
            return {}
        item, ring = self.dtype.itemsize, 0
        for spec in self.cfg.layers:
            block = batch * spec.mixer.n_heads * (seq_len // P) * \
                spec.mixer.dh(self.cfg.d_model) * item
            ring += (2 * (P - 1) + 2 * P + 2 * (P - 1)) * block
        out = {"ring_shift": ring}
        out.update(bytes_per_step([p.data.nbytes for p in self.parameters()], P))
        return out
