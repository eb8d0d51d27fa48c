"""The decoder-only language model of a ModelConfig: an embedding, one Block per LayerSpec
(lm/block.py), a final norm and the output head.

    x_0 = E[ids]  (* sqrt(D): embed_scale) (+ P[positions]: learned or sinusoidal)
    x_l = block_l(x_{l-1})          mixer (attention, MLA, Mamba, a recurrence) and FFN
    x_0 (+ S[token types]) (then norm(x_0): embed_norm, BERT)
    logits = t(norm(x_L)) @ W_head (+ b)   (W_head = E^T if tied; no norm without final_norm;
                                    t the head transform of lm/heads.py or the identity)
             (-> c tanh(logits / c) with cfg.logit_softcap c: Gemma 2)
    loss = CE(logits, targets) + sum over layers of the FFN's aux terms
           (an MoE's balance_coef * aux + z_coef * z; none for a dense FFN)
           + (lambda / D) sum_k L^k of D multi-token-prediction modules (cfg.mtp; lm/mtp.py)

The backward runs the same chain in reverse: each Block calls its Modules' backwards, and the
residual adds the skip gradient. A Module owns its Params; the caches live in the calls. The
embedding and the head, forward and backward, are lm/ends.py's (LMEnds, which LM inherits).
A packed batch (`doc_ids`: several documents per row, Llama 3's document masking) attends
within each document only, at positions that restart at each document, so each document's
logits and gradients are what it alone would give.
Decoding (`init_state`, then `decode`) feeds one token per call through per-layer states: a
KVState (GQA), a RollingKVState (sliding window), a LatentKVState (MLA, absorbed form), and a
MambaState (conv and SSM state).

Glossary: B batch, T time, D model width, V vocabulary, L layers.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core import fused
from scratchllm.core.nn import Embedding, Linear, Module, Param
from scratchllm.core.validate import expect_int, expect_ndim
from scratchllm.lm.block import Block, make_packing
from scratchllm.lm.ends import EmbedCache, LMEnds
from scratchllm.lm.heads import HeadTransform
from scratchllm.lm.lean_decode import lean_decode, lean_step
from scratchllm.lm.mixers import make_norm
from scratchllm.lm.mtp import MTP
from scratchllm.lm.padding import padding_packing
from scratchllm.specs import ModelConfig


class LMCache(NamedTuple):
    embed: EmbedCache
    blocks: list
    norm: tuple
    head: tuple
    aux: list   # per layer: its FFN's weighted aux terms ((name, value), ...)
    softcap: tuple = None  # SoftcapCache of the capped logits (cfg.logit_softcap), else None
    last: np.ndarray = None  # x_L (B, T, D), the last block's output (what MTP reads)


class LossCache(NamedTuple):
    lm: LMCache
    ce_cache: tuple
    ce: float     # the cross-entropy part of the loss, nats/token
    aux: float    # the FFNs' weighted auxiliary part (MoE balance and z terms)
    mtp_cache: tuple = None  # MTPCache (with cfg.mtp), else None
    mtp: float = 0.0  # the weighted multi-token-prediction part, (lambda / D) sum_k L^k


class LM(LMEnds, Module):
    """The decoder LM of a ModelConfig; Params in float32 (default) or float64."""

    def __init__(self, cfg, *, rng, dtype=np.float32):
        if not isinstance(cfg, ModelConfig):
            raise TypeError(f"LM: cfg must be a ModelConfig (scratchllm.specs), got "
                            f"{type(cfg).__name__}")
        self.cfg = cfg
        try:
            self._build(cfg, rng, dtype)
        except MemoryError:
            raise MemoryError(
                f"LM: the weights of this config (d_model={cfg.d_model}, n_layers="
                f"{cfg.n_layers}, vocab_size={cfg.vocab_size}, {cfg.n_params():,} parameters) "
                f"in {np.dtype(dtype)} are more than this machine can allocate") from None

    def _build(self, cfg, rng, dtype):
        D, V = cfg.d_model, cfg.vocab_size
        self.embed = Embedding(V, D, rng=rng, dtype=dtype)
        if cfg.tie_embeddings and not getattr(rng, "skip_init", False):
            self.embed.E.data *= np.asarray(D ** -0.5, dtype)  # logits O(1) at init, E^T the head
        if cfg.positions == "learned":  # GPT-2's wpe: x_0 = E[ids] + P[positions]
            self.pos = Embedding(cfg.max_positions, D, rng=rng, dtype=dtype)
        if cfg.type_vocab_size:  # BERT's token types: x_0 += S[types]
            self.types = Embedding(cfg.type_vocab_size, D, rng=rng, dtype=dtype)
        self.embed_norm = make_norm(D, cfg.norm, dtype) if cfg.embed_norm else None
        self.layers = [Block(D, spec, rng=rng, dtype=dtype) for spec in cfg.layers]
        self.norm = make_norm(D, cfg.norm, dtype) if cfg.final_norm else None
        self.transform = HeadTransform(D, cfg.head, cfg.norm, rng=rng, dtype=dtype) \
            if cfg.head.transform else None
        self.head = None if cfg.tie_embeddings else Linear(D, V, rng=rng, dtype=dtype)
        self.head_bias = Param(np.zeros(V, dtype)) if cfg.head.bias else None
        self.mtp = None if cfg.mtp is None else MTP(cfg, rng=rng, dtype=dtype)  # lm/mtp.py

    @property
    def n_tokens(self):
        """The ids the model reads: [0, n_tokens) (a tensor-parallel slice reads them all)."""
        return self.cfg.vocab_size

    @property
    def dtype(self):
        return self.embed.E.data.dtype

    def named_buffers(self):
        """Non-trainable state saved in checkpoints: the MoE selection biases
        ("layers.{i}.ffn.selection_bias", and "mtp.depths.{k}.block..." of MTP modules)."""
        mtp = [] if self.mtp is None else [(f"mtp.depths.{k}.block.{name}", b)
                                           for k, mod in enumerate(self.mtp.depths)
                                           for name, b in mod.block.named_buffers()]
        return [(f"layers.{i}.{name}", b) for i, layer in enumerate(self.layers)
                for name, b in layer.named_buffers()] + mtp

    def forward(self, ids=None, *, input_ids=None, doc_ids=None, attention_mask=None,
                position_ids=None):
        """ids (B, T) ints -> (logits (B, T, V), LMCache); the ids positionally or as
        transformers' input_ids=, once. doc_ids (B, T) ints: a packed batch, each run of equal
        ids along a row one document; attention stays inside it and positions restart.
        attention_mask (B, T) 0/1, position_ids (B, T) or (T,) ints: transformers' padded
        batch (lm/padding.py: padding keys masked, positions the mask's cumulative sum unless
        position_ids gives them; the real tokens' logits are each row's alone)."""
        if (ids is None) == (input_ids is None):
            raise TypeError("LM.forward: give the token ids once, as forward(ids) or "
                            "forward(input_ids=ids)")
        return self._forward(input_ids if ids is None else ids, doc_ids=doc_ids,
                             attention_mask=attention_mask, positions=position_ids)

    def _forward(self, ids, types=None, doc_ids=None, attention_mask=None, positions="shift"):
        """forward with token types (B, T) (None: all 0) and a padded batch's positions
        (padding_packing's: "shift", "absolute" for BERT's 0..T-1, or position_ids)."""
        self._check_ids("LM", "ids", ids)
        if ids.shape[1] < 1:
            raise ValueError(f"LM: ids has shape {ids.shape}: no tokens (T must be >= 1)")
        given = not isinstance(positions, (str, type(None)))  # position_ids
        positions = "shift" if positions is None else positions
        if doc_ids is not None and (attention_mask is not None or given):
            raise ValueError("LM.forward: doc_ids (a packed batch, positions restarting per "
                             "document) or attention_mask / position_ids, not both")
        packing = None if doc_ids is None else make_packing("LM", ids, doc_ids)
        if attention_mask is not None or given:
            mask = np.ones(ids.shape, np.int64) if attention_mask is None else attention_mask
            packing = padding_packing("LM.forward", self, ids, mask, positions)
        x, c_emb = self._embed_forward(  # (B, T, D)
            ids, types=types, positions=None if packing is None else packing.positions)
        logits, cache = self.trunk_forward(x, packing)  # (B, T, V)
        return logits, cache._replace(embed=c_emb)

    def trunk_forward(self, x, packing=None):
        """Everything after the embedding: x_0 (B, T, D) (the embedding's output, or one a
        vision-language model has put image features into) [, packing: a packed batch's
        Packing] -> (logits (B, T, V), LMCache with embed None)."""
        x, cache = self._blocks_forward(x, packing)  # (B, T, D) x_L
        logits, (cn, ch, c_cap) = self.head_forward(x)  # (B, T, V)
        return logits, cache._replace(norm=cn, head=ch, softcap=c_cap)

    def _blocks_forward(self, x, packing=None):
        """x_0 -> (x_L (B, T, D), LMCache of the blocks, with x_L as .last)."""
        blocks = []
        for layer in self.layers:
            x, c = layer.forward(x, packing=packing)  # (B, T, D)
            blocks.append(c)
        aux = [layer.aux_losses(c) for layer, c in zip(self.layers, blocks)]
        return x, LMCache(None, blocks, None, None, aux, None, x)

    def _blocks_backward(self, dx, cache, dloss_aux):
        """Reverse of _blocks_forward: dx_L (B, T, D) -> dx_0."""
        for layer, c in zip(reversed(self.layers), reversed(cache.blocks)):
            dx = layer.backward(dx, c, dloss_aux)  # fwd: x_l = block_l(x_{l-1})
        return dx

    def residual_stream(self, ids):
        """The residual stream of a forward on ids (B, T): [x_0, x_1, ..., x_L], each
        (B, T, D), x_0 the embedding and x_l the output of block l (forward only; the logit
        lens and direct logit attribution read it)."""
        expect_int("LM.residual_stream", "ids", ids)
        expect_ndim("LM.residual_stream", "ids", ids, 2, "(B, T)")
        xs = [self._embed_forward(ids)[0]]  # (B, T, D)
        for layer in self.layers:
            xs.append(layer.forward(xs[-1])[0])  # (B, T, D)
        return xs

    def backward(self, dlogits, cache, dloss_aux=1.0, dlast=None):
        """dlogits (B, T, V) -> Param grads (+=). Every FFN aux term of the loss gets the
        gradient dloss_aux (an MoE layer's balance loss dloss_aux * balance_coef, its z-loss
        dloss_aux * z_coef); dlast (B, T, D): a gradient on x_L from beyond the head (MTP's)."""
        dx = self.trunk_backward(dlogits, cache, dloss_aux, dlast)  # (B, T, D)
        self.embed_backward(dx, cache.embed)

    def encode(self, ids):
        """An encoder's output: ids (B, T) -> (h (B, T, D), the final norm's output (x_L
        without final_norm), LMCache with head None): what pooling reads (core/pooling.py)."""
        self._check_ids("LM.encode", "ids", ids)
        x, c_emb = self._embed_forward(ids)  # (B, T, D)
        x, cache = self._blocks_forward(x)  # (B, T, D) x_L
        h, cn = self._norm_forward(x)  # (B, T, D)
        return h, cache._replace(embed=c_emb, norm=cn)

    def encode_backward(self, dh, cache, dloss_aux=0.0):
        """dh (B, T, D) of encode's output -> every Param's grad (+=) below the head
        (dloss_aux: the loss's gradient on the MoE aux terms, 0 when they are left out)."""
        dx = dh if cache.norm is None else self.norm.backward(dh, cache.norm)  # h = norm(x_L)
        self.embed_backward(self._blocks_backward(dx, cache, dloss_aux), cache.embed)

    def trunk_backward(self, dlogits, cache, dloss_aux=1.0, dlast=None):
        """The backward of trunk_forward: dlogits (B, T, V) -> dx_0 (B, T, D), the Params
        after the embedding getting their gradients (a tied head's into E); dlast as
        backward's."""
        dx = self.head_backward(dlogits, (cache.norm, cache.head, cache.softcap))  # (B, T, D)
        if dlast is not None:
            dx = dx + dlast  # fwd: x_L also feeds MTP module 1
        return self._blocks_backward(dx, cache, dloss_aux)  # fwd: x_L = blocks(x_0)

    def loss(self, ids, targets, doc_ids=None, attention_mask=None):
        """Cross-entropy of next tokens plus the FFNs' weighted auxiliary terms.

        Inputs: ids, targets (B, T) ints; doc_ids (B, T) ints for a packed batch, or
        attention_mask (B, T) 0/1 for a padded one (forward's; the padding's targets are
        left out, as -100; an MoE's aux terms still count every token).
        Returns: (loss 0-d array, LossCache with .ce).
        """
        if (doc_ids is not None or attention_mask is not None) and self.mtp is not None:
            raise ValueError("LM.loss: packed documents (doc_ids) or padding with MTP "
                             "modules, which would predict across them: train one or the other")
        packed = {} if doc_ids is None else {"doc_ids": doc_ids}  # (a subclass's forward
        if attention_mask is not None:                                # may take neither)
            packed = {"attention_mask": attention_mask}
            targets = np.where(np.asarray(attention_mask) == 1, targets, -100)  # (B, T)
        logits, cache = self.forward(ids, **packed)  # (B, T, V)
        ce, c_ce = fused.CROSS_ENTROPY.forward(logits, targets)
        aux = sum(sum(value for _, value in terms) for terms in cache.aux)
        mtp, c_mtp = (0.0, None) if self.mtp is None else \
            self.mtp.loss(self, cache.last, ids, targets)  # (lambda / D) sum_k L^k
        total = np.asarray(ce + aux + mtp, dtype=logits.dtype)
        return total, LossCache(cache, c_ce, float(ce), float(aux), c_mtp, float(mtp))

    def loss_backward(self, dloss, cache):
        """Gradients of `loss` (times dloss) into every Param.grad (+=)."""
        dlogits = fused.CROSS_ENTROPY.backward(np.asarray(dloss, self.dtype), cache.ce_cache)
        dlast = None if cache.mtp_cache is None else \
            self.mtp.loss_backward(self, dloss, cache.mtp_cache)  # (B, T, D)
        self.backward(dlogits["logits"], cache.lm, dloss_aux=dloss, dlast=dlast)

    def cross_entropy(self, ids, targets, doc_ids=None):
        """Mean next-token cross-entropy (nats/token), forward only (doc_ids: forward's)."""
        logits, _ = self.forward(ids, **({} if doc_ids is None else {"doc_ids": doc_ids}))
        return float(fused.CROSS_ENTROPY.forward(logits, targets)[0])

    def after_step(self, caches, across=None):
        """After an optimizer step, given the step's LossCache (or one per data-parallel
        shard): each FFN's after-step update, from its caches of every shard (an MoE layer's
        aux-loss-free bias update when its router's bias_gamma > 0, from the routed counts
        summed over shards). across: a function that sums an array over the data-parallel
        processes (their shards' counts too), or None. Returns [(layer, share of routed
        slots per expert)] for the MoE layers."""
        caches = caches if isinstance(caches, list) else [caches]
        stats = []
        for i, layer in enumerate(self.layers):
            share = layer.after_step([c.lm.blocks[i] for c in caches], across)  # (E,) or None
            if share is not None:
                stats.append((i, share))
        return stats

    def replica(self):
        """A model whose Params share .data with this one (weights updated in place show up
        in both) but own their .grad; buffers shared too. For data-parallel threads."""
        twin = type(self)(self.cfg, rng=np.random.default_rng(0), dtype=self.dtype)
        for p, q in zip(self.parameters(), twin.parameters()):
            q.data = p.data
        twin.share_buffers(self)
        return twin

    def share_buffers(self, other):
        """Point this model's MoE selection biases at other's arrays."""
        for mine, theirs in zip(self.layers, other.layers):
            mine.share_buffers(theirs)

    # ------------------------------------------------------------------ decoding
    def init_state(self, batch, max_len):
        """Per-layer decoding states for `batch` sequences of up to max_len tokens."""
        return DecodeState([None if layer.mixer is None else  # an MLP-only layer keeps nothing
                            layer.init_state(batch, max_len) for layer in self.layers],
                           batch)

    def prefill(self, ids, state):
        """The prompt ids (B, T) at positions 0..T-1 in one forward pass per layer, filling
        every layer's fresh state (from init_state) as T decode calls would. Returns the
        logits (B, T, V); decoding continues with decode(ids_t, state, T)."""
        self._check_ids("LM.prefill", "ids", ids, state=state)
        x, _ = self._embed_forward(ids)  # (B, T, D)
        return self.trunk_prefill(x, state)

    def _check_ids(self, fn, name, ids, *, state=None, per_step=False):
        """ids an integer array (B, T), or (B,) for one decoding step, every id in
        [0, vocab_size), and as many rows as a state from init_state was made for: errors
        name `fn`, the method the user called."""
        expect_int(fn, name, ids)
        expect_ndim(fn, name, ids, 1 if per_step else 2, "(B,)" if per_step else "(B, T)")
        V = self.n_tokens
        if ids.size and (ids.min() < 0 or ids.max() >= V):
            raise ValueError(f"{fn}: {name} must lie in [0, {V}) (the vocabulary), got values "
                             f"in [{ids.min()}, {ids.max()}]")
        batch = getattr(state, "batch", ids.shape[0])
        if ids.shape[0] != batch:
            raise ValueError(f"{fn}: {name} has {ids.shape[0]} rows, but the state was made "
                             f"for a batch of {batch} (init_state)")

    def trunk_prefill(self, x, state):
        """prefill after the embedding: x_0 (B, T, D) -> logits (B, T, V), filling state."""
        for layer, st in zip(self.layers, state):
            x = layer.prefill(x, st)  # (B, T, D)
        h, _ = self._norm_forward(x)  # (B, T, D)
        return self._cap(self._head_forward(h)[0])[0]  # (B, T, V)

    def decode(self, ids_t, state, position):
        """One token per sequence: ids_t (B,) at `position` -> logits (B, V); updates state.
        position is an int, or (B,) ints, one per row: requests at different lengths share a
        batch, a row at position 0 starts a new sequence (attention and MLA states only: a
        recurrent state keeps no positions, so its rows must stay in step)."""
        if np.ndim(position) and not all(st is None or hasattr(st, "lengths") for st in state):
            if (np.asarray(position) != np.asarray(position).flat[0]).any():
                raise ValueError("LM.decode: one position per row needs attention or MLA "
                                 "layers (a recurrent state keeps no positions); give the "
                                 "rows one int position")
        self._check_ids("LM.decode", "ids_t", ids_t, state=state, per_step=True)
        x, _ = self._embed_forward(ids_t[:, None], position)  # (B, 1, D)
        x = x[:, 0]  # (B, D)
        if lean_step(self, state, position):  # a plain Llama-style stack: lm/lean_decode.py
            x = lean_decode(self, x, state, position)  # (B, D)
        else:
            for layer, st in zip(self.layers, state):
                x = layer.decode(x, st, position)  # (B, D)
        h, _ = self._norm_forward(x)  # (B, D)
        return self._cap(self._head_forward(h)[0])[0]  # (B, V)


class DecodeState(list):
    """init_state's per-layer decoding states, with the batch they were made for (so decode
    and prefill can refuse ids of another batch by name)."""

    def __init__(self, states, batch):
        super().__init__(states)
        self.batch = batch


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
