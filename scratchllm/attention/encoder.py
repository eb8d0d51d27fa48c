"""Bidirectional encoders and an encoder-decoder, from the same pairs as the decoder LM: an
encoder-only masked language model (BERT, Devlin et al. 2018, arXiv 1810.04805) and a small
sequence-to-sequence Transformer (Vaswani et al. 2017, arXiv 1706.03762) with cross-attention.

    encoder block:  h = x + attn(rmsnorm(x))  (no causal mask: every token sees every token)
                    y = h + swiglu(rmsnorm(h))
    decoder block:  h = x + self_attn(rmsnorm(x))  (causal)
                    c = h + cross_attn(rmsnorm(h), enc)   (queries from h, keys/values enc)
                    y = c + swiglu(rmsnorm(c))
    MLM:   15% of the tokens are chosen; of those 80% become [MASK], 10% a random token,
           10% stay; the loss is the cross-entropy at the chosen positions only (BERT 3.1).
Backward: each block calls its Modules' backwards; the decoder's cross-attentions each send
a gradient to the encoder output, summed over the decoder blocks.

Glossary: B batch, Ts/Tt source/target lengths, D model width, V vocabulary, L layers.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.cross import CrossAttention
from scratchllm.attention.gqa import Attention
from scratchllm.core import ops
from scratchllm.core.nn import Embedding, Linear, Module, RMSNorm, SwiGLU
from scratchllm.specs import AttentionSpec, Mask


def mlm_corrupt(ids, rng, *, mask_id, vocab_size, rate=0.15):
    """BERT's masking: (inputs, targets), targets = ids at the chosen positions, -100 (ignored
    by cross_entropy) elsewhere; chosen: 80% -> mask_id, 10% -> a random id, 10% unchanged."""
    chosen = rng.random(ids.shape) < rate  # (B, T)
    roll = rng.random(ids.shape)  # (B, T)
    inputs = np.where(chosen & (roll < 0.8), mask_id, ids)  # (B, T)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)  # (B, T)
    inputs = np.where(swap, rng.integers(0, vocab_size, ids.shape), inputs)  # (B, T)
    return inputs, np.where(chosen, ids, -100)  # (B, T) each


class EncoderBlockCache(NamedTuple):
    norm1: tuple
    attn: tuple
    norm2: tuple
    ffn: tuple


class DecoderBlockCache(NamedTuple):
    self_block: EncoderBlockCache
    norm_c: tuple
    cross: tuple


class MLMCache(NamedTuple):
    embed: tuple
    blocks: list
    norm: tuple
    head: tuple
    ce: tuple


class EncoderBlock(Module):
    """Pre-norm block with bidirectional (unmasked) GQA self-attention and RoPE."""

    def __init__(self, d_model, n_heads, d_ff, *, rng, dtype=np.float32, causal=False):
        self.norm1 = RMSNorm(d_model, dtype=dtype)
        self.attn = Attention(d_model, AttentionSpec(n_heads, n_heads, mask=Mask(causal=causal)),
                              rng=rng, dtype=dtype)
        self.norm2 = RMSNorm(d_model, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, rng=rng, dtype=dtype)

    def forward(self, x):
        a, c1 = self.norm1.forward(x)  # (B, T, D)
        m, ca = self.attn.forward(a)  # (B, T, D)
        b, c2 = self.norm2.forward(x + m)  # (B, T, D)
        f, cf = self.ffn.forward(b)  # (B, T, D)
        return x + m + f, EncoderBlockCache(c1, ca, c2, cf)

    def backward(self, dy, cache):
        c1, ca, c2, cf = cache
        dh = dy + self.norm2.backward(self.ffn.backward(dy, cf), c2)  # fwd: y = h + ffn(n(h))
        return dh + self.norm1.backward(self.attn.backward(dh, ca), c1)  # h = x + attn(n(x))


class DecoderBlock(Module):
    """Causal self-attention, then cross-attention to the encoder output, then SwiGLU."""

    def __init__(self, d_model, n_heads, d_ff, *, rng, dtype=np.float32):
        self.self_block = EncoderBlock(d_model, n_heads, d_ff, rng=rng, dtype=dtype,
                                       causal=True)
        self.norm_c = RMSNorm(d_model, dtype=dtype)
        self.cross = CrossAttention(d_model, AttentionSpec(n_heads, n_heads, rope=None,
                                                           mask=Mask(causal=False)),
                                    rng=rng, dtype=dtype)

    def forward(self, x, enc):
        """x (B, Tt, D), enc (B, Ts, D) -> (B, Tt, D): self block, then + cross(norm(.))."""
        h, cs = self.self_block.forward(x)  # (B, Tt, D)
        a, cn = self.norm_c.forward(h)  # (B, Tt, D)
        c, cc = self.cross.forward(a, enc)  # (B, Tt, D)
        return h + c, DecoderBlockCache(cs, cn, cc)

    def backward(self, dy, cache):
        """dy (B, Tt, D) -> {"x": dx, "enc": denc}, the gradients of forward's two inputs."""
        cs, cn, cc = cache
        g = self.cross.backward(dy, cc)  # fwd: y = h + cross(a, enc)
        dh = dy + self.norm_c.backward(g["x"], cn)  # fwd: a = norm_c(h)
        return {"x": self.self_block.backward(dh, cs), "enc": g["ctx"]}


def _stack_forward(blocks, x, *context):
    """x through each block in turn (with the encoder output as context for decoder
    blocks): (x, [cache per block])."""
    caches = []
    for blk in blocks:
        x, c = blk.forward(x, *context)  # (B, T, D)
        caches.append(c)
    return x, caches


