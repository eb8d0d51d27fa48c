"""Expert parallelism inside the model (GShard, Lepikhin et al. 2020, arXiv:2006.16668;
DeepSeek-V3, arXiv:2412.19437 §3.4): the E experts of every MoE layer split over the P ranks of
an expert-parallel group, rank r owning experts r E/P .. (r+1) E/P - 1; every other weight
(attention, norms, routers, shared experts, embedding, head) is replicated.

The ranks of the group see the same data (their data-parallel slice, whole), so each runs the
replicated parts on every token, routes every token (the same choices, capacity drops and aux
losses as one process) and takes 1/P of the kept slots to dispatch:

    slots (M rows, sorted by expert)  ->  rank r's contiguous 1/P of them (a split: no message;
                                          its backward an all-gather of the rows' gradients)
        ->  dispatch all-to-all -> the owners' experts -> combine all-to-all
            (expert_parallel_forward: train/expert_parallel.py)
        ->  every rank's outputs on every rank (an all-gather; its backward keeps rank r's
            rows of the replicated gradient: a split, no message)

Both split/gather pairs are Megatron's for a replicated region next to a split one: the
gradient arriving from replicated work is the same on every rank, so the gather's backward
takes its slice instead of reduce-scattering P equal copies. The experts' weight gradients stay
with their owner, summed over every rank's rows; the replicated Params' gradients are whole
on every rank. Checkpoints hold the whole model (parallel_slices.py).

The balance loss of an MoE layer is computed per data shard (each rank's micro-batch, as
each device computes it in Switch and GShard); balance_loss_across_forward is the option that
computes it over every data-parallel rank's tokens together (`train --balance-across-ranks`):
the routed counts and the probability sums all-reduced first. A batch can be balanced as a
whole while each micro-batch sends its tokens to a few experts: only the per-shard loss sees
(and penalises) that, and per-shard imbalance is what overflows an expert's capacity on a device.

Glossary: M kept slots, D width, E experts, P ranks, F expert width, BT tokens, N every rank's
tokens.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.nn import NO_DRAWS
from scratchllm.core.validate import expect_dout, expect_float, expect_shape
from scratchllm.dist import all_gather_forward, all_reduce_backward, all_reduce_forward
from scratchllm.lm import LM
from scratchllm.moe import MoE
from scratchllm.moe.experts import capacity_of
from scratchllm.moe.layer import moe_forward
from scratchllm.moe.losses import (balance_loss_backward, balance_loss_forward,
                                   check_balance_inputs)
from scratchllm.specs import MoESpec
from scratchllm.train.expert_parallel import expert_parallel_backward, expert_parallel_forward
from scratchllm.train.parallel_build import build_part
from scratchllm.train.parallel_slices import SlicedLM

EXPERT_PARAMS = ("w1", "w3", "w2")  # the SwiGLU experts' stacks, split along E (axis 0)


def check_expert_parallel(cfg, P):
    """ValueError naming what of cfg expert parallelism over P ranks does not cover: top-k
    MoE layers of SwiGLU experts (no Switch layer), E a multiple of P; at least one. (MTP
    modules' experts stay whole on every rank.)"""
    bad, moe = [], 0
    for i, spec in enumerate(cfg.layers):
        f = spec.ffn
        if not isinstance(f, MoESpec):
            continue
        moe += 1
        if f.expert_capacity is not None or f.experts.kind != "swiglu":
            bad.append(f"layer {i}'s MoE (top-k SwiGLU experts only, not "
                       f"{'Switch' if f.expert_capacity is not None else f.experts.kind!r})")
        elif f.router.n_experts % P:
            bad.append(f"layer {i}'s {f.router.n_experts} experts (not a multiple of {P})")
    if not moe:
        bad.append("dense FFNs (no MoE layer: there are no experts to split)")
    if bad:
        raise ValueError(f"--ep {P}: expert parallelism does not cover {cfg.name}'s "
                         f"{'; '.join(bad)}")


def _slot_split(M, P):
    """[slots of each rank]: M kept slots cut into P contiguous runs (np.array_split)."""
    return [len(c) for c in np.array_split(np.arange(M), P)]


def expert_bytes(bounds, rank, n_ranks, row_bytes):
    """{"ep all_to_all": bytes, "ep all_gather": bytes} one MoE layer's step (forward and
    backward) sends from this rank, from its routing: bounds (E+1,) the edges of each
    expert's kept slots (sorted by expert), row_bytes = D x itemsize. Rank r takes the run
    S_r of the slots and owns the run O_r of its experts' slots (contiguous: sorted by expert);
    the dispatch sends S_r minus O_r, the combine sends back O_r minus S_r, their backwards
    the reverse, so 2(|S_r - O_r| + |O_r - S_r|) rows; each all-gather (the outputs forward,
    the inputs' gradients backward) sends every run but the successor's (the ring's)."""
    P, r, M = n_ranks, rank, int(bounds[-1])
    E_local = (len(bounds) - 1) // P
    counts = _slot_split(M, P)
    lo = sum(counts[:r])
    hi = lo + counts[r]
    a, b = int(bounds[r * E_local]), int(bounds[(r + 1) * E_local])  # O_r
    both = max(0, min(hi, b) - max(lo, a))
    moved = (hi - lo - both) + (b - a - both)
    return {"ep all_to_all": 2 * moved * row_bytes,
            "ep all_gather": 2 * (M - counts[(r + 1) % P]) * row_bytes}


def expert_bytes_bound(cfg, n_ranks, tokens, itemsize):
    """{"ep all_to_all (at most)": ..., "ep all_gather (at most)": ...} a step sends over the
    MoE layers for `tokens` tokens on the rank, from the config: M <= min(N k, E C) kept slots
    (C the capacity, N k without one), every slot of the rank's run leaving it and every slot
    of its experts arriving (<= M rows each way), the all-gathers' M - floor(M/P) rows."""
    a2a = gather = 0
    for spec in cfg.layers:
        f = spec.ffn
        if not isinstance(f, MoESpec):
            continue
        E, k = f.router.n_experts, f.router.top_k
        M = min(tokens * k, E * capacity_of(tokens, k, E, f.capacity_factor))
        row = cfg.d_model * itemsize
        a2a += 2 * M * row
        gather += 2 * (M - M // n_ranks) * row
    return {"ep all_to_all (at most)": a2a, "ep all_gather (at most)": gather}


class ExpertShard:
    """moe_forward's experts= hook for one MoE Module over an expert-parallel group: its Params
    w1, w3 (E/P, D, F), w2 (E/P, F, D) are this rank's experts. tally: a dict to which each
    backward adds the bytes its step's all-to-alls and gathers send (expert_bytes)."""

    def __init__(self, module, group, tally=None):
        self.module, self.group = module, group
        self.tally = {} if tally is None else tally

    def check(self, fn, x, w):
        """x (..., D) float; w_router (D, E) with E = P x the E/P experts of w1, w3, w2.
        Returns (x as (BT, D), E, F)."""
        expect_float(fn, "x", x, 1)
        D, P = x.shape[-1], self.group.size
        expect_shape(fn, "w_router", w.w_router, (D, None), f"(D, E) with D = {D}")
        E = w.w_router.shape[1]
        expect_shape(fn, "w1", w.w1, (E // P, D, None),
                     f"(E/P, D, F): this rank's {E // P} of {E} experts on {P} ranks")
        expect_shape(fn, "w3", w.w3, w.w1.shape, "(E/P, D, F), like w1")
        expect_shape(fn, "w2", w.w2, (E // P, w.w1.shape[2], D), "(E/P, F, D), matching w1")
        return x.reshape(-1, D), E, w.w1.shape[2]

    def _rows(self, M):
        """(rows of each rank, this rank's lo, hi) of M slots cut into P contiguous runs."""
        counts = _slot_split(M, self.group.size)
        lo = sum(counts[:self.group.rank])
        return counts, lo, lo + counts[self.group.rank]

    def forward(self, xs, bounds):
        """xs (M, D), every kept slot's input sorted by expert with bounds (E+1,) -> (ys (M, D)
        on every rank, cache)."""
        counts, lo, hi = self._rows(len(xs))
        mine = np.clip(np.asarray(bounds) - lo, 0, hi - lo)  # (E+1,) edges inside lo..hi
        m = self.module
        ys, c = expert_parallel_forward(xs[lo:hi], mine, m.w1.data, m.w3.data, m.w2.data,
                                        group=self.group)  # fwd: split, experts on the owners
        ys, _ = all_gather_forward(ys, group=self.group, counts=counts)  # fwd: gather
        return ys, (c, counts, lo, hi, np.asarray(bounds))

    def backward(self, dys, cache):
        """dys (M, D), the same on every rank -> {"xs": dxs (M, D) on every rank, "w1", "w3",
        "w2": this rank's experts' gradients over every rank's rows}."""
        c, counts, lo, hi, bounds = cache
        g = expert_parallel_backward(dys[lo:hi], c)  # fwd: gather (backward: keep my rows)
        dxs, _ = all_gather_forward(g.pop("xs"), group=self.group, counts=counts)  # fwd: split
        # a training step's (forward and backward; an evaluation's forwards are not counted)
        for op, n in expert_bytes(bounds, self.group.rank, self.group.size,
                                  dys.shape[1] * dys.itemsize).items():
            self.tally[op] = self.tally.get(op, 0) + n
        return dict(g, xs=dxs)


class ExpertParallelLM(SlicedLM, LM):
    """This rank's share of an LM of cfg over an expert-parallel group: E/P experts of each MoE
    layer, every other weight whole. Built from the one-process model of the seed and cut, so
    it starts from the same weights; loss, loss_backward and cross_entropy as LM's (the same
    values on every rank of the group)."""

    serial_shards = True  # data-parallel threads run their shards one at a time (parallel.py)

    def __init__(self, cfg, group, *, rng, dtype=np.float32):
        check_expert_parallel(cfg, group.size)
        super().__init__(cfg, rng=NO_DRAWS, dtype=dtype)  # untouched pages
        self.group = group  # the seed's draws replayed, each expert stack sliced as drawn
        self.take_parts(build_part(cfg, rng, dtype, self._slice))
        self.tally, self.routed_bytes = {}, {}  # the all-to-alls' and gathers' bytes: this
        self.twin_groups, self.twin_tallies = [], []  # step's so far, the last step's
        # (expert_bytes); and replica()'s twins' groups and tallies
        for layer in self.layers:
            if isinstance(layer.ffn, MoE):
                self._hook(layer.ffn)

    def split_axis(self, name):
        """0 for an MoE layer's expert stacks (layers.i.ffn.w1/w3/w2), else None."""
        layer, _, param = name.rpartition(".")
        if param in EXPERT_PARAMS and layer.endswith("ffn") and layer.startswith("layers."):
            return 0 if isinstance(self.layers[int(layer.split(".")[1])].ffn, MoE) else None
        return None

    def after_step(self, caches, across=None):
        """LM.after_step; and the step's expert-parallel bytes from its routing kept in
        routed_bytes."""
        self.routed_bytes = {}
        for tally in [self.tally] + self.twin_tallies:  # this thread's, the other shards'
            for op, n in tally.items():
                self.routed_bytes[op] = self.routed_bytes.get(op, 0) + n
            tally.clear()  # (the dict each of a model's ExpertShards adds to)
        return super().after_step(caches, across)

    def bytes_bound(self, shards, seq_len):
        """The config's bound on a step's expert-parallel bytes (expert_bytes_bound) for this
        rank's data shards of `shards` sequences each (one per thread) of seq_len tokens."""
        out = {}
        for n in shards:
            for op, b in expert_bytes_bound(self.cfg, self.group.size, n * seq_len,
                                            self.dtype.itemsize).items():
                out[op] = out.get(op, 0) + b
        return out

    def _hook(self, ffn):
        shard = ExpertShard(ffn, self.group, self.tally)

        set_moe_hooks(ffn, experts=shard)

    def replica(self):
        """A data-parallel thread's twin: the same Params' data (its own .grad), the same
        buffers, and its experts' collectives on a twin of the group (Group.twin: each
        thread's all-to-alls apart); collective, made in the same order on every rank."""
        twin = ExpertParallelLM(self.cfg, self.group.twin(), rng=NO_DRAWS, dtype=self.dtype)
        for p, q in zip(self.parameters(), twin.parameters()):
            q.data = p.data
        twin.share_buffers(self)
        self.twin_groups.append(twin.group)  # (not the twin itself: a Module in a list
        self.twin_tallies.append(twin.tally)  # attribute would join this one's Params)
        return twin

    def groups(self):
        """This model's expert-parallel group and its threads' twins' (for the bytes sent)."""
        return [self.group] + self.twin_groups


def set_moe_hooks(ffn, **hooks):
    """ffn.forward (an MoEFFN's) becomes moe_forward with the given hooks (experts=,
    balance=) and those it had (an instance attribute: the Module and its Params unchanged)."""
    ffn.moe_hooks = dict(getattr(ffn, "moe_hooks", {}), **hooks)

    def forward(x):  # MoEFFN.forward with the hooks
        out, cache = moe_forward(x, ffn.weights(), spec=ffn.spec,
                                 selection_bias=ffn.selection_bias, **ffn.moe_hooks)
        return out.y, cache

    ffn.forward = forward


# ---------------------------------------------------------------------------- balance loss
class AcrossCache(NamedTuple):
    f: np.ndarray  # (E,) routed share over every rank's slots, a constant
    BT: int        # this rank's tokens
    N: int         # every rank's tokens
    sums: tuple    # the probability sums' all-reduce cache


def balance_loss_across_forward(probs, topk_idx, *, group):
    """The Switch balance loss of every rank's tokens together, the same value on every rank:
    L = E sum_i f_i P_i, f_i = (slots routed to expert i on every rank) / (every rank's BT k),
    a constant; P_i = S_i / N, S_i = sum over every rank's tokens of p_ni (an all-reduce), N
    every rank's tokens. On one rank it is balance_loss_forward.

    Inputs: probs (BT, E), topk_idx (BT, K) ints in [0, E) of this rank's tokens.
    Returns: (L 0-d array, AcrossCache).
    """
    check_balance_inputs("balance_loss_across", probs, topk_idx)
    BT, E = probs.shape
    counts = np.concatenate([np.bincount(topk_idx.ravel(), minlength=E), [BT, topk_idx.size]])
    counts, _ = all_reduce_forward(counts.astype(np.float64), group=group)  # constants
    S, c_sum = all_reduce_forward(probs.sum(axis=0), group=group)  # fwd: (E,) over ranks
    N = int(counts[E])
    f = (counts[:E] / max(counts[E + 1], 1)).astype(probs.dtype)  # (E,)
    loss = E * np.dot(f, S) / max(N, 1)
    return np.asarray(loss, probs.dtype), AcrossCache(f, BT, N, c_sum)


def balance_loss_across_backward(dloss, cache):
    """Each rank's copy of L enters its own rank's loss (weighted by dloss_r there), so the
    whole loss's derivative is sum_r dloss_r dL: with dL/dS_i = E f_i / N on every rank, the
    all-reduce pair's backward (an all-reduce) sums it, and dp_ni = dS_i for every one of this
    rank's tokens n (S_i sums them).
    Reference: Switch Transformer (arXiv 2101.03961) eq. (4), its f and P over the group."""
    f, BT, N, c_sum = cache
    expect_dout("balance_loss_across_backward", dloss, (), f.dtype, name="dloss")
    E = f.shape[0]
    dS = np.asarray(dloss, f.dtype) * (E / max(N, 1)) * f  # (E,)  fwd: L = E f . S / N
    dS = all_reduce_backward(dS, c_sum)["x"]  # fwd: S = sum over the ranks
    return {"probs": np.broadcast_to(dS, (BT, E)).copy()}  # fwd: S_i = sum_n p_ni


class BalanceAcross:
    """moe_forward's balance= hook: while .on, the balance loss over every rank of group's
    tokens (balance_loss_across_forward); off, this rank's own (balance_loss_forward), so a
    forward outside training (evaluation: ranks take different numbers of batches) sends
    nothing."""

    def __init__(self, group):
        self.group, self.on = group, False

    def forward(self, probs, topk_idx):
        if not self.on:
            return balance_loss_forward(probs, topk_idx)
        return balance_loss_across_forward(probs, topk_idx, group=self.group)

    def backward(self, dloss, cache):
        if isinstance(cache, AcrossCache):
            return balance_loss_across_backward(dloss, cache)
        return balance_loss_backward(dloss, cache)


def balance_across(model, group):
    """Every top-k MoE layer of model takes its balance loss over the tokens of every rank of
    group in model.loss (the training step's forward); returns the bytes of the all-reduces
    that adds per step ([counts, sums, their gradient] per layer: the communication model's)."""
    hook, sizes = BalanceAcross(group), []
    for layer in model.layers:
        if isinstance(layer.ffn, MoE):
            set_moe_hooks(layer.ffn, balance=hook)
            E = layer.ffn.spec.router.n_experts
            sizes += [8 * (E + 2), E * model.dtype.itemsize, E * model.dtype.itemsize]
    if not sizes:
        raise ValueError("--balance-across-ranks: the model has no top-k MoE layer (no balance "
                         "loss to compute across ranks)")
    loss = model.loss

    def loss_across(*args, **kwargs):
        hook.on = True
        try:
            return loss(*args, **kwargs)
        finally:
            hook.on = False

    model.loss = loss_across
    return sizes
