"""Process groups over MPI: the one place that touches mpi4py, and the byte counter every
collective reports to.

MPI (the Message Passing Interface) runs N copies of one program, the ranks 0..N-1, started by
`mpiexec -n N python ...` (on one machine, or on many with a hostfile); they exchange arrays
only through explicit messages and collectives over a communicator (a group of ranks). The
engine here is MPICH through mpi4py, both from the package index (`pip install -e ".[dist]"`);
without them the rest of the library works and `mpi()` says how to install them.

A `Group` wraps a communicator (rank, size) and counts the bytes this rank puts on the wire
per collective, under the bandwidth-optimal ring algorithms the communication model assumes
(collectives.py derives each count). A group of one rank needs no MPI at all (`Group.single`):
every collective is then a copy, which is how the in-process gradient cases run.
"""
import os
from collections import Counter

import numpy as np

INSTALL = 'pip install -e ".[dist]"  (mpi4py and MPICH from the package index)'
LAUNCH_ENV = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


class MPIUnavailable(ImportError):
    """mpi4py (or the MPI library under it) cannot be imported."""


def mpi():
    """The mpi4py.MPI module (importing it initialises MPI); MPIUnavailable saying how to
    install it when it is missing."""
    try:
        # optional dependency: the dist extra (mpi4py + mpich)
        from mpi4py import MPI
    except ImportError as e:
        raise MPIUnavailable(f"parallel training needs MPI, which is not installed ({e}); "
                             f"install it with: {INSTALL}") from None
    return MPI


def launched_by_mpiexec():
    """The world size mpiexec announced in the environment (before importing MPI), else 1."""
    for name in LAUNCH_ENV[:2]:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


class SelfComm:
    """The few communicator calls the collectives make, for a group of one rank (no MPI):
    every rank's data is this rank's, so each collective is a copy."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Allreduce(self, send, recv):
        recv[...] = send

    def Allgather(self, send, recv):
        recv[...] = send

    def Allgatherv(self, send, recv):
        recv[0][...] = send

    def Reduce_scatter_block(self, send, recv):
        recv[...] = send

    def Reduce_scatter(self, send, recv, counts):
        recv[...] = send

    def Alltoallv(self, send, recv):
        recv[0][...] = send[0]

    def Sendrecv(self, send, dest, recvbuf, source):
        recvbuf[...] = send

    def alltoall(self, items):
        return list(items)

    def allreduce(self, value):
        return value

    def bcast(self, value, root=0):
        return value

    def gather(self, value, root=0):
        return [value]

    def Barrier(self):
        pass

    def Split(self, color, key):
        return self

    def Dup(self):
        return self

    def Abort(self, code):
        raise SystemExit(code)


class Group:
    """A group of ranks (a communicator) and the bytes this rank sent through it, per
    collective: `sent["all_reduce"]`, ... (ints; `total_sent()` sums them)."""

    def __init__(self, comm, name="world"):
        self.comm, self.name = comm, name
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.sent = Counter()

    @classmethod
    def single(cls, name="self"):
        """A group of this rank alone (no MPI needed)."""
        return cls(SelfComm(), name)

    @classmethod
    def world(cls):
        """Every rank mpiexec started (MPI.COMM_WORLD)."""
        return cls(mpi().COMM_WORLD, "world")

    def count(self, op, nbytes):
        """Record nbytes sent by this rank in collective `op`."""
        self.sent[op] += int(nbytes)

    def total_sent(self):
        return sum(self.sent.values())

    def barrier(self):
        self.comm.Barrier()

    def abort(self, code=1):
        """End every rank of the job at once with exit code `code` (MPI_Abort): what a rank
        that failed must do, or the others wait for it in their next collective forever."""
        self.comm.Abort(code)

    def sum_scalar(self, value):
        """A Python float summed over the group: an all-reduce of one float64, counted as
        "sum_scalar" by the ring formula (scalar_bytes())."""
        self.count("sum_scalar", self.scalar_bytes())
        return float(self.comm.allreduce(float(value)))

    def scalar_bytes(self):
        """The bytes one sum_scalar sends from this rank: 2 (P - 1) 8 / P (0 alone)."""
        return 2 * (self.size - 1) * 8 // self.size

    def twin(self):
        """A group of the same ranks on a duplicate communicator (collective: every rank
        makes its twins in the same order), whose messages never meet this group's: one per
        data shard of a rank (a data-parallel thread's model replica)."""
        return Group(self.comm.Dup(), self.name)

    def broadcast(self, value, root=0):
        """A picklable value from `root` to every rank (setup only, not counted)."""
        return self.comm.bcast(value, root=root)

    def __repr__(self):
        return f"Group({self.name}: rank {self.rank} of {self.size})"


def contiguous(x):
    """x as a C-contiguous array (MPI reads and writes raw buffers)."""
    return np.ascontiguousarray(x)
