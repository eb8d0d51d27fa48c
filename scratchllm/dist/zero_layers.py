"""ZeRO stages 2 and 3 (Rajbhandari et al. 2020, arXiv:1910.02054, section 5) inside the
step: gradients (stage 2) and weights (stage 3) sharded over the data-parallel ranks, unit by
unit, as the forward and backward reach each unit.

The Params fall into units: one per block (model.layers) and one for the rest (the embedding,
the final norm and the head; a tied head uses the embedding at both ends of the step). Each
Param is owned by one rank: the partition of ZeroAdamW (zero.py), so the rank that holds a
Param's gradient is the one that updates it.

    stage 2   a block's backward  ->  reduce-scatter-v of its gradients: rank r keeps the
              summed gradients of the Params it owns and releases the others
              (the rest's gradients after the whole backward)  ->  clip with the norm summed
              over the ranks  ->  AdamW on its Params  ->  all-gather-v of the updated Params
    stage 3   as stage 2, but a rank keeps only its Params' weights: a block's weights are
              all-gathered just before its forward and again before its backward, and
              released after each; the rest is gathered for the whole step. No all-gather
              after the update: the next step gathers on use.

The all-gather of the weights and the reduce-scatter of their gradients are one pair
(collectives.py): a gathered weight W = [W_0; ...; W_{P-1}] is all_gather_forward of the
shards, so the shard's gradient is all_gather_backward of dW, the reduce-scatter. Per step a
rank sends, for each unit of n bytes of which its successor owns s and it owns o: stage 2,
n - o (reduce-scatter) and, once for the whole model, N - S (the update's all-gather); stage
3, n - o and (n - s) per gather (two per block, one for the rest).

Memory: between steps a rank holds its Params' gradients only (stage 2) and its Params'
weights only (stage 3); during the step one block's gradients (and weights) at a time, plus
whatever the forward caches keep. Weights released are read-only zero views of the same shape
(a stray read gives zeros, a stray write raises). At stage 3 a rank builds only its own Params
(train/parallel_build.py: the seed's draws replayed, the others released as they are made);
an evaluation gathers each block on use as the step does (`evaluation()`: every rank runs as
many forwards), and a checkpoint gathers the weights on rank 0 alone (`on_root()`).

The units are hooked by replacing each block's bound forward and backward with gathering
versions (instance attributes; the block's class is untouched and its Params keep their names).
One data shard per rank (no data-parallel threads: their replicas would miss the hooks).
"""
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from scratchllm.dist.collectives import all_gather_forward, reduce_scatter_forward


class ZeroUnit(NamedTuple):
    """Params gathered and reduced together, in the order of the flat buffers (by owner,
    then model order)."""
    name: str
    params: list
    owners: list    # the owner rank of each Param
    counts: tuple   # elements per rank


def released(p):
    """A read-only, zero-strided zero array of p.data's shape and dtype (one element held)."""
    return np.broadcast_to(np.zeros((), p.data.dtype), p.data.shape)


