"""Bidirectional encoders and an encoder-decoder, built from the decoder LM's Block: an
encoder-only masked language model (BERT, Devlin et al. 2018, arXiv 1810.04805) and a small
sequence-to-sequence Transformer (Vaswani et al. 2017, arXiv 1706.03762) with cross-attention.

The masked LM is the LM of a ModelConfig whose attention layers have Mask(causal=False)
(masked_lm_config gives a small pre-norm one; BERT's config, from hub/, is post-norm LayerNorm
blocks with learned positions, token types, a norm on the embeddings, no final norm and the MLM
head transform with an output bias: options of the ModelConfig that lm/model.py builds).

    encoder block:  h = x + attn(rmsnorm(x))   (Mask(causal=False): every token sees every one)
                    y = h + swiglu(rmsnorm(h))
    decoder block:  h = x + self_attn(rmsnorm(x))            (causal)
                    c = h + cross_attn(rmsnorm(h), enc)      (queries from h, keys/values enc)
                    y = c + swiglu(rmsnorm(c))
    MLM:   15% of the tokens are chosen; of those 80% become [MASK], 10% a random token,
           10% stay; the loss is the cross-entropy at the chosen positions only (BERT 3.1).
Backward: each Block runs its sub-layers in reverse; the decoder's cross-attentions each send
a gradient to the encoder output, summed over the decoder blocks.

Glossary: B batch, Ts/Tt source/target lengths, D model width, V vocabulary, L layers,
H heads, F FFN width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import ops
from scratchllm.core.nn import Embedding, Linear, Module
from scratchllm.core.validate import expect_int, expect_ndim
from scratchllm.lm.block import Block
from scratchllm.lm.mixers import make_norm
from scratchllm.lm.model import LM
from scratchllm.specs import AttentionSpec, FFNSpec, LayerSpec, Mask, ModelConfig, NormSpec


def mlm_corrupt(ids, rng, *, mask_id, vocab_size, rate=0.15):
    """BERT's masking: (inputs, targets), targets = ids at the chosen positions, -100 (ignored
    by cross_entropy) elsewhere; chosen: 80% -> mask_id, 10% -> a random id, 10% unchanged."""
    chosen = rng.random(ids.shape) < rate  # (B, T)
    roll = rng.random(ids.shape)  # (B, T)
    inputs = np.where(chosen & (roll < 0.8), mask_id, ids)  # (B, T)
    swap = chosen & (roll >= 0.8) & (roll < 0.9)  # (B, T)
    inputs = np.where(swap, rng.integers(0, vocab_size, ids.shape), inputs)  # (B, T)
    return inputs, np.where(chosen, ids, -100)  # (B, T) each


def encoder_layer(n_heads, d_ff, *, causal=False):
    """The LayerSpec of an encoder block: pre-norm RMSNorm, MHA with RoPE and no causal mask
    (causal=True: a decoder's self-attention block), SwiGLU of width d_ff."""
    return LayerSpec(AttentionSpec(n_heads, n_heads, mask=Mask(causal=causal)),
                     FFNSpec("swiglu", d_ff))


def cross_attention(n_heads):
    """The AttentionSpec of a decoder block's cross-attention: heads only (no RoPE, no mask)."""
    return AttentionSpec(n_heads, n_heads, rope=None, mask=Mask(causal=False))


def _stack_forward(blocks, x, *context):
    """x through each block in turn (with the encoder output as context for decoder
    blocks): (x, [cache per block])."""
    caches = []
    for blk in blocks:
        x, c = blk.forward(x, *context)  # (B, T, D)
        caches.append(c)
    return x, caches


def masked_lm_config(vocab_size, d_model, n_layers, n_heads, d_ff):
    """The ModelConfig of a small masked LM: n_layers encoder blocks (encoder_layer), a final
    RMSNorm and an untied head."""
    return ModelConfig("masked_lm", vocab_size, d_model,
                       (encoder_layer(n_heads, d_ff),) * n_layers)


class MaskedLM(LM):
    """An encoder-only masked language model: the LM of a config whose attention is
    bidirectional. forward takes BERT's inputs by their transformers names; the loss is LM's
    cross-entropy, whose targets are -100 (ignored) but at the chosen positions (mlm_corrupt).
    A bidirectional model has no token-by-token decoding."""

    def __init__(self, cfg, *, rng, dtype=np.float32):
        causal = [i for i, layer in enumerate(getattr(cfg, "layers", ()))
                  if isinstance(layer.mixer, AttentionSpec) and layer.mixer.mask.causal]
        if causal:
            raise ValueError(f"MaskedLM: layers {causal} have causal attention; a masked LM "
                             f"attends both ways (Mask(causal=False))")
        super().__init__(cfg, rng=rng, dtype=dtype)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        """input_ids (B, T) ints [, token_type_ids (B, T) ints in [0, type_vocab_size), None:
        all 0] [, attention_mask (B, T) 0/1: a padded batch, transformers' (lm/padding.py):
        padding keys masked in every layer, positions 0..T-1 as BERT's absolute ones, so a
        right-padded row (a tokenizer's padding) equals the row alone] -> (logits (B, T, V),
        LMCache)."""
        if token_type_ids is not None:
            expect_int("MaskedLM", "token_type_ids", token_type_ids)
            expect_ndim("MaskedLM", "token_type_ids", token_type_ids, 2, "(B, T)")
            if token_type_ids.shape != np.shape(input_ids) or not self.cfg.type_vocab_size:
                raise ValueError(f"MaskedLM: token_type_ids {token_type_ids.shape} needs the "
                                 f"shape of input_ids {np.shape(input_ids)} and a config with "
                                 f"type_vocab_size (it has {self.cfg.type_vocab_size})")
        return self._forward(input_ids, token_type_ids, attention_mask=attention_mask,
                             positions="absolute")

    def init_state(self, batch, max_len):
        raise ValueError("MaskedLM: a bidirectional model has no token-by-token decoding")


class Seq2SeqCache(NamedTuple):
    src: tuple
    enc: list
    enc_norm: tuple
    tgt: tuple
    dec: list
    dec_norm: tuple
    head: tuple
    ce: tuple


class EncoderDecoder(Module):
    """A small sequence-to-sequence Transformer: encoder over src, decoder over tgt_in."""

    def __init__(self, vocab_size, d_model, n_layers, n_heads, d_ff, *, rng, dtype=np.float32):
        enc, dec = encoder_layer(n_heads, d_ff), encoder_layer(n_heads, d_ff, causal=True)
        self.src_embed = Embedding(vocab_size, d_model, rng=rng, dtype=dtype)
        self.encoder = [Block(d_model, enc, rng=rng, dtype=dtype) for _ in range(n_layers)]
        self.enc_norm = make_norm(d_model, NormSpec(), dtype)
        self.tgt_embed = Embedding(vocab_size, d_model, rng=rng, dtype=dtype)
        self.decoder = [Block(d_model, dec, rng=rng, dtype=dtype,
                              cross=cross_attention(n_heads)) for _ in range(n_layers)]
        self.dec_norm = make_norm(d_model, NormSpec(), dtype)
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
            dy, denc = g["x"], denc + g["context"]  # every decoder block reads enc
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
