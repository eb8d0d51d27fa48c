"""The residual block of every model in the library, built from one LayerSpec: a token mixer,
then (a decoder's) cross-attention, then an FFN, each a residual sub-layer around its norm.

A sub-layer f with its norm N sits where LayerSpec.placement says:
    pre        y = x + f(N(x))              (GPT-2 onward, Llama)
    sandwich   y = x + N'(f(N(x)))          (Gemma 2, 3: N' a second norm on f's output)
    output     y = x + N(f(x))              (OLMo 2: the norm on f's output only; OLMo et
                                             al. 2024, arXiv 2501.00656)
    post       y = N(x + f(x))              (Vaswani et al. 2017; its gradients at init grow
                                             toward the output layers: Xiong et al. 2020,
                                             arXiv 2002.04745)
The block:  h = sub(x, mixer)   [h = sub(h, cross-attention to a context)]   y = sub(h, ffn)
(times LayerSpec.out_scale when it is not 1: RWKV's inference rescale)
(ffn None: the block is the mixer sub-layer alone, as HF Mamba-1's MambaBlock; mixer None: the
FFN sub-layer alone, an MLP-only layer of a Mamba-2-Hybrid).

One body (Block.body) serves training, prefill and decoding: it is written over how the mixer
is called (forward with a backward cache, prefill filling a decoding state, or one decode step;
serving passes its own), and only training keeps the caches. The FFN interface (lm/ffn.py)
carries an MoE's loss terms.
Backward runs each sub-layer in reverse: the residual adds the skip gradient.
A packed batch (several documents per row, Packing) reaches the mixer as its layer's mask
restricted to each document (attention/sparse_masks.py packed_mask) and positions that
restart at each document; only attention and MLA can take it (a recurrence would carry one
document's state into the next).

Glossary: B batch, T time, Tc context length, D model width.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention import CrossAttention, document_positions, packed_mask
from scratchllm.core.nn import Module
from scratchllm.core.validate import expect_int
from scratchllm.lm.ffn import make_ffn
from scratchllm.lm.mixers import make_mixer, make_norm
from scratchllm.lm.shifted import ShiftedCache, mix_shifted_back, mix_shifted


class SublayerCache(NamedTuple):
    norm: tuple       # N before f (pre, sandwich; None for post)
    inner: tuple      # f's cache (None when decoding)
    out_norm: tuple   # N' on f's output (sandwich; else None)
    post_norm: tuple  # N after the residual add (post; else None)


class Packing(NamedTuple):
    """Several documents in each row of a batch (LM.forward's doc_ids), or a padded batch
    (attention_mask, lm/padding.py: keep its real tokens, the only ones a recurrent mixer
    reads); doc_ids None: one document per row at the given positions (M-RoPE's (3, B, T):
    a vision-language LM's)."""
    doc_ids: np.ndarray    # (B, T) ints, the document of each token, or None
    positions: np.ndarray  # (B, T) ints, restarting at 0 where each document starts
    keep: np.ndarray = None  # (B, T) bool, a padded batch's real tokens (None: packed)


def make_packing(fn, ids, doc_ids):
    """The Packing of doc_ids (B, T) ints, one per token of ids (B, T); fn names the caller."""
    doc_ids = np.asarray(doc_ids)
    expect_int(fn, "doc_ids", doc_ids)
    if doc_ids.shape != ids.shape:
        raise ValueError(f"{fn}: doc_ids has shape {doc_ids.shape}; it gives the document of "
                         f"each token of ids, shape {ids.shape}")
    return Packing(doc_ids, document_positions(doc_ids))


class BlockCache(NamedTuple):
    mixer: SublayerCache
    cross: SublayerCache  # None without cross-attention
    ffn: SublayerCache    # None for a mixer-only block


class FFNState(NamedTuple):
    """The decoding state of a block whose FFN keeps one (RWKV-4's channel mix: the previous
    token's x): the mixer's state and the FFN's."""
    mixer: object
    ffn: object


class Block(Module):
    """One residual block of a LayerSpec (Params: norm1, mixer, [norm_cross, cross], norm2,
    ffn, and for placement "sandwich" post_mixer_norm, post_ffn_norm; no norm1 and mixer in
    an MLP-only layer, no norm2 and ffn in a mixer-only one). cross: the
    AttentionSpec of a decoder's cross-attention sub-layer (rope=None, Mask(causal=False)), or
    None."""

    def __init__(self, d_model, spec, *, rng, dtype=np.float32, cross=None):
        mixer = spec.mixer is not None
        self.norm1 = make_norm(d_model, spec.norm, dtype) if mixer else None
        self.mixer = make_mixer(d_model, spec.mixer, rng=rng, dtype=dtype) if mixer else None
        self.norm_cross = None if cross is None else make_norm(d_model, spec.norm, dtype)
        self.cross = None if cross is None else CrossAttention(d_model, cross, rng=rng,
                                                               dtype=dtype)
        self.norm2 = None if spec.ffn is None else make_norm(d_model, spec.norm, dtype)
        self.ffn = None if spec.ffn is None else make_ffn(d_model, spec.ffn, rng=rng,
                                                          dtype=dtype)
        sandwich = spec.placement == "sandwich"
        self.post_mixer_norm = make_norm(d_model, spec.norm, dtype) if sandwich and mixer \
            else None
        self.post_ffn_norm = make_norm(d_model, spec.norm, dtype) if sandwich else None
        self.spec = spec

    # ------------------------------------------------------------------ the one body
    def _sublayer(self, x, norm, out_norm, call):
        """One residual sub-layer around call(a) -> (m, cache), by the block's placement:
            pre        y = x + call(norm(x))                (out_norm is None)
            sandwich   y = x + out_norm(call(norm(x)))
            post       y = norm(x + call(x))
            output     y = x + norm(call(x))                (out_norm is None)
        x (..., D) -> (y (..., D), SublayerCache)."""
        if self.spec.placement == "output":  # N on f's output only
            norm, out_norm = None, norm
        pre = self.spec.placement not in ("post", "output")
        a, c_norm = norm.forward(x) if pre else (x, None)  # (..., D)
        m, c_inner = call(a)  # (..., D)
        m, c_out = (m, None) if out_norm is None else out_norm.forward(m)  # (..., D)
        y, c_post = norm.forward(x + m) if self.spec.placement == "post" else (x + m, None)
        return y, SublayerCache(c_norm, c_inner, c_out, c_post)

    def body(self, x, mix, read=None, ffn=None):
        """The block on x (..., D) with its mixer sub-layer's inner call replaced by mix(a) ->
        (m, cache) (an MLP-only layer has none: h = x), and the cross-attention as read(a) ->
        (m, cache) (None: the block has none): the block's own norms, residuals,
        cross-attention and FFN around any way of running the mixer (a serving cache's
        attention, an evicting cache's); ffn(a) -> (f, cache) replaces the FFN's forward (a
        stateful FFN's decoding step; None: its forward). forward, prefill and decode are
        this with the mixer's own calls. Returns (y (..., D), BlockCache)."""
        if (read is None) != (self.cross is None):
            raise ValueError("Block: a context goes with a cross-attention sub-layer and only "
                             f"with one (cross is {'None' if self.cross is None else 'set'}, "
                             f"context is {'None' if read is None else 'given'})")
        h, c_mix = (x, None) if self.mixer is None else self._sublayer(
            x, self.norm1, self.post_mixer_norm, mix)  # (..., D)
        c_cross = None
        if self.cross is not None:
            h, c_cross = self._sublayer(h, self.norm_cross, None, read)
        if self.ffn is None:
            return self._scaled(h), BlockCache(c_mix, c_cross, None)
        y, c_ffn = self._sublayer(h, self.norm2, self.post_ffn_norm, ffn or self.ffn.forward)
        return self._scaled(y), BlockCache(c_mix, c_cross, c_ffn)  # (..., D)

    def _scaled(self, y):
        """y * spec.out_scale (RWKV's inference rescale), y itself at 1.0."""
        s = self.spec.out_scale
        return y if s == 1.0 else y * np.asarray(s, y.dtype)

    def forward(self, x, context=None, packing=None):
        """x (B, T, D) [, context (B, Tc, D) with cross-attention] [, packing: a Packing of
        the documents in each row] -> (y (B, T, D), BlockCache)."""
        read = None if context is None else (lambda a: self.cross.forward(a, context))
        if self.mixer is None:  # an MLP-only layer: every token on its own
            return self.body(x, None, read)
        mix = self.mixer.forward if packing is None else self._packed_mixer(packing)
        return self.body(x, mix, read)

    def _packed_mixer(self, packing):
        """The mixer's forward on a packed batch: its own mask AND the same document, at
        positions that restart per document (RoPE's; ALiBi and T5's bias read distances,
        which inside a document are its own)."""
        spec = self.spec.mixer
        if packing.keep is not None and not hasattr(spec, "mask"):  # a padded batch
            return lambda a: mix_shifted(self.mixer, a, packing.keep)
        if not hasattr(self.mixer, "prefill") or not hasattr(spec, "mask"):
            raise ValueError(f"Block: packed documents need an attention or MLA mixer; a "
                             f"{type(spec).__name__} layer's recurrence would carry one "
                             f"document's state into the next")
        mask = None if packing.doc_ids is None else packed_mask(  # Mask(array=(B,1,T,T))
            spec.mask, packing.doc_ids)
        positions = None if spec.rope is None else packing.positions  # (B, T)
        return lambda a: self.mixer.forward(a, positions, mask)

    def init_state(self, batch, max_len):
        """This layer's decoding state: the mixer's, or an FFNState of the mixer's and the
        FFN's when the FFN keeps one (RWKV-4's channel mix)."""
        state = self.mixer.init_state(batch, max_len)
        if hasattr(self.ffn, "init_state"):
            return FFNState(state, self.ffn.init_state(batch))
        return state

    def _states(self, state):
        """(the mixer's state, the FFN's call for one token or None); ValueError for a
        stateful FFN given the mixer's state alone."""
        if not hasattr(self.ffn, "init_state"):
            return state, None
        if not isinstance(state, FFNState):
            raise ValueError(f"Block: this block's FFN ({type(self.ffn).__name__}) keeps a "
                             f"decoding state: give Block.init_state's FFNState, got "
                             f"{type(state).__name__}")
        return state.mixer, lambda a: (self.ffn.decode(a, state.ffn), None)

    def _read_state(self, context):
        """The cross-attention as read(a) over a decoding context (CrossAttention.
        context_state of the encoder output: its keys and values, computed once)."""
        return None if context is None else (lambda a: (self.cross.read(a, context), None))

    def prefill(self, x, state, context=None):
        """A whole prompt x (B, T, D) -> y (B, T, D), filling this layer's fresh state (a mixer
        without a prefill of its own, like the recurrent ones, or a stateful FFN decodes the
        prompt step by step); context: the cross-attention's decoding context, with
        cross-attention."""
        if self._states(state)[1] is not None:
            return np.stack([self.decode(x[:, t], state, t, context)
                             for t in range(x.shape[1])], 1)
        read = self._read_state(context)
        if self.mixer is None:
            return self.body(x, None, read)[0]
        if hasattr(self.mixer, "prefill"):
            return self.body(x, lambda a: (self.mixer.prefill(a, state), None), read)[0]
        return self.body(x, lambda a: (np.stack(
            [self.mixer.decode(a[:, t], state, t) for t in range(a.shape[1])], axis=1),
            None), read)[0]

    def decode(self, x_t, state, position, context=None):
        """One token: x_t (B, D) -> y_t (B, D), updating this layer's state in place;
        context: the cross-attention's decoding context, with cross-attention."""
        mixer_state, ffn = self._states(state)
        read = self._read_state(context)
        if self.mixer is None:
            return self.body(x_t, None, read, ffn)[0]
        return self.body(x_t, lambda a: (self.mixer.decode(a, mixer_state, position), None),
                         read, ffn)[0]

    # ------------------------------------------------------------------ backward
    def _sublayer_backward(self, dy, cache, norm, out_norm, back):
        """Reverse of _sublayer; back(dm, cache) -> (da, extra) is f's backward.
        Returns (dx, extra)."""
        c_norm, c_inner, c_out, c_post = cache
        if self.spec.placement == "output":  # fwd: m = norm(f(x)), no norm before f
            norm, out_norm = None, norm
        ds = dy if c_post is None else norm.backward(dy, c_post)  # fwd: y = norm(s) (post)
        dm = ds if c_out is None else out_norm.backward(ds, c_out)  # fwd: m = out_norm(m)
        da, extra = back(dm, c_inner)  # fwd: m = f(a)
        if c_norm is None:
            return ds + da, extra  # fwd: s = x + m, a = x (post)
        return ds + norm.backward(da, c_norm), extra  # fwd: s = x + m, a = norm(x)

    def backward(self, dy, cache, dloss_aux=1.0):
        """dy (B, T, D) -> dx, or {"x": dx, "context": dcontext} for a block that read a
        context. dloss_aux: the loss's gradient on each FFN aux term (an MoE's). Param grads
        accumulate in the Modules."""
        c_mix, c_cross, c_ffn = cache
        dy = self._scaled(dy)  # fwd: y = out_scale * y
        dh = dy  # fwd: y = h (a mixer-only block)
        if c_ffn is not None:  # fwd: y = sub(h, ffn)
            dh, _ = self._sublayer_backward(
                dy, c_ffn, self.norm2, self.post_ffn_norm,
                lambda df, c: (self.ffn.backward(df, c, dloss_aux), None))
        dcontext = None
        if c_cross is not None:  # fwd: h = sub(h, cross(., context))
            dh, dcontext = self._sublayer_backward(dh, c_cross, self.norm_cross, None,
                                                   self._cross_backward)
        if c_mix is None:  # fwd: h = x (an MLP-only layer)
            return dh if c_cross is None else {"x": dh, "context": dcontext}
        dx, _ = self._sublayer_backward(  # fwd: h = sub(x, mixer)
            dh, c_mix, self.norm1, self.post_mixer_norm,
            lambda dm, c: (mix_shifted_back(self.mixer, dm, c) if isinstance(
                c, ShiftedCache) else self.mixer.backward(dm, c), None))
        return dx if c_cross is None else {"x": dx, "context": dcontext}

    def _cross_backward(self, dm, cache):
        g = self.cross.backward(dm, cache)  # fwd: m = cross(a, context)
        return g["x"], g["ctx"]

    # ------------------------------------------------------------------ the FFN's extras
    def aux_losses(self, cache):
        """The FFN's loss terms ((name, value), ...) of this forward (empty when dense)."""
        return () if self.ffn is None else self.ffn.aux_losses(cache.ffn.inner)

    def named_buffers(self):
        """[(name, array)] of the FFN's non-trainable state ("ffn.selection_bias")."""
        return [] if self.ffn is None else [(f"ffn.{n}", b)
                                            for n, b in self.ffn.named_buffers()]

    def share_buffers(self, other):
        """Point this block's buffers at other's arrays (data-parallel replicas)."""
        for name, b in other.named_buffers():
            setattr(self.ffn, name.removeprefix("ffn."), b)

    def after_step(self, caches, across=None):
        """The FFN's after-step update from this block's cache of each shard: an MoE's share
        of routed slots per expert (E,), else None (across: LM.after_step's)."""
        if self.ffn is None:
            return None
        return self.ffn.after_step([c.ffn.inner for c in caches], across)
