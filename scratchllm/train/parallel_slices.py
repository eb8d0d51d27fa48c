"""The whole model and a rank's slices of it, for the models whose weights are split over a
process group (tensor parallel: train/megatron.py; expert parallel: train/parallel_moe.py).

A sliced model holds, for each Param the one-process LM has, either the whole array
(replicated) or its group.rank-th of group.size equal blocks along one axis
(`split_axis(name)`); the Param names are the one-process LM's. The mixin maps between the two,
so checkpoints hold the whole model (they load in one process and on any grid):

    take_parts    the Params of a model built as this rank's parts (parallel_build.py)
    load_full     {name: whole array} -> this rank's slices (in place)
    gather_on_root  {key: slice} -> {key: whole array} on the group's rank 0 alone (a gather
                  per split array; the checkpoint's weights and moments)
    slice_state   AdamW's whole state cut to this rank's slices
    squares_over_group  the whole model's sum of squared gradients (the global-norm clip)
"""
import numpy as np


class SlicedLM:
    """Mixed into an LM subclass with .group (the process group the slices are cut over) and
    .split_axis(name) -> the axis a Param is split along, or None (replicated)."""

    def take_parts(self, part):
        """Hold the Params of `part`, an LM of the one-process config built with this rank's
        slices (parallel_build.build_part with hold=self._slice), name for name."""
        mine = dict(part.named_parameters())
        for name, p in self.named_parameters():
            p.data, p.grad = mine[name].data, mine[name].grad

    def load_full(self, arrays):
        """Keep this rank's slice of each whole array ({Param name: array}, the one-process
        model's names and shapes); a released Param (another pipeline stage's) stays so."""
        for name, p in self.named_parameters():
            if not p.data.flags.writeable:
                continue
            a = self._slice(name, np.asarray(arrays[name]))
            if a.shape != p.data.shape:
                raise ValueError(f"{type(self).__name__}: {name} of shape {a.shape} does not "
                                 f"fit this rank's {p.data.shape}")
            p.data[...] = a

    def gather_on_root(self, arrays, names=None):
        """{key: whole array} on the group's rank 0 from {key: this rank's slice} (a gather per
        split array; collective: every rank of the group calls it), None on the others; names:
        {key: the Param name whose split the array follows} (default: the key itself)."""
        out = {}
        for key, a in arrays.items():
            axis = self.split_axis(key if names is None else names[key])
            parts = [a] if axis is None else self.group.comm.gather(a, root=0)
            if self.group.rank == 0:
                out[key] = parts[0] if axis is None else np.concatenate(parts, axis=axis)
        return out if self.group.rank == 0 else None

    def slice_state(self, names, state):
        """AdamW's whole state_dict cut to this rank's slices (names: the Param name of each
        optimizer slot)."""
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
