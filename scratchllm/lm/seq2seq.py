"""The encoder-decoder LM of a Seq2SeqConfig (T5: Raffel et al. 2019, arXiv 1910.10683;
Switch Transformers: Fedus et al. 2021, arXiv 2101.03961), built from the library's one Block.

    x_0 = E[input_ids];           x_l = enc_block_l(x_{l-1});          e = enc_norm(x_L)
    y_0 = E[decoder_input_ids];   y_l = dec_block_l(y_{l-1}, e);       h = dec_norm(y_L)
    logits = (s h) W_head         s = D^-1/2 with scale_output (T5, tied), W_head = E^T tied
A decoder block is self-attention (causal), cross-attention (queries from the decoder, keys
and values from e) and the FFN, each a residual sub-layer around its norm (lm/block.py).
T5's relative position bias: each attention layer reads a (num_buckets, H) table; with
cfg.shared_bias the first layer's table Param is every layer's of its stack (the same object:
each layer's gradient adds into it, as T5's one bias tensor per stack collects them).
Backward: the chain in reverse; e's gradient is the sum of every decoder block's
cross-attention gradient; E's gradient collects the head (tied) and both lookups.
Decoding: init_state runs the encoder once and keeps each decoder layer's cross-attention
keys and values (a CrossContext) beside its self-attention KVState; decode feeds one token.
With MoE FFNs (Switch) the router's loss terms are off unless asked for (dloss_aux).
A padded source batch: attention_mask (B, Ts) (transformers' name, 1 = a real token) masks
the padded source keys in every encoder self-attention and every decoder cross-attention
(and in the decoding state's CrossContext), as transformers' T5 adds its extended mask to the
scores (modeling_t5.py); a padded key then gets no attention and no gradient, so each row
equals the row run alone unpadded. The backward is the same chain (the masks sit in the sdpa
caches).

Glossary: B batch, Ts / Tt source / target lengths, D model width, V vocabulary.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention import padding_mask
from scratchllm.core import ops
from scratchllm.core.nn import Embedding, Linear, Module
from scratchllm.core.validate import expect_int, expect_ndim
from scratchllm.moe import router_losses_backward, router_losses_forward
from scratchllm.lm.block import Block
from scratchllm.lm.ffn import SwitchFFN
from scratchllm.lm.mixers import make_norm
from scratchllm.specs.seq2seq import Seq2SeqConfig


class Seq2SeqLMCache(NamedTuple):
    src: tuple     # the encoder's embedding lookup
    enc: list      # per encoder block
    enc_norm: tuple
    tgt: tuple     # the decoder's embedding lookup
    dec: list      # per decoder block
    dec_norm: tuple
    head: tuple    # the head's (tied: E^T's) linear cache
    scale: float   # s: the head reads s h


class Seq2SeqState(NamedTuple):
    """Decoding state: per decoder layer its self-attention KVState and cross-attention
    CrossContext (the encoder output's keys and values, computed once)."""
    layers: list
    contexts: list


class Seq2SeqLM(Module):
    """The model of a Seq2SeqConfig; Params in float32 (default) or float64. Param names:
    embed.E, encoder.i.*, enc_norm.g, decoder.i.* (with norm_cross, cross), dec_norm.g and,
    untied, head.W."""

    def __init__(self, cfg, *, rng, dtype=np.float32):
        if not isinstance(cfg, Seq2SeqConfig):
            raise TypeError(f"Seq2SeqLM: cfg must be a Seq2SeqConfig (scratchllm.specs.seq2seq), "
                            f"got {type(cfg).__name__}")
        self.cfg = cfg
        D = cfg.d_model
        self.embed = Embedding(cfg.vocab_size, D, rng=rng, dtype=dtype)
        self.encoder = [Block(D, spec, rng=rng, dtype=dtype) for spec in cfg.encoder]
        self.enc_norm = make_norm(D, cfg.norm, dtype)
        self.decoder = [Block(D, spec, rng=rng, dtype=dtype, cross=cfg.cross)
                        for spec in cfg.decoder]
        self.dec_norm = make_norm(D, cfg.norm, dtype)
        self.head = None if cfg.tie_embeddings else Linear(D, cfg.vocab_size, rng=rng,
                                                           dtype=dtype)
        if cfg.shared_bias:
            for stack in (self.encoder, self.decoder):
                for blk in stack[1:]:  # T5: one bias per stack, from its first layer's table
                    blk.mixer.rel_table = stack[0].mixer.rel_table

    @property
    def dtype(self):
        return self.embed.E.data.dtype

    def named_buffers(self):
        """[(name, array)] of the MoE layers' selection biases (none for T5)."""
        return [(f"{stack}.{i}.{n}", b) for stack in ("encoder", "decoder")
                for i, blk in enumerate(getattr(self, stack)) for n, b in blk.named_buffers()]

    def _ids(self, name, ids):
        expect_int("Seq2SeqLM", name, ids)
        expect_ndim("Seq2SeqLM", name, ids, 2, "(B, T)")
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"Seq2SeqLM: {name} must lie in [0, {self.cfg.vocab_size}), got "
                             f"[{ids.min()}, {ids.max()}]")
        return ids

    def _source_mask(self, fn, attention_mask, input_ids):
        """attention_mask (B, Ts) 0/1 like input_ids, checked (each row holds a real token),
        or None: no padding."""
        if attention_mask is None:
            return None
        am = np.asarray(attention_mask)
        if am.shape != np.shape(input_ids):
            raise ValueError(f"{fn}: attention_mask must have input_ids' shape "
                             f"{np.shape(input_ids)} (B, Ts), got {am.shape}")
        padding_mask(am, fn=fn)  # checks the 0/1 values
        if am.size and not am.astype(bool).any(axis=1).all():
            raise ValueError(f"{fn}: attention_mask has a row of only padding (rows "
                             f"{np.flatnonzero(~am.astype(bool).any(axis=1)).tolist()}); "
                             f"every source row needs a real token")
        return am

    def encode(self, input_ids, attention_mask=None):
        """input_ids (B, Ts) [, attention_mask (B, Ts) 0/1: the padded keys masked out of each
        self-attention] -> (e (B, Ts, D), (embedding, block, norm caches))."""
        am = self._source_mask("Seq2SeqLM.encode", attention_mask, input_ids)
        x, c_src = self.embed.forward(self._ids("input_ids", input_ids))  # (B, Ts, D)
        caches = []
        for blk in self.encoder:
            if am is None:
                x, c = blk.forward(x)  # (B, Ts, D)
            else:  # the layer's own mask AND the row's real keys
                mask = padding_mask(am, blk.spec.mixer.mask, fn="Seq2SeqLM.encode")
                x, c = blk.body(x, lambda a, m=mask, b=blk: b.mixer.forward(a, None, m))
            caches.append(c)
        e, c_norm = self.enc_norm.forward(x)  # (B, Ts, D)
        return e, (c_src, caches, c_norm)

    def _head(self, h):
        """logits = (s h) W_head: (logits, the linear's cache, s)."""
        s = self.cfg.d_model ** -0.5 if self.cfg.scale_output else 1.0
        h = h * np.asarray(s, h.dtype) if self.cfg.scale_output else h  # (..., D)
        out, c = self.head.forward(h) if self.head is not None else self.embed.attend(h)
        return out, c, s

    def forward(self, input_ids=None, decoder_input_ids=None, attention_mask=None):
        """input_ids (B, Ts), decoder_input_ids (B, Tt) ints [, attention_mask (B, Ts) 0/1:
        the source's padding, masked out of the encoder's self-attention and every
        cross-attention] -> (logits (B, Tt, V), Seq2SeqLMCache)."""
        if input_ids is None or decoder_input_ids is None:
            raise ValueError("Seq2SeqLM.forward: give input_ids (the source, (B, Ts)) and "
                             "decoder_input_ids (the target so far, (B, Tt))")
        e, (c_src, enc, c_en) = self.encode(input_ids, attention_mask)
        tgt = self._ids("decoder_input_ids", decoder_input_ids)
        if tgt.shape[0] != e.shape[0]:
            raise ValueError(f"Seq2SeqLM.forward: decoder_input_ids has {tgt.shape[0]} rows, "
                             f"input_ids {e.shape[0]}")
        cross = None if attention_mask is None else padding_mask(attention_mask)  # (B,1,1,Ts)
        y, c_tgt = self.embed.forward(tgt)  # (B, Tt, D)
        dec = []
        for blk in self.decoder:
            if cross is None:
                y, c = blk.forward(y, e)  # (B, Tt, D)
            else:
                y, c = blk.body(y, blk.mixer.forward,
                                lambda a, b=blk: b.cross.forward(a, e, cross))  # (B, Tt, D)
            dec.append(c)
        h, c_dn = self.dec_norm.forward(y)  # (B, Tt, D)
        logits, c_head, s = self._head(h)  # (B, Tt, V)
        return logits, Seq2SeqLMCache(c_src, enc, c_en, c_tgt, dec, c_dn, c_head, s)

    def _switch(self, stack, caches):
        """[(block index, router logits (B, T, E))] of the stack's Switch layers, and their
        MoESpec (the first one's: its z_coef and balance_coef weigh the stack's losses)."""
        found = [(i, blk.ffn.router_logits(c.ffn.inner)) for i, (blk, c) in
                 enumerate(zip(stack, caches)) if isinstance(blk.ffn, SwitchFFN)]
        return found, (stack[found[0][0]].ffn.spec if found else None)

    def aux_losses(self, cache):
        """((name, value), ...): every MoE layer's weighted loss terms, and for the Switch
        layers of each stack transformers' two router losses over the stack
        (moe/switch.py: "encoder_z", "encoder_balance", then the decoder's), weighted by the
        MoESpec's z_coef and balance_coef; empty for a dense model."""
        terms = []
        for name, stack, caches in (("encoder", self.encoder, cache.enc),
                                    ("decoder", self.decoder, cache.dec)):
            terms += [t for blk, c in zip(stack, caches) for t in blk.aux_losses(c)]
            found, spec = self._switch(stack, caches)
            if found:
                (z, aux), _ = router_losses_forward(np.stack([s for _, s in found]))
                terms += [(f"{name}_z", spec.z_coef * z),
                          (f"{name}_balance", spec.balance_coef * aux)]
        return tuple(terms)

    def _aux_douts(self, stack, caches, dloss_aux):
        """Per block of the stack, what its backward takes as dloss_aux: the number itself,
        or for a Switch layer the gradient on its router logits of dloss_aux times the
        stack's weighted router losses (when dloss_aux is not 0)."""
        douts = [dloss_aux] * len(stack)
        found, spec = self._switch(stack, caches)
        if found and dloss_aux:
            _, c = router_losses_forward(np.stack([s for _, s in found]))  # (L, B, T, E)
            dt = found[0][1].dtype
            g = router_losses_backward((np.asarray(dloss_aux * spec.z_coef, dt),
                                        np.asarray(dloss_aux * spec.balance_coef, dt)), c)
            for (i, _), d in zip(found, g["logits"]):
                douts[i] = d  # (B, T, E)
        return douts

    def backward(self, dlogits, cache, dloss_aux=0.0):
        """dlogits (B, Tt, V) -> Param grads (+=) of sum(logits * dlogits) (+ dloss_aux times
        the aux_losses terms: off by default). Returns None (the inputs are ids)."""
        if self.head is not None:  # fwd: logits = (s h) W_head
            dh = self.head.backward(dlogits, cache.head)
        else:  # fwd: logits = (s h) E^T
            dh = self.embed.attend_backward(dlogits, cache.head)
        dh = dh * np.asarray(cache.scale, dh.dtype) if self.cfg.scale_output else dh
        dy = self.dec_norm.backward(dh, cache.dec_norm)  # fwd: h = dec_norm(y_L)
        de = 0
        douts = self._aux_douts(self.decoder, cache.dec, dloss_aux)
        for blk, c, d in zip(reversed(self.decoder), reversed(cache.dec), reversed(douts)):
            g = blk.backward(dy, c, d)  # fwd: y_l = dec_block_l(y_{l-1}, e)
            dy, de = g["x"], de + g["context"]  # every decoder block reads e
        self.embed.backward(dy, cache.tgt)  # fwd: y_0 = E[decoder_input_ids]
        dx = self.enc_norm.backward(de, cache.enc_norm)  # fwd: e = enc_norm(x_L)
        douts = self._aux_douts(self.encoder, cache.enc, dloss_aux)
        for blk, c, d in zip(reversed(self.encoder), reversed(cache.enc), reversed(douts)):
            dx = blk.backward(dx, c, d)  # fwd: x_l = enc_block_l(x_{l-1})
        self.embed.backward(dx, cache.src)  # fwd: x_0 = E[input_ids]

    def loss(self, input_ids, decoder_input_ids, labels, *, aux=False, attention_mask=None):
        """Teacher-forced mean cross-entropy of labels (B, Tt) (-100: ignored) given the
        source (attention_mask: its padding, as forward) and the decoder inputs (+ with aux,
        the MoE layers' weighted router terms, aux_losses): (loss, cache for loss_backward)."""
        logits, cache = self.forward(input_ids, decoder_input_ids, attention_mask)
        loss, c_ce = ops.cross_entropy_forward(logits, labels)
        if aux:
            loss = loss + sum(value for _, value in self.aux_losses(cache))
        return loss, (cache, c_ce, aux)

    def loss_backward(self, dloss, cache):
        """Param grads (+=) of dloss * loss."""
        lm_cache, c_ce, aux = cache
        g = ops.cross_entropy_backward(np.asarray(dloss, self.dtype), c_ce)
        self.backward(g["logits"], lm_cache, float(dloss) if aux else 0.0)

    # ------------------------------------------------------------------ decoding
    def init_state(self, batch, max_len, *, input_ids, attention_mask=None):
        """Run the encoder on input_ids (batch, Ts) once (attention_mask: its padding, as
        forward): each decoder layer's cross-attention context (keys and values of e, and the
        padding mask its queries read them with) and an empty self-attention state for
        max_len target tokens."""
        if np.shape(input_ids)[0] != batch:
            raise ValueError(f"Seq2SeqLM.init_state: input_ids has {np.shape(input_ids)[0]} "
                             f"rows, batch is {batch}")
        e, _ = self.encode(input_ids, attention_mask)  # (B, Ts, D)
        cross = None if attention_mask is None else padding_mask(attention_mask)  # (B,1,1,Ts)
        return Seq2SeqState([blk.mixer.init_state(batch, max_len) for blk in self.decoder],
                            [blk.cross.context_state(e, cross) for blk in self.decoder])

    def prefill(self, decoder_input_ids, state):
        """The decoder over decoder_input_ids (B, Tt) at positions 0..Tt-1, filling the fresh
        state: logits (B, Tt, V)."""
        y, _ = self.embed.forward(self._ids("decoder_input_ids", decoder_input_ids))
        for blk, s, ctx in zip(self.decoder, state.layers, state.contexts):
            y = blk.prefill(y, s, ctx)  # (B, Tt, D)
        h, _ = self.dec_norm.forward(y)
        return self._head(h)[0]  # (B, Tt, V)

    def decode(self, ids_t, state, position):
        """One target token ids_t (B,) at `position` -> logits (B, V), updating state."""
        x, _ = self.embed.forward(np.asarray(ids_t))  # (B, D)
        for blk, s, ctx in zip(self.decoder, state.layers, state.contexts):
            x = blk.decode(x, s, position, ctx)  # (B, D)
        h, _ = self.dec_norm.forward(x)  # (B, D)
        return self._head(h)[0]  # (B, V)

    def greedy(self, input_ids, max_new_tokens, *, stop_ids=(), attention_mask=None):
        """Greedy decoding after cfg.decoder_start_id, token by token through the decoding
        state: (B, n) ids, n <= max_new_tokens (every row stopped at an id of stop_ids ends
        the loop; such a row keeps that id, and later ids repeat it no further);
        attention_mask (B, Ts) 0/1: a padded source batch, as forward."""
        B = np.shape(input_ids)[0]
        state = self.init_state(B, max_new_tokens + 1, input_ids=input_ids,
                                attention_mask=attention_mask)
        t = np.full(B, self.cfg.decoder_start_id)  # (B,)
        out, done = [], np.zeros(B, bool)
        for pos in range(max_new_tokens):
            t = self.decode(t, state, pos).argmax(-1)  # (B,)
            out.append(t)
            done |= np.isin(t, list(stop_ids))
            if done.all():
                break
        return np.stack(out, axis=1) if out else np.zeros((B, 0), np.int64)
