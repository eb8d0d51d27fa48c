"""The rank grid: N ranks laid out as a 5-D grid, one axis per kind of parallelism, and a
process group per axis (the ranks that differ only along it).

    axes (slowest to fastest)   pp  dp  ep  cp  tp
    rank = (((pp_i * dp + dp_i) * ep + ep_i) * cp + cp_i) * tp + tp_i

Tensor parallelism exchanges activations in every layer, so its ranks are adjacent (the same
machine first, as in Megatron-LM's and picotron's grids); pipeline stages exchange only
activations at stage boundaries, so they are furthest apart. Every size defaults to 1 and their
product must equal the number of ranks mpiexec started, checked before any work.
"""
from typing import NamedTuple

from scratchllm.dist.comm import Group

AXES = ("pp", "dp", "ep", "cp", "tp")  # slowest to fastest


class GridError(ValueError):
    """The axis sizes do not multiply to the number of ranks started."""


class GridShape(NamedTuple):
    """Sizes of the five axes (each >= 1)."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def n_ranks(self):
        n = 1
        for size in self:
            n *= size
        return n

    def describe(self):
        """'dp=2 x tp=2' (the axes above 1; 'one rank' when none is)."""
        parts = [f"{a}={getattr(self, a)}" for a in AXES if getattr(self, a) > 1]
        return " x ".join(parts) or "dp=1 (every axis 1)"


def check_shape(shape, world_size, rank=0):
    """GridError unless the sizes are >= 1 and multiply to world_size, naming the ranks."""
    bad = [a for a in AXES if getattr(shape, a) < 1]
    if bad:
        raise GridError(f"rank grid: axis sizes must be >= 1, got "
                        f"{', '.join(f'{a}={getattr(shape, a)}' for a in bad)}")
    need = shape.n_ranks()
    if need != world_size:
        started = (f"{world_size} were started (ranks 0-{world_size - 1}; this is rank {rank})"
                   if world_size > 1 else "1 was started (rank 0 alone: no mpiexec?)")
        raise GridError(f"rank grid {shape.describe()} needs {need} rank"
                        f"{'s' if need > 1 else ''}, but {started}: launch with `mpiexec -n "
                        f"{need} python -m scratchllm ...`, or give axis sizes that multiply to "
                        f"{world_size} (e.g. --dp {world_size})")


def coords_of(rank, shape):
    """{axis: index} of a rank on the grid."""
    out = {}
    for a in reversed(AXES):
        size = getattr(shape, a)
        out[a], rank = rank % size, rank // size
    return out


class RankGrid:
    """This rank's place on the grid and one Group per axis (`grid.groups["dp"]`, ...)."""

    def __init__(self, shape, world):
        """shape: a GridShape; world: the Group of every rank (GridError on a mismatch)."""
        check_shape(shape, world.size, world.rank)
        self.shape, self.world = shape, world
        self.coords = coords_of(world.rank, shape)
        self.groups = {}
        for axis in AXES:
            others = tuple(self.coords[a] for a in AXES if a != axis)
            color = 0
            for a, c in zip((a for a in AXES if a != axis), others):
                color = color * getattr(shape, a) + c
            comm = world.comm.Split(color, self.coords[axis])
            self.groups[axis] = Group(comm, axis)

    @property
    def rank(self):
        return self.world.rank

    def is_first(self):
        """Rank 0: the one that prints and writes files."""
        return self.world.rank == 0

    def sent_per_axis(self):
        """{axis: bytes this rank sent over that axis's group}."""
        return {a: g.total_sent() for a, g in self.groups.items()}