def empty_grad(p):
    """A zero-strided grad placeholder that zero_grad may write (one element held)."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, p.data.dtype), p.data.shape,
                                           (0,) * p.data.ndim)


class ShardedModel:
    """ZeRO stage 2 or 3 hooks on a model with `.layers` (blocks with forward(x, ...) and
    backward(dy, cache, ...)) over a data-parallel group. The trainer calls begin_step()
    before the step's forward and end_backward() after its backward; evaluation, saving and
    loading run inside gathered()."""

    def __init__(self, model, owners, group, stage):
        """owners: {id(Param): owner rank} (ZeroAdamW.owners()); stage: 2 or 3."""
        if stage not in (2, 3):
            raise ValueError(f"ShardedModel: stage must be 2 or 3, got {stage!r}")
        self.group, self.stage, self.rank = group, stage, group.rank
        in_layers, self.units = set(), []
        for i, layer in enumerate(model.layers):
            params = [p for _, p in layer.named_parameters()]
            clash = [p for p in params if id(p) in in_layers]
            if clash:
                raise ValueError(f"ShardedModel: block {i} shares a Param with another block; "
                                 f"ZeRO-{stage} gathers one block at a time")
            in_layers.update(id(p) for p in params)
            self.units.append(self._unit(f"layers.{i}", params, owners))
        rest = [p for p in model.parameters() if id(p) not in in_layers]
        self.rest = self._unit("rest", rest, owners)
        self.resident = set()  # names of the units whose weights are gathered now
        self.whole = False     # gathered() or gather_all(): every unit resident
        for unit in self.units + [self.rest]:
            for p, r in zip(unit.params, unit.owners):
                if r != self.rank:
                    p.grad = empty_grad(p)
                    if stage == 3:
                        p.data = released(p)
        for layer, unit in zip(model.layers, self.units):
            self._hook(layer, unit)

    def _unit(self, name, params, owners):
        order = sorted(range(len(params)), key=lambda i: (owners[id(params[i])], i))
        params = [params[i] for i in order]
        who = [owners[id(p)] for p in params]
        counts = [0] * self.group.size
        for p, r in zip(params, who):
            counts[r] += p.data.size
        return ZeroUnit(name, params, who, tuple(counts))

    def _hook(self, layer, unit):
        forward, backward = layer.forward, layer.backward

        def gathering_forward(x, *args, **kwargs):
            with self._on_use(unit):
                return forward(x, *args, **kwargs)

        def gathering_backward(dy, cache, *args, **kwargs):
            with self._on_use(unit):
                self._grads_for(unit)
                dx = backward(dy, cache, *args, **kwargs)
                self._reduce(unit)
            return dx

        layer.forward, layer.backward = gathering_forward, gathering_backward

    # ------------------------------------------------------------------ weights (stage 3)
    @contextmanager
    def _on_use(self, unit):
        """The unit's weights gathered for the duration (stage 3; stage 2 holds them all)."""
        if self.stage == 2 or self.whole or unit.name in self.resident:
            yield
            return
        self._gather(unit)
        try:
            yield
        finally:
            self._release(unit)

    def _gather(self, unit):
        """Every rank's shard of the unit's weights (an all-gather-v), into its Params."""
        mine = [p.data.ravel() for p, r in zip(unit.params, unit.owners) if r == self.rank]
        dtype = unit.params[0].data.dtype if unit.params else np.float64
        flat, _ = all_gather_forward(np.concatenate(mine) if mine else np.zeros(0, dtype),
                                     group=self.group, counts=unit.counts)
        start = 0
        for p, r in zip(unit.params, unit.owners):
            n = p.data.size
            if r != self.rank:
                p.data = flat[start:start + n].reshape(p.data.shape)
            start += n
        self.resident.add(unit.name)

    def _release(self, unit):
        for p, r in zip(unit.params, unit.owners):
            if r != self.rank:
                p.data = released(p)
        self.resident.discard(unit.name)

    # ------------------------------------------------------------------ gradients
    def _grads_for(self, unit):
        """Zeroed full-size gradients for the unit's Params this rank does not own (its own
        persist), for the backward to accumulate into."""
        for p, r in zip(unit.params, unit.owners):
            if r != self.rank:
                p.grad = np.zeros(p.data.shape, p.data.dtype)

    def _reduce(self, unit):
        """Reduce-scatter-v of the unit's gradients: each owner gets the sum over ranks of its
        Params' gradients; the others' are released."""
        if not unit.params:
            return
        flat = np.concatenate([p.grad.ravel() for p in unit.params])
        mine, _ = reduce_scatter_forward(flat, group=self.group, counts=unit.counts)
        start = 0
        for p, r in zip(unit.params, unit.owners):
            if r == self.rank:
                p.grad[...] = mine[start:start + p.data.size].reshape(p.data.shape)
                start += p.data.size
            else:
                p.grad = empty_grad(p)

    # ------------------------------------------------------------------ the trainer's calls
    def begin_step(self):
        """Before the step's forward: the rest's weights gathered for the whole step (stage
        3) and its gradients allocated (they accumulate at both ends of the backward)."""
        if self.stage == 3 and not self.whole:
            self._gather(self.rest)
        self._grads_for(self.rest)

    def end_backward(self):
        """After the step's backward: the rest's gradients reduce-scattered (and, stage 3,
        its weights released)."""
        self._reduce(self.rest)
        if self.stage == 3 and not self.whole:
            self._release(self.rest)

    @contextmanager
    def gathered(self):
        """Every weight gathered for the duration (collective: every rank enters): for
        evaluation (ranks run different numbers of forwards), saving and loading."""
        if self.stage == 2 or self.whole:
            yield
            return
        for unit in self.units + [self.rest]:
            self._gather(unit)
        self.whole = True
        try:
            yield
        finally:
            self.whole = False
            for unit in self.units + [self.rest]:
                self._release(unit)

    @contextmanager
    def evaluation(self):
        """For forward-only passes (collective): the rest's weights gathered for the duration;
        the blocks gather on use, so every rank must run as many forwards."""
        if self.stage == 2 or self.whole:
            yield
            return
        self._gather(self.rest)
        try:
            yield
        finally:
            self._release(self.rest)

    @contextmanager
    def on_root(self):
        """Every weight on the group's rank 0 alone for the duration (collective: a gather of
        each unit's shards; the other ranks keep theirs), to write a checkpoint."""
        if self.stage == 2 or self.whole:
            yield
            return
        units = self.units + [self.rest]
        for unit in units:
            mine = [p.data for p, r in zip(unit.params, unit.owners) if r == self.rank]
            parts = self.group.comm.gather(mine, root=0)
            if self.rank == 0:
                held = [iter(part) for part in parts]
                for p, r in zip(unit.params, unit.owners):
                    whole = next(held[r])
                    if r != self.rank:
                        p.data = whole
        try:
            yield
        finally:
            if self.rank == 0:
                for unit in units:
                    self._release(unit)

    def gather_all(self):
        """Every weight gathered for good (collective): the model is whole again on every
        rank (after training, to sample from it)."""
        if self.stage == 3 and not self.whole:
            for unit in self.units + [self.rest]:
                self._gather(unit)
        self.whole = True

    def held_bytes(self):
        """(weight bytes, gradient bytes) this rank holds between steps: its own Params' (and,
        stage 2, every weight)."""
        units = self.units + [self.rest]
        mine = sum(p.data.nbytes for u in units for p, r in zip(u.params, u.owners)
                   if r == self.rank)
        every = sum(p.data.nbytes for u in units for p in u.params)
        return (mine if self.stage == 3 else every), mine

    def bytes_per_step(self):
        """{collective: bytes this rank sends in one training step}: the communication
        model (see the module docstring)."""
        P, r = self.group.size, self.rank
        if P == 1:
            return {}
        item = next(p.data.itemsize for u in self.units + [self.rest] for p in u.params)
        out = {"reduce_scatter": 0, "all_gather": 0}
        for unit in self.units + [self.rest]:
            n = sum(unit.counts)
            out["reduce_scatter"] += (n - unit.counts[r]) * item
            if self.stage == 3:
                gathers = 1 if unit is self.rest else 2  # a block: forward and backward
                out["all_gather"] += gathers * (n - unit.counts[(r + 1) % P]) * item
        if self.stage == 2:  # the update's all-gather-v over the whole model
            total = sum(sum(u.counts) for u in self.units + [self.rest])
            succ = sum(u.counts[(r + 1) % P] for u in self.units + [self.rest])
            out["all_gather"] = (total - succ) * item
        return out
