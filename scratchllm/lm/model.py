"""A config-driven decoder-only language model composed from the library's Modules.

    x_0 = E[ids]  (+ P[positions], learned positions)     token embedding
    h_l = x_{l-1} + mixer_l(rmsnorm(x_{l-1}))             mixer: GQA / MLA / sliding-window
    x_l = h_l + ffn_l(rmsnorm(h_l))                              attention, or a Mamba block;
    logits = rmsnorm(x_L) @ W_head   (W_head = E^T if tied)      ffn: SwiGLU, MoE or none
    loss = CE(logits, targets) + sum_MoE-layers (balance_coef * aux + z_coef * z)

The backward runs the same chain in reverse: each Block calls its Modules' backwards, and the
residual adds the skip gradient. A Module owns its Params; the caches live in the calls.
Decoding (`init_state`, then `decode`) feeds one token per call through per-layer states: a
KVState (GQA), a RollingKVState (sliding window), a LatentKVState (MLA, absorbed form), and a
MambaState (conv and SSM state).

Glossary: B batch, T time, D model width, V vocabulary, L layers.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention import sinusoidal_positions
from scratchllm.core import fused, ops
from scratchllm.core.nn import Embedding, Linear, Module
from scratchllm.core.validate import expect_int, expect_ndim
from scratchllm.lm.mixers import make_ffn, make_mixer, make_norm
from scratchllm.moe import MoEOut


class BlockOut(NamedTuple):
    """A block's outputs (and the shape of its backward's dout): aux, z are None without MoE."""
    y: np.ndarray  # (B, T, D)
    aux: np.ndarray
    z: np.ndarray


class BlockCache(NamedTuple):
    norm1: tuple
    mixer: tuple
    norm2: tuple
    ffn: tuple
    post_mixer: tuple  # the sandwich block's output norms' caches (None for pre-norm)
    post_ffn: tuple


class Block(Module):
    """Pre-norm residual block: x + mixer(norm(x)), then + ffn(norm(.)). block="sandwich"
    (Gemma 2, 3) also normalises the mixer's and the FFN's outputs before each residual add:
    h = x + norm_m(mixer(norm1(x))), y = h + norm_f(ffn(norm2(h))). block="post" is the
    original Transformer's post-norm: h = norm1(x + mixer(x)), y = norm2(h + ffn(h)); its
    gradients at init grow toward the output layers (Xiong et al. 2020, arXiv 2002.04745).
    ffn="none" leaves the FFN out (HF Mamba-1's MambaBlock is the mixer alone)."""

    def __init__(self, cfg, i, *, rng, dtype):
        self.norm1 = make_norm(cfg, dtype)
        self.mixer = make_mixer(cfg, cfg.layer_kinds()[i], rng=rng, dtype=dtype, layer=i)
        self.norm2 = None if cfg.ffn == "none" else make_norm(cfg, dtype)
        self.moe = cfg.is_moe_layer(i)
        self.ffn = make_ffn(cfg, self.moe, rng=rng, dtype=dtype)
        sandwich = cfg.block == "sandwich"
        self.post_mixer_norm = make_norm(cfg, dtype) if sandwich else None
        self.post_ffn_norm = make_norm(cfg, dtype) if sandwich else None
        self.post = cfg.block == "post"

    def _forward_post(self, x):
        """Post-norm (Vaswani et al. 2017): h = norm1(x + mixer(x)), y = norm2(h + ffn(h))."""
        m, cm = self.mixer.forward(x)  # (B, T, D)
        h, c1 = self.norm1.forward(x + m)  # (B, T, D)
        out, cf = self.ffn.forward(h)
        f, aux, z = out if self.moe else (out, None, None)  # (B, T, D)
        y, c2 = self.norm2.forward(h + f)  # (B, T, D)
        return BlockOut(y, aux, z), BlockCache(c1, cm, c2, cf, None, None)

    def _backward_post(self, dout, cache):
        dy, daux, dz = dout
        c1, cm, c2, cf, _, _ = cache
        ds = self.norm2.backward(dy, c2)  # fwd: y = norm2(s), s = h + f
        dh = ds + self.ffn.backward(MoEOut(ds, daux, dz) if self.moe else ds, cf)  # f = ffn(h)
        dr = self.norm1.backward(dh, c1)  # fwd: h = norm1(r), r = x + m
        return dr + self.mixer.backward(dr, cm)  # fwd: m = mixer(x)

    @staticmethod
    def _post(norm, x):
        """norm(x) with its cache, or x itself (and None) without that norm."""
        return (x, None) if norm is None else norm.forward(x)

    def forward(self, x):
        """x (B, T, D) -> (BlockOut(y (B, T, D), aux, z), cache); aux, z None without MoE."""
        if self.post:
            return self._forward_post(x)
        a, c1 = self.norm1.forward(x)  # (B, T, D)
        m, cm = self.mixer.forward(a)  # (B, T, D)
        m, c3 = self._post(self.post_mixer_norm, m)  # (B, T, D)
        h = x + m  # (B, T, D)
        if self.ffn is None:  # a mixer-only block
            return BlockOut(h, None, None), BlockCache(c1, cm, None, None, c3, None)
        b, c2 = self.norm2.forward(h)  # (B, T, D)
        out, cf = self.ffn.forward(b)
        f, aux, z = out if self.moe else (out, None, None)  # (B, T, D)
        f, c4 = self._post(self.post_ffn_norm, f)  # (B, T, D)
        return BlockOut(h + f, aux, z), BlockCache(c1, cm, c2, cf, c3, c4)

    def backward(self, dout, cache):
        """dout = BlockOut(dy, daux, dz) -> dx; Param grads accumulate in the Modules."""
        if self.post:
            return self._backward_post(dout, cache)
        dy, daux, dz = dout
        c1, cm, c2, cf, c3, c4 = cache
        dh = dy  # fwd: y = h (+ f)
        if self.ffn is not None:
            df = dy if c4 is None else self.post_ffn_norm.backward(dy, c4)  # fwd: f = norm_f(f)
            db = self.ffn.backward(MoEOut(df, daux, dz) if self.moe else df, cf)  # y = h + f
            dh = dy + self.norm2.backward(db, c2)  # fwd: b = norm2(h)
        dm = dh if c3 is None else self.post_mixer_norm.backward(dh, c3)  # fwd: m = norm_m(m)
        da = self.mixer.backward(dm, cm)  # fwd: h = x + m, m = mixer(a)
        return dh + self.norm1.backward(da, c1)  # fwd: a = norm1(x)

    def _stateful(self, x, mix):
        """The block on x (..., D) with the mixer called as `mix` (its prefill or decode, which
        fill the layer's state) and no backward caches."""
        if self.post:
            h, _ = self.norm1.forward(x + mix(x))  # (..., D)
            return self.norm2.forward(h + self._ffn_out(h))[0]  # (..., D)
        m, _ = self._post(self.post_mixer_norm, mix(self.norm1.forward(x)[0]))  # (..., D)
        h = x + m  # (..., D)
        if self.ffn is None:
            return h
        f, _ = self._post(self.post_ffn_norm, self._ffn_out(self.norm2.forward(h)[0]))
        return h + f  # (..., D)

    def _ffn_out(self, b):
        out, _ = self.ffn.forward(b)
        return out.y if self.moe else out

    def prefill(self, x, state):
        """A whole prompt x (B, T, D) -> y (B, T, D), filling this layer's fresh state (a mixer
        without a prefill of its own, like the recurrent ones, decodes the prompt step by step)."""
        if hasattr(self.mixer, "prefill"):
            return self._stateful(x, lambda a: self.mixer.prefill(a, state))
        return self._stateful(x, lambda a: np.stack(
            [self.mixer.decode(a[:, t], state, t) for t in range(a.shape[1])], axis=1))

    def decode(self, x_t, state, position):
        """One token: x_t (B, D) -> y_t (B, D), updating this layer's state in place."""
        return self._stateful(x_t, lambda a: self.mixer.decode(a, state, position))


class EmbedCache(NamedTuple):
    tok: tuple   # the token embedding's cache
    pos: tuple   # the learned position table's cache (None with RoPE)


class LMCache(NamedTuple):
    embed: EmbedCache
    blocks: list
    norm: tuple
    head: tuple
    aux: list   # per MoE layer: (balance loss, z-loss) values


class LossCache(NamedTuple):
    lm: LMCache
    ce_cache: tuple
    ce: float     # the cross-entropy part of the loss, nats/token
    aux: float    # the weighted MoE auxiliary part


class LM(Module):
    """The decoder LM of a ModelConfig; Params in float32 (default) or float64."""

    def __init__(self, cfg, *, rng, dtype=np.float32):
        self.cfg = cfg.validate()
        try:
            self._build(cfg, rng, dtype)
        except MemoryError:
            raise MemoryError(
                f"LM: the weights of this config (d_model={cfg.d_model}, n_layers="
                f"{cfg.n_layers}, vocab_size={cfg.vocab_size}, d_ff={cfg.d_ff}) in "
                f"{np.dtype(dtype)} are more than this machine can allocate") from None

    def _build(self, cfg, rng, dtype):
        D, V = cfg.d_model, cfg.vocab_size
        self.embed = Embedding(V, D, rng=rng, dtype=dtype)
        if cfg.tie_embeddings and not getattr(rng, "skip_init", False):
            self.embed.E.data *= np.asarray(D ** -0.5, dtype)  # logits O(1) at init, E^T the head
        if cfg.positions == "learned":  # GPT-2's wpe: x_0 = E[ids] + P[positions]
            self.pos = Embedding(cfg.max_positions, D, rng=rng, dtype=dtype)
        self.layers = [Block(cfg, i, rng=rng, dtype=dtype) for i in range(cfg.n_layers)]
        self.norm = make_norm(cfg, dtype)
        self.head = None if cfg.tie_embeddings else Linear(D, V, rng=rng, dtype=dtype)

    @property
    def dtype(self):
        return self.embed.E.data.dtype

    def named_buffers(self):
        """Non-trainable state saved in checkpoints: the MoE selection biases."""
        return [(f"layers.{i}.ffn.selection_bias", b.ffn.selection_bias)
                for i, b in enumerate(self.layers) if b.moe]

    def forward(self, ids):
        """ids (B, T) ints -> (logits (B, T, V), LMCache)."""
        expect_int("LM", "ids", ids)
        expect_ndim("LM", "ids", ids, 2, "(B, T)")
        if ids.shape[1] < 1:
            raise ValueError(f"LM: ids has shape {ids.shape}: no tokens (T must be >= 1)")
        x, c_emb = self._embed_forward(ids)  # (B, T, D)
        blocks, aux = [], []
        for layer in self.layers:
            (x, a, z), c = layer.forward(x)  # (B, T, D)
            blocks.append(c)
            if layer.moe:
                aux.append((a, z))
        h, cn = self.norm.forward(x)  # (B, T, D)
        logits, ch = self._head_forward(h)  # (B, T, V)
        return logits, LMCache(c_emb, blocks, cn, ch, aux)

    def _embed_forward(self, ids, start=0):
        """x_0 = E[ids] (+ P[start + t]: sinusoidal, a constant with no backward, or a learned
        table) -> (x (B, T, D), caches)."""
        x, c_tok = self.embed.forward(ids)  # (B, T, D)
        if self.cfg.embed_scale:  # Gemma: E[ids] * sqrt(D), sqrt(D) in the weights' dtype
            x = x * np.asarray(self.cfg.d_model ** 0.5, x.dtype)  # (B, T, D)
        if self.cfg.positions == "sinusoidal":
            T, D = x.shape[1], x.shape[2]
            x = x + sinusoidal_positions(start + T, D)[start:].astype(x.dtype)  # (B, T, D)
        if self.cfg.positions != "learned":
            return x, EmbedCache(c_tok, None)
        positions = np.broadcast_to(start + np.arange(ids.shape[1]), ids.shape)  # (B, T)
        p, c_pos = self.pos.forward(positions)  # (B, T, D)
        return x + p, EmbedCache(c_tok, c_pos)

    def _head_forward(self, h):
        return self.embed.attend(h) if self.head is None else self.head.forward(h)

    def backward(self, dlogits, cache, dloss_aux=1.0):
        """dlogits (B, T, V) -> Param grads (+=). Each MoE layer's aux loss gets the gradient
        dloss_aux * balance_coef, its z-loss dloss_aux * z_coef."""
        c_emb, blocks, cn, ch, _ = cache
        if self.head is None:
            dh = self.embed.attend_backward(dlogits, ch)  # fwd: logits = h @ E^T
        else:
            dh = self.head.backward(dlogits, ch)  # fwd: logits = h @ W_head
        dx = self.norm.backward(dh, cn)  # fwd: h = norm(x_L)
        dt = dlogits.dtype
        daux = np.asarray(dloss_aux * self.cfg.balance_coef, dt)
        dz = np.asarray(dloss_aux * self.cfg.z_coef, dt)
        for layer, c in zip(reversed(self.layers), reversed(blocks)):
            d_moe = (daux, dz) if layer.moe else (None, None)
            dx = layer.backward(BlockOut(dx, *d_moe), c)  # fwd: x_l = block_l(x_{l-1})
        if c_emb.pos is not None:
            self.pos.backward(dx, c_emb.pos)  # fwd: x_0 = E[ids] + P[positions]: scatter-add
        if self.cfg.embed_scale:
            dx = dx * np.asarray(self.cfg.d_model ** 0.5, dx.dtype)  # fwd: x_0 = E[ids] sqrt(D)
        self.embed.backward(dx, c_emb.tok)  # fwd: x_0 = E[ids]

    def loss(self, ids, targets):
        """Cross-entropy of next tokens plus the weighted MoE auxiliary losses.

        Inputs: ids, targets (B, T) ints.  Returns: (loss 0-d array, LossCache with .ce).
        """
        logits, cache = self.forward(ids)  # (B, T, V)
        ce, c_ce = fused.CROSS_ENTROPY.forward(logits, targets)
        aux = sum(self.cfg.balance_coef * a + self.cfg.z_coef * z for a, z in cache.aux)
        total = np.asarray(ce + aux, dtype=logits.dtype)
        return total, LossCache(cache, c_ce, float(ce), float(aux))

    def loss_backward(self, dloss, cache):
        """Gradients of `loss` (times dloss) into every Param.grad (+=)."""
        dlogits = fused.CROSS_ENTROPY.backward(np.asarray(dloss, self.dtype), cache.ce_cache)
        self.backward(dlogits["logits"], cache.lm, dloss_aux=dloss)

    def cross_entropy(self, ids, targets):
        """Mean next-token cross-entropy (nats/token), forward only."""
        logits, _ = self.forward(ids)
        return float(fused.CROSS_ENTROPY.forward(logits, targets)[0])

    def after_step(self, caches):
        """After an optimizer step, given the step's LossCache (or one per data-parallel
        shard): the aux-loss-free bias update of each MoE layer (when bias_gamma > 0), from
        the routed counts summed over shards. Returns [(layer, share of routed slots per
        expert)] for the MoE layers."""
        caches = caches if isinstance(caches, list) else [caches]
        stats = []
        for i, layer in enumerate(self.layers):
            if not layer.moe:
                continue
            counts = sum(np.asarray(c.lm.blocks[i].ffn.tokens_per_expert, np.float64)
                         for c in caches)  # (E,)
            stats.append((i, counts / max(counts.sum(), 1)))
            if self.cfg.bias_gamma > 0:
                layer.ffn.update_bias(counts, self.cfg.bias_gamma)  # in place: replicas share it
        return stats

    def replica(self):
        """A model whose Params share .data with this one (weights updated in place show up
        in both) but own their .grad; buffers shared too. For data-parallel threads."""
        twin = LM(self.cfg, rng=np.random.default_rng(0), dtype=self.dtype)
        for p, q in zip(self.parameters(), twin.parameters()):
            q.data = p.data
        twin.share_buffers(self)
        return twin

    def share_buffers(self, other):
        """Point this model's MoE selection biases at other's arrays."""
        for mine, theirs in zip(self.layers, other.layers):
            if mine.moe:
                mine.ffn.selection_bias = theirs.ffn.selection_bias

    # ------------------------------------------------------------------ decoding
    def init_state(self, batch, max_len):
        """Per-layer decoding states for `batch` sequences of up to max_len tokens."""
        return [layer.mixer.init_state(batch, max_len) for layer in self.layers]

    def prefill(self, ids, state):
        """The prompt ids (B, T) at positions 0..T-1 in one forward pass per layer, filling
        every layer's fresh state (from init_state) as T decode calls would. Returns the
        logits (B, T, V); decoding continues with decode(ids_t, state, T)."""
        expect_int("LM.prefill", "ids", ids)
        expect_ndim("LM.prefill", "ids", ids, 2, "(B, T)")
        x, _ = self._embed_forward(ids)  # (B, T, D)
        for layer, st in zip(self.layers, state):
            x = layer.prefill(x, st)  # (B, T, D)
        h, _ = self.norm.forward(x)  # (B, T, D)
        return self._head_forward(h)[0]  # (B, T, V)

    def decode(self, ids_t, state, position):
        """One token per sequence: ids_t (B,) at `position` -> logits (B, V); updates state."""
        x, _ = self._embed_forward(np.asarray(ids_t)[:, None], position)  # (B, 1, D)
        x = x[:, 0]  # (B, D)
        for layer, st in zip(self.layers, state):
            x = layer.decode(x, st, position)  # (B, D)
        h, _ = self.norm.forward(x)  # (B, D)
        return self._head_forward(h)[0]  # (B, V)


def loss_pair(model):
    """The model's loss as a forward/backward pair over its Params, for grads.check:
        forward(ids, targets, **{param name: array}) -> (loss, cache)
        backward(dloss, cache) -> {param name: gradient}
    forward points each Param at the array it is given (the checker's perturbed copies)."""
    params = dict(model.named_parameters())

    def forward(ids, targets, **arrays):
        for name, p in params.items():
            p.data = arrays[name]
        return model.loss(ids, targets)

    def backward(dloss, cache):
        model.zero_grad()
        model.loss_backward(float(dloss), cache)
        return {name: p.grad.copy() for name, p in params.items()}

    return forward, backward, {name: p.data for name, p in params.items()}
