"""ZeRO stage 1 (Rajbhandari et al. 2020, arXiv:1910.02054): shard the optimizer state over
the data-parallel ranks. AdamW keeps two moments per weight (m, v: 2x the weights' bytes, 4x
in mixed precision with fp32 masters), the same on every rank under plain data parallelism;
with ZeRO-1 each rank keeps the moments of 1/P of the weights and updates only those:

    all-reduce the gradients (as before)  ->  clip (every rank has the same global norm)
    ->  AdamW on this rank's Params only  ->  all-gather the updated Params

As in PyTorch's ZeroRedundancyOptimizer, the shards are whole Params, assigned largest first
to the least-loaded rank, so each Param's update is exactly the one-process AdamW's (the same
fused kernel on the same numbers) and a sharded run equals an unsharded one. Optimizer memory
per rank: 2 n / P (+ the largest Param's imbalance), for P times the all-gather of the weights
per step, (P - 1) n / P bytes sent per rank. The checkpoint stores the whole state, gathered on
rank 0, in AdamW's own layout, so it loads on any grid (and in one process).

Stages 2 and 3 keep this optimizer and its shards; their gradients arrive already
reduce-scattered (each rank holds only its Params' summed gradients) and, at stage 3, each
rank keeps only its Params' weights, so the update is not all-gathered: zero_layers.py.
"""
import numpy as np

from scratchllm.dist.collectives import all_gather_forward
from scratchllm.dist.comm import contiguous


def partition(sizes, n_ranks):
    """[owner rank of each item]: items (by size, largest first; ties by index) to the rank
    with the fewest elements so far (ties: the lowest rank)."""
    load, owner = [0] * n_ranks, [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(n_ranks), key=lambda r: (load[r], r))
        owner[i], load[r] = r, load[r] + sizes[i]
    return owner


class ZeroAdamW:
    """An AdamW (core.optim) whose state and updates are sharded over a group: `lr`, `t`,
    `step()`, `state_dict()` and `load_state_dict()` as AdamW's; state_dict is collective
    (every rank calls it; rank 0 gets the whole state, the others None)."""

    def __init__(self, opt, group, stage=1, only=None):
        """opt: a core.optim.AdamW over every Param; group: the data-parallel ranks; stage:
        the ZeRO stage (1 and 2 all-gather the updated Params after each step; at 3 each
        rank keeps only its own); only: the optimizer slots this rank's group updates (a
        pipeline stage's), None for all: the others have no owner (and no moments)."""
        if stage not in (1, 2, 3):
            raise ValueError(f"ZeroAdamW: stage must be 1, 2 or 3, got {stage!r}")
        self.opt, self.group, self.stage = opt, group, stage
        params = opt.params
        slots = list(range(len(params))) if only is None else sorted(only)
        self.owner = [None] * len(params)  # the rank of each slot (None: not this group's)
        for i, r in zip(slots, partition([params[i].data.size for i in slots], group.size)):
            self.owner[i] = r
        self.mine = [i for i, r in enumerate(self.owner) if r == group.rank]
        for i, r in enumerate(self.owner):
            if r != group.rank:  # not this rank's: no moments at all
                opt.m[i] = opt.v[i] = None

    def owners(self):
        """{id(Param): the rank that owns it} (zero_layers.ShardedModel's partition)."""
        return {id(p): r for p, r in zip(self.opt.params, self.owner)}

    @property
    def params(self):
        """AdamW's Params, in its slot order."""
        return self.opt.params

    def owned(self):
        """[Param] this rank owns (whose gradients it holds from stage 2 on)."""
        return [self.opt.params[i] for i in self.mine]

    @property
    def lr(self):
        return self.opt.lr

    @lr.setter
    def lr(self, value):
        self.opt.lr = value

    @property
    def t(self):
        return self.opt.t

    def state_bytes(self):
        """Bytes of optimizer moments this rank holds."""
        return sum(self.opt.m[i].nbytes + self.opt.v[i].nbytes for i in self.mine)

    def step(self, only=None):
        """AdamW on this rank's Params (those of `only` among them: AdamW.step's), then
        (stages 1 and 2) every owned Param from its owner (an all-gather-v)."""
        self.opt.step(only=self.mine if only is None else sorted(set(self.mine) & set(only)))
        if self.stage < 3:
            self._all_gather_params()

    def _all_gather_params(self):
        params, P, g = self.opt.params, self.group.size, self.group
        if P == 1:
            return
        owned = [[i for i, r in enumerate(self.owner) if r == rank] for rank in range(P)]
        sizes = [sum(params[i].data.size for i in ids) for ids in owned]
        mine = contiguous(np.concatenate([params[i].data.ravel() for i in owned[g.rank]] or
                                         [np.zeros(0, params[0].data.dtype)]))
        flat, _ = all_gather_forward(mine, group=g, counts=sizes)  # fwd: every rank's shard
        start = 0
        for ids in owned:
            for i in ids:
                n = params[i].data.size
                params[i].data[...] = flat[start:start + n].reshape(params[i].data.shape)
                start += n

    def state_dict(self):
        """Collective: AdamW's state_dict with every moment, on rank 0 (None elsewhere)."""
        mine = {i: (self.opt.m[i], self.opt.v[i]) for i in self.mine}
        parts = self.group.comm.gather(mine, root=0)
        if self.group.rank != 0:
            return None
        state = {"t": np.asarray(self.opt.t), "lr": np.asarray(self.opt.lr)}
        for part in parts:
            for i, (m, v) in part.items():
                state[f"m.{i}"], state[f"v.{i}"] = m, v
        return dict(sorted(state.items(), key=lambda kv: _order(kv[0])))

    def load_state_dict(self, state):
        """AdamW's whole state (from any grid): this rank keeps its shard's moments."""
        n = len(self.opt.params)
        if len(state) != 2 * n + 2:
            raise ValueError(f"ZeroAdamW.load_state_dict: state has {len(state)} entries, "
                             f"expected {2 * n + 2} for {n} parameters")
        self.opt.t, self.opt.lr = int(state["t"]), float(state["lr"])
        for i in self.mine:
            for name, buf in ((f"m.{i}", self.opt.m[i]), (f"v.{i}", self.opt.v[i])):
                if state[name].shape != buf.shape:
                    raise ValueError(f"ZeroAdamW.load_state_dict: {name} has shape "
                                     f"{state[name].shape}, expected {buf.shape}")
                buf[...] = state[name]


def _order(key):
    """AdamW.state_dict's key order: t, lr, then m.0, v.0, m.1, v.1, ..."""
    if key in ("t", "lr"):
        return (0, key == "lr", 0)
    kind, _, i = key.partition(".")
    return (1, int(i), kind == "v")
