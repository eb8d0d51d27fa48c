"""Tensor parallelism inside the model (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053;
sequence parallelism, Korthikanti et al. 2022, arXiv:2205.05198): an LM whose attention heads,
SwiGLU hidden units and vocabulary are split over the P ranks of a tensor-parallel group.

    weight          split                     rank r holds
    mixer.wq/wk/wv  columns, by heads         its H/P query heads and Hkv/P key/value heads
    mixer.wo        rows (the heads' rows)    a partial sum of the block's output
    ffn.W1, W3      columns                   d_ff/P hidden units
    ffn.W2          rows                      a partial sum
    embed.E         rows (the vocabulary)     V/P rows: dist.vocab_embedding_forward
    head.W          columns (the vocabulary)  V/P logits: dist.vocab_cross_entropy_forward
    norms           replicated

A sub-layer is a tensor-parallel region: its input enters through f (identity forward,
all-reduce backward) and its partial output leaves through g (all-reduce forward, identity
backward), so a block costs two all-reduces forward and two backward. With sequence
parallelism the residual stream between the regions is split along T instead of replicated:
f becomes an all-gather along T and g a reduce-scatter along T (the same bytes: an all-reduce
is a reduce-scatter then an all-gather), the norms run on 1/P of the tokens, and their
replicated gains' gradients, partial per rank, are all-reduced after the backward.

Every rank replays the one-process model's draws from the seed and keeps its slice of each
weight as it is drawn (parallel_build.py: never the whole model at once), so a TP run starts
from the same weights as one process; `gather_on_root` and `load_full` map between the two
(checkpoints hold the whole model, so they load in one process and on any grid:
parallel_slices.py). The regions
are hooked by replacing the mixer's, the FFN's and the head's bound forward and backward
(instance attributes: the Modules and their Param names are those of the one-process LM).
"""
from dataclasses import replace

import numpy as np

from scratchllm.core.nn import NO_DRAWS
from scratchllm.dist import (all_gather_backward, all_gather_forward, all_reduce_forward,
                             copy_to_group_backward, copy_to_group_forward,
                             reduce_from_group_backward, reduce_from_group_forward,
                             reduce_scatter_backward, reduce_scatter_forward,
                             vocab_cross_entropy_backward, vocab_cross_entropy_forward,
                             vocab_embedding_backward, vocab_embedding_forward)
from scratchllm.lm import LM
from scratchllm.lm.ends import EmbedCache
from scratchllm.lm.model import LossCache
from scratchllm.train.parallel_build import build_part
from scratchllm.train.parallel_slices import SlicedLM

SPLITS = {"mixer.wq": 1, "mixer.wk": 1, "mixer.wv": 1, "mixer.wo": 0, "ffn.W1": 1, "ffn.W3": 1,
          "ffn.W2": 0, "embed.E": 0, "head.W": 1}


def split_axis(name):
    """The axis a Param of this name is split along over the tensor-parallel ranks (None:
    replicated)."""
    return next((axis for suffix, axis in SPLITS.items() if name.endswith(suffix)), None)


def check_tensor_parallel(cfg, P):
    """ValueError naming what of cfg tensor parallelism over P ranks does not cover."""
    bad = [what for what, yes in (
        ("tied embeddings", cfg.tie_embeddings), ("a head bias", cfg.head.bias),
        ("a head transform", cfg.head.transform), ("a logit soft-cap", cfg.logit_softcap),
        ("an embedding scale", cfg.embed_scale), ("an embedding norm", cfg.embed_norm),
        ("learned or token-type positions", cfg.positions == "learned" or cfg.type_vocab_size),
        ("a pad id", cfg.pad_id is not None)) if yes]
    if cfg.vocab_size % P:
        bad.append(f"vocab_size {cfg.vocab_size} (not a multiple of {P})")
    for i, spec in enumerate(cfg.layers):
        m, f = spec.mixer, spec.ffn
        if type(m).__name__ != "AttentionSpec" or m.o_bias or m.qk_norm or m.sinks or \
                m.position_bias is not None or m.output_gate:
            bad.append(f"layer {i}'s mixer (tensor parallel splits plain attention heads: no "
                       f"output bias, QK-norm, sinks, position bias or output gate)")
        elif m.n_heads % P or m.n_kv_heads % P:
            bad.append(f"layer {i}'s {m.n_heads} heads / {m.n_kv_heads} KV heads (not "
                       f"multiples of {P})")
        if f is None or getattr(f, "kind", None) != "swiglu":
            bad.append(f"layer {i}'s FFN (tensor parallel splits a SwiGLU FFN)")
        elif f.d_ff % P:
            bad.append(f"layer {i}'s d_ff {f.d_ff} (not a multiple of {P})")
        if spec.placement != "pre":
            bad.append(f"layer {i}'s placement {spec.placement!r} (pre-norm only)")
    if bad:
        raise ValueError(f"--tp {P}: tensor parallelism does not cover {cfg.name}'s "
                         f"{'; '.join(bad)}")


