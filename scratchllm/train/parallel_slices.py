"""The whole model and a rank's slices of it, for the models whose weights are split over a
process group (tensor parallel: train/megatron.py; expert parallel: train/parallel_moe.py).

A sliced model holds, for each Param the one-process LM has, either the whole array
(replicated) or its group.rank-th of group.size equal blocks along one axis
(`split_axis(name)`); the Param names are the one-process LM's. The mixin maps between the two,
so checkpoints hold the whole model (they load in one process and on any grid):

    load_full     {name: whole array} -> this rank's slices (in place)
    gather_full   {name: slice} -> {name: whole array} (an all-gather per split array)
    gather_whole  the one-process LM and AdamW's whole state (the moments gathered the same way)
    slice_state   AdamW's whole state cut to this rank's slices
    squares_over_group  the whole model's sum of squared gradients (the global-norm clip)
"""
import numpy as np

from scratchllm.dist import all_gather_forward
from scratchllm.lm import LM


class SlicedLM:
    """Mixed into an LM subclass with .group (the process group the slices are cut over) and
    .split_axis(name) -> the axis a Param is split along, or None (replicated)."""

    def load_full(self, arrays):
        """Keep this rank's slice of each whole array ({Param name: array}, the one-process
        model's names and shapes)."""
        for name, p in self.named_parameters():
            a = self._slice(name, np.asarray(arrays[name]))
            if a.shape != p.data.shape:
                raise ValueError(f"{type(self).__name__}: {name} of shape {a.shape} does not "
                                 f"fit this rank's {p.data.shape}")
            p.data[...] = a

    def gather_full(self, arrays):
        """{name: whole array} from {name: this rank's slice} (an all-gather per split array;
        collective: every rank of the group calls it)."""
        out = {}
        for name, a in arrays.items():
            axis = self.split_axis(name)
            out[name] = a if axis is None else all_gather_forward(
                np.ascontiguousarray(a), group=self.group, axis=axis)[0]
        return out

    def gather_whole(self, cfg, names, opt_state):
        """(the one-process LM of cfg, AdamW's whole state_dict) gathered from this rank's
        slices; names: the Param name of each optimizer slot (collective)."""
        model = LM(cfg, rng=np.random.default_rng(0), dtype=self.dtype)
        arrays = self.gather_full({n: p.data for n, p in self.named_parameters()})
        for n, p in model.named_parameters():
            p.data[...] = arrays[n]
        state = dict(opt_state)
        for i, name in enumerate(names):
            for k in (f"m.{i}", f"v.{i}"):
                state[k] = self.gather_full({name: opt_state[k]})[name]
        return model, state

    def slice_state(self, names, state):
        """AdamW's whole state_dict cut to this rank's slices (names as in gather_whole)."""
        out = dict(state)
        for i, name in enumerate(names):
            for k in (f"m.{i}", f"v.{i}"):
                out[k] = self._slice(name, state[k])
        return out

    def _slice(self, name, a):
        axis, P, r = self.split_axis(name), self.group.size, self.group.rank
        if axis is None:
            return a
        n = a.shape[axis] // P
        return np.take(a, np.arange(r * n, (r + 1) * n), axis=axis)

    def squares_over_group(self, _local=None):
        """The whole model's sum of squared gradients (for the global-norm clip): the split
        Params' summed over the group, the replicated ones' counted once (every rank holds
        their whole gradient). Collective; clip_grad_norm's `across` (its local sum unused)."""
        split = rep = 0.0
        for name, p in self.named_parameters():
            sq = float(np.sum(p.grad * p.grad))
            if self.split_axis(name) is None:
                rep += sq
            else:
                split += sq
        return self.group.sum_scalar(split) + rep