class Seq2SeqCache(NamedTuple):
    src: tuple
    enc: list
    enc_norm: tuple
    tgt: tuple
    dec: list
    dec_norm: tuple
    head: tuple
    ce: tuple


class MaskedLM(Module):
    """Encoder-only masked language model: embed -> bidirectional blocks -> norm -> head."""

    def __init__(self, vocab_size, d_model, n_layers, n_heads, d_ff, *, rng, dtype=np.float32):
        self.embed = Embedding(vocab_size, d_model, rng=rng, dtype=dtype)
        self.blocks = [EncoderBlock(d_model, n_heads, d_ff, rng=rng, dtype=dtype)
                       for _ in range(n_layers)]
        self.norm = RMSNorm(d_model, dtype=dtype)
        self.head = Linear(d_model, vocab_size, rng=rng, dtype=dtype)

    def loss(self, inputs, targets):
        """Mean cross-entropy over the positions whose target is not -100: (loss, cache)."""
        x, ce_emb = self.embed.forward(inputs)  # (B, T, D)
        x, caches = _stack_forward(self.blocks, x)  # (B, T, D)
        h, cn = self.norm.forward(x)  # (B, T, D)
        logits, ch = self.head.forward(h)  # (B, T, V)
        loss, cce = ops.cross_entropy_forward(logits, targets)
        return loss, MLMCache(ce_emb, caches, cn, ch, cce)

    def loss_backward(self, dloss, cache):
        ce_emb, caches, cn, ch, cce = cache
        dlogits = ops.cross_entropy_backward(np.asarray(dloss, self.head.W.data.dtype), cce)
        dx = self.norm.backward(self.head.backward(dlogits["logits"], ch), cn)
        for blk, c in zip(reversed(self.blocks), reversed(caches)):
            dx = blk.backward(dx, c)  # fwd: x = block(x)
        self.embed.backward(dx, ce_emb)


class EncoderDecoder(Module):
    """A small sequence-to-sequence Transformer: encoder over src, decoder over tgt_in."""

    def __init__(self, vocab_size, d_model, n_layers, n_heads, d_ff, *, rng, dtype=np.float32):
        self.src_embed = Embedding(vocab_size, d_model, rng=rng, dtype=dtype)
        self.encoder = [EncoderBlock(d_model, n_heads, d_ff, rng=rng, dtype=dtype)
                        for _ in range(n_layers)]
        self.enc_norm = RMSNorm(d_model, dtype=dtype)
        self.tgt_embed = Embedding(vocab_size, d_model, rng=rng, dtype=dtype)
        self.decoder = [DecoderBlock(d_model, n_heads, d_ff, rng=rng, dtype=dtype)
                        for _ in range(n_layers)]
        self.dec_norm = RMSNorm(d_model, dtype=dtype)
        self.head = Linear(d_model, vocab_size, rng=rng, dtype=dtype)

    def logits(self, src, tgt_in):
        """src (B, Ts), tgt_in (B, Tt) ints -> (logits (B, Tt, V), cache pieces)."""
        x, c_src = self.src_embed.forward(src)  # (B, Ts, D)
        x, enc_c = _stack_forward(self.encoder, x)  # (B, Ts, D)
        enc, c_en = self.enc_norm.forward(x)  # (B, Ts, D)
        y, c_tgt = self.tgt_embed.forward(tgt_in)  # (B, Tt, D)
        y, dec_c = _stack_forward(self.decoder, y, enc)  # (B, Tt, D)
        h, c_dn = self.dec_norm.forward(y)  # (B, Tt, D)
        logits, c_head = self.head.forward(h)  # (B, Tt, V)
        return logits, (c_src, enc_c, c_en, c_tgt, dec_c, c_dn, c_head)

    def loss(self, src, tgt_in, tgt_out):
        """Teacher-forced cross-entropy of tgt_out given src and tgt_in: (loss, cache)."""
        logits, parts = self.logits(src, tgt_in)
        loss, cce = ops.cross_entropy_forward(logits, tgt_out)
        return loss, Seq2SeqCache(*parts, cce)

    def loss_backward(self, dloss, cache):
        dlogits = ops.cross_entropy_backward(np.asarray(dloss, self.head.W.data.dtype), cache.ce)
        dy = self.dec_norm.backward(self.head.backward(dlogits["logits"], cache.head),
                                    cache.dec_norm)
        denc = 0
        for blk, c in zip(reversed(self.decoder), reversed(cache.dec)):
            g = blk.backward(dy, c)  # fwd: y = block(y, enc)
            dy, denc = g["x"], denc + g["enc"]  # every decoder block reads enc
        self.tgt_embed.backward(dy, cache.tgt)
        dx = self.enc_norm.backward(denc, cache.enc_norm)  # fwd: enc = enc_norm(x)
        for blk, c in zip(reversed(self.encoder), reversed(cache.enc)):
            dx = blk.backward(dx, c)
        self.src_embed.backward(dx, cache.src)

    def greedy(self, src, bos_id, length):
        """Greedy decoding of `length` tokens after bos_id: (B, length) ints."""
        out = np.full((src.shape[0], 1), bos_id)  # (B, 1)
        for _ in range(length):
            logits, _ = self.logits(src, out)  # (B, t, V)
            out = np.concatenate([out, logits[:, -1].argmax(-1)[:, None]], axis=1)
        return out[:, 1:]  # (B, length)