def local_config(cfg, P):
    """The config of one rank's slice: V/P, H/P and Hkv/P heads of the full head_dim,
    d_ff/P."""
    layers = tuple(replace(s, mixer=replace(
        s.mixer, n_heads=s.mixer.n_heads // P, n_kv_heads=s.mixer.n_kv_heads // P,
        head_dim=s.mixer.head_dim or cfg.d_model // s.mixer.n_heads),
        ffn=replace(s.ffn, d_ff=s.ffn.d_ff // P)) for s in cfg.layers)
    return replace(cfg, vocab_size=cfg.vocab_size // P, layers=layers)


def _no_packing(doc_ids):
    """Packed documents (doc_ids, restarted positions) are not split for tensor parallel."""
    if doc_ids is not None:
        raise ValueError("tensor parallel (--tp) with packed documents (--pack-documents) is "
                         "not available: train one or the other")


class MegatronLM(SlicedLM, LM):
    """This rank's slice of an LM of cfg over a tensor-parallel group; loss, loss_backward and
    cross_entropy as LM's (the loss replicated on every rank of the group)."""

    def __init__(self, cfg, group, *, rng, dtype=np.float32, sequence=False):
        """rng: the one-process model's init RNG (the whole model is built from it and
        sliced); sequence: sequence parallelism (T must split into group.size blocks)."""
        check_tensor_parallel(cfg, group.size)
        super().__init__(local_config(cfg, group.size), rng=NO_DRAWS, dtype=dtype)  # untouched
        self.full_cfg, self.group, self.sequence = cfg, group, sequence
        self.take_parts(build_part(cfg, rng, dtype, self._slice))  # the seed's, sliced
        for layer in self.layers:
            self._region(layer.mixer)
            self._region(layer.ffn)
        self._enter_only(self.head)

    @property
    def n_tokens(self):
        """The whole vocabulary's ids, though this rank holds V/P rows of the embedding."""
        return self.full_cfg.vocab_size

    # ------------------------------------------------------------------ the regions
    def _enter(self, x):
        if self.sequence:  # fwd: the tokens of every rank (all-gather along T)
            return all_gather_forward(x, group=self.group, axis=1)
        return copy_to_group_forward(x, group=self.group)  # fwd: f

    def _enter_back(self, dy, cache):
        return (all_gather_backward if self.sequence else copy_to_group_backward)(dy, cache)["x"]

    def _leave(self, z):
        if self.sequence:  # fwd: rank r's tokens of the sum (reduce-scatter along T)
            return reduce_scatter_forward(z, group=self.group, axis=1)
        return reduce_from_group_forward(z, group=self.group)  # fwd: g

    def _leave_back(self, dy, cache):
        back = reduce_scatter_backward if self.sequence else reduce_from_group_backward
        return back(dy, cache)["x"]

    def _region(self, module):
        """module.forward(a) -> leave(inner(enter(a))); backward in reverse (an FFN's
        backward takes the aux-loss gradient too: passed through)."""
        forward, backward = module.forward, module.backward

        def region_forward(a):
            a, c_in = self._enter(a)
            z, c = forward(a)
            y, c_out = self._leave(z)
            return y, (c_in, c, c_out)

        def region_backward(dy, cache, *rest):
            c_in, c, c_out = cache
            dz = self._leave_back(dy, c_out)
            return self._enter_back(backward(dz, c, *rest), c_in)

        module.forward, module.backward = region_forward, region_backward

    def _enter_only(self, module):
        """The column-parallel head: module.forward(enter(h)); its dh through enter's
        backward."""
        forward, backward = module.forward, module.backward

        def head_forward(h):
            h, c_in = self._enter(h)
            logits, c = forward(h)
            return logits, (c_in, c)

        def head_backward(dlogits, cache):
            return self._enter_back(backward(dlogits, cache[1]), cache[0])

        module.forward, module.backward = head_forward, head_backward

    # ------------------------------------------------------------------ embedding and loss
    def _embed_forward(self, ids, start=0, types=None, positions=None):
        _no_packing(positions)
        if self.sequence and ids.shape[1] % self.group.size:
            raise ValueError(f"sequence parallel: T = {ids.shape[1]} tokens do not split into "
                             f"{self.group.size} equal blocks (make --seq-len a multiple)")
        x, c = vocab_embedding_forward(ids, self.embed.E.data, group=self.group,
                                       sequence=self.sequence)  # (B, T or T/P, D)
        return x, EmbedCache(c, None, None, None, None)

    def backward(self, dlogits, cache, dloss_aux=1.0):
        """LM.backward with the vocab-parallel embedding; with sequence parallelism the
        replicated Params' gradients (partial: this rank's tokens) are summed over the
        group."""
        dx = self.trunk_backward(dlogits, cache, dloss_aux)  # (B, T or T/P, D)
        self.embed_backward(dx, cache.embed)
        if self.sequence:
            shared = [p for n, p in self.named_parameters() if split_axis(n) is None]
            total, _ = all_reduce_forward(np.concatenate([p.grad.ravel() for p in shared]),
                                          group=self.group)
            start = 0
            for p in shared:
                p.grad[...] = total[start:start + p.grad.size].reshape(p.grad.shape)
                start += p.grad.size

    def embed_backward(self, dx, c_emb):
        """The vocab-parallel embedding's backward: dx_0 -> this rank's rows of E (+=)."""
        self.embed.E.grad += vocab_embedding_backward(dx, c_emb.tok)["E"]

    def ce_forward(self, logits, targets):
        """The vocab-parallel cross-entropy of this rank's logits columns (a pipeline's last
        stage calls it in the fused pair's place)."""
        return vocab_cross_entropy_forward(logits, targets, group=self.group)

    def ce_backward(self, dloss, cache):
        return vocab_cross_entropy_backward(dloss, cache)

    def loss(self, ids, targets, doc_ids=None):
        _no_packing(doc_ids)
        logits, cache = self.forward(ids)  # (B, T, V/P)
        ce, c_ce = vocab_cross_entropy_forward(logits, targets, group=self.group)
        return ce, LossCache(cache, c_ce, float(ce), 0.0)

    def loss_backward(self, dloss, cache):
        dlogits = vocab_cross_entropy_backward(np.asarray(dloss, self.dtype), cache.ce_cache)
        self.backward(dlogits["logits"], cache.lm)

    def cross_entropy(self, ids, targets, doc_ids=None):
        _no_packing(doc_ids)
        logits, _ = self.forward(ids)
        return float(vocab_cross_entropy_forward(logits, targets, group=self.group)[0])

    def replica(self):
        raise ValueError("tensor parallel: one data shard per rank (no --threads above 1)")

    def split_axis(self, name):
        """The axis Param `name` is split along over the group (None: replicated)."""
        return split_axis(name)

    def bytes_per_step(self, batch, seq_len, stage=None):
        """{collective: bytes this rank sends over the group in one step on `batch`
        sequences of seq_len}: the regions' f/g (or all-gather/reduce-scatter) per block and
        at the ends, and the cross-entropy's three exchanges of N = batch x seq_len numbers.
        stage: a PipelineStage of this model (its blocks; the embedding on the first stage,
        the head and loss on the last), or None for the whole model."""
        P, item = self.group.size, self.dtype.itemsize
        if P == 1:
            return {}
        if stage is not None:  # (sequence parallelism does not run in stages)
            return self._stage_bytes(batch * seq_len, stage)
        N = batch * seq_len
        act = N * self.cfg.d_model * item  # one (B, T, D) activation
        out = {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0}
        regions = 2 * len(self.layers)  # a mixer and an FFN per block
        if self.sequence:
            shard = act // P
            out["reduce_scatter"] += (P - 1) * act // P  # the embedding
            out["all_gather"] += (regions + 1) * (P - 1) * shard  # enter (and the head's)
            out["all_gather"] += (P - 1) * shard  # the embedding's backward
            out["reduce_scatter"] += regions * (P - 1) * act // P  # leave
            out["reduce_scatter"] += (regions + 1) * (P - 1) * act // P  # enter's backward
            out["all_gather"] += regions * (P - 1) * shard  # leave's backward
            shared = sum(p.data.size for n, p in self.named_parameters()
                         if split_axis(n) is None)
            out["all_reduce"] += 2 * (P - 1) * shared * item // P
        else:
            ar = 2 * (P - 1) * act // P
            out["all_reduce"] += ar + 2 * regions * ar + ar  # g, f's backward, the head's f
        out["all_gather"] += (P - 1) * N * item  # the row maxima
        out["all_reduce"] += 2 * (2 * (P - 1) * N * item // P)  # sum of exp, target logits
        return {k: v for k, v in out.items() if v}

    def _stage_bytes(self, N, stage):
        """bytes_per_step of a pipeline stage's parts on N tokens (no sequence parallelism)."""
        P, item = self.group.size, self.dtype.itemsize
        ar = 2 * (P - 1) * N * self.cfg.d_model * item // P  # one (B, T, D) all-reduce
        out = {"all_reduce": 2 * 2 * len(stage.layer_ids) * ar}  # each region's g and f
        if stage.first:
            out["all_reduce"] += ar  # the embedding's g
        if stage.last:  # the head's f (its backward), the cross-entropy's exchanges
            out["all_reduce"] += ar + 2 * (2 * (P - 1) * N * item // P)
            out["all_gather"] = (P - 1) * N * item
        return out
