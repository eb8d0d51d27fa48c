"""The two ends of an LM, forward and backward, as the mixin LMEnds that LM inherits:

    embedding  x_0 = E[ids] (* sqrt(D) with embed_scale) (+ P[positions]: sinusoidal or
               learned) (+ S[types]) (then embed_norm); its backward scatter-adds dx_0 into
               the tables (no row for a pad id, as torch's padding_idx)
    head       logits = cap(t(norm(x_L)) @ W_head (+ b)), W_head = E^T when tied, cap(z) =
               c tanh(z / c) with cfg.logit_softcap; its backward through softcap, the
               projection, the transform and the final norm

A pipeline's first stage runs the embedding alone and its last stage the head alone; the MTP
modules share output_forward/_backward (the head without the final norm). LMEnds reads the
LM's Params (embed, pos, types, embed_norm, norm, transform, head, head_bias) and cfg.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention import sinusoidal_positions
from scratchllm.core.fp8 import full_precision
from scratchllm.core.softcap import softcap_backward, softcap_forward
from scratchllm.lm.heads import backprop_tied_head


class EmbedCache(NamedTuple):
    tok: tuple   # the token embedding's cache
    pos: tuple   # the learned position table's cache (None with RoPE)
    types: tuple = None  # the token-type table's cache (None without)
    norm: tuple = None   # embed_norm's cache (None without)
    pad: np.ndarray = None  # (B, T, 1) True where ids == cfg.pad_id (None without pad_id)


class HeadCache(NamedTuple):
    transform: tuple  # the head transform's cache (None without)
    proj: tuple       # the projection's cache


class LMEnds:
    """The embedding and the head of an LM (module docstring); LM inherits them."""

    def _embed_forward(self, ids, start=0, types=None, positions=None):
        """x_0 = E[ids] (+ P[start + t]: sinusoidal, a constant with no backward, or a learned
        table; P[positions] when given, (B, T) ints) (+ S[types]) (then embed_norm)
        -> (x (B, T, D), caches)."""
        x, c_tok = self.embed.forward(ids)  # (B, T, D)
        pad = None if self.cfg.pad_id is None else (ids == self.cfg.pad_id)[..., None]
        if self.cfg.embed_scale:  # Gemma: E[ids] * sqrt(D), sqrt(D) in the weights' dtype
            x = x * np.asarray(self.cfg.d_model ** 0.5, x.dtype)  # (B, T, D)
        if positions is None:
            start = np.reshape(start, (-1, 1))  # (1 | B, 1): one start, or one per row
            positions = np.broadcast_to(start + np.arange(ids.shape[1]), ids.shape)  # (B, T)
        if self.cfg.positions == "sinusoidal":
            table = sinusoidal_positions(int(positions.max()) + 1, x.shape[2])  # (P, D)
            x = x + table[positions].astype(x.dtype)  # (B, T, D)
        c_pos = c_types = c_norm = None
        if self.cfg.positions == "learned":
            p, c_pos = self.pos.forward(positions)  # (B, T, D)
            x = x + p  # (B, T, D)
        if self.cfg.type_vocab_size:
            s, c_types = self.types.forward(np.zeros_like(ids) if types is None else types)
            x = x + s  # (B, T, D)
        if self.embed_norm is not None:
            x, c_norm = self.embed_norm.forward(x)  # (B, T, D)
        return x, EmbedCache(c_tok, c_pos, c_types, c_norm, pad)

    def embed_backward(self, dx, c_emb):
        """The embedding's backward: dx_0 (B, T, D) -> the embedding tables' gradients (+=),
        the reverse of _embed_forward; c_emb: the EmbedCache of the forward (LMCache.embed).
        A pipeline's first stage runs it alone."""
        if c_emb.norm is not None:
            dx = self.embed_norm.backward(dx, c_emb.norm)  # fwd: x_0 = embed_norm(s)
        if c_emb.types is not None:
            self.types.backward(dx, c_emb.types)  # fwd: s += S[types]: scatter-add
        if c_emb.pos is not None:
            self.pos.backward(dx, c_emb.pos)  # fwd: x_0 = E[ids] + P[positions]: scatter-add
        if self.cfg.embed_scale:
            dx = dx * np.asarray(self.cfg.d_model ** 0.5, dx.dtype)  # fwd: x_0 = E[ids] sqrt(D)
        if c_emb.pad is not None:  # torch's padding_idx: the pad row's lookups pass nothing
            dx = np.where(c_emb.pad, 0, dx).astype(dx.dtype, copy=False)  # (B, T, D)
        self.embed.backward(dx, c_emb.tok)  # fwd: x_0 = E[ids]

    def _norm_forward(self, x):
        return (x, None) if self.norm is None else self.norm.forward(x)

    def head_forward(self, x):
        """The model's end on the last block's output x (B, T, D): final norm, head and
        soft-cap -> (logits (B, T, V), (norm, head, cap) caches). A pipeline's last stage
        runs it alone."""
        h, cn = self._norm_forward(x)  # (B, T, D)
        logits, (ch, c_cap) = self.output_forward(h)  # (B, T, V)
        return logits, (cn, ch, c_cap)

    def head_backward(self, dlogits, caches):
        """The backward of head_forward: dlogits (B, T, V) -> dx_L (B, T, D), the head's and
        the final norm's Params getting their gradients (a tied head's into E)."""
        cn, ch, c_cap = caches
        dh = self.output_backward(dlogits, (ch, c_cap))  # fwd: logits = out(h)
        return dh if cn is None else self.norm.backward(dh, cn)  # fwd: h = norm(x_L)

    def output_forward(self, h):
        """The output head on a normed h (..., D): logits = cap(t(h) @ W_head (+ b)) ->
        (logits (..., V), its cache) (shared with the MTP modules)."""
        logits, ch = self._head_forward(h)  # (..., V)
        logits, c_cap = self._cap(logits)  # (..., V)
        return logits, (ch, c_cap)

    def output_backward(self, dlogits, cache):
        """The backward of output_forward: dlogits (..., V) -> dh (..., D); the head's Params
        (a tied head's E) get their gradients."""
        ch, c_cap = cache
        if c_cap is not None:
            dlogits = softcap_backward(dlogits, c_cap)["x"]  # fwd: logits = c tanh(z / c)
        if self.head_bias is not None:  # fwd: logits = ... + b
            self.head_bias.grad += dlogits.reshape(-1, dlogits.shape[-1]).sum(0)
        if self.head is None:
            dh = backprop_tied_head(dlogits, ch.proj, self.embed)  # fwd: logits = t @ E^T
        else:
            dh = self.head.backward(dlogits, ch.proj)  # fwd: logits = t @ W_head
        if ch.transform is not None:
            dh = self.transform.backward(dh, ch.transform)  # fwd: t = transform(h)
        return dh

    def _head_forward(self, h):
        """logits = t(h) @ W_head (+ b) -> (logits (..., V), HeadCache)."""
        h, c_t = (h, None) if self.transform is None else self.transform.forward(h)
        with full_precision():  # the output head stays out of FP8 training (DeepSeek-V3's)
            logits, c = self.embed.attend(h) if self.head is None else self.head.forward(h)
        if self.head_bias is not None:
            logits = logits + self.head_bias.data  # (..., V)
        return logits, HeadCache(c_t, c)

    def _cap(self, logits):
        """(c tanh(logits / c), its cache) with cfg.logit_softcap c, else (logits, None)."""
        if self.cfg.logit_softcap is None:
            return logits, None
        return softcap_forward(logits, cap=self.cfg.logit_softcap)  # (..., V)

    def unembed(self, x):
        """The model's last step on a residual x (..., D): logits = head(norm(x)) (..., V),
        soft-capped with cfg.logit_softcap."""
        return self._cap(self._head_forward(self._norm_forward(x)[0])[0])[0]
