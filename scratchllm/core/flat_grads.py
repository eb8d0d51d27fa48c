"""The gradients of a model and its data-parallel replicas in one array, so the step's tail
runs one call per thread instead of one per Param: zeroing a replica's gradients is one fill,
and summing the replicas into the model's, with each summed gradient's sum of squares (the
clip's norm), is one Numba pass per thread over whole Params.

    buf (R, N): row r holds replica r's gradients, Param j at columns offsets[j]:offsets[j+1]
    p.grad of replica r = buf[r, offsets[j]:offsets[j+1]].reshape(p.data.shape)   (a view)

The sum adds the rows in order (row 0 += row 1, then += row 2 ...), each element with the
same float additions as `main.grad += replica.grad` in replica order, and each Param's sum of
squares is fused_adamw.sum_squares's kernel on its whole flat gradient: the same bits as the Param
by Param loops (tests/core/test_flat_grads.py). A thread takes whole Params (the squares run
over whole Params), balanced by size (largest first, to the least loaded thread).

Glossary: R replicas (row 0 the model's own), N numbers in all the Params, P Params.
"""
import numpy as np
from numba import njit

from scratchllm.core.fused_sums import dot64_exact


@njit(cache=True, nogil=True)
def _sum_rows_squares(buf, n_rows, offsets, which, squares):
    """For each Param j in `which`: buf[0, seg] += buf[1, seg] (+= buf[2, seg] ...) over its
    segment seg = offsets[j]:offsets[j+1], then squares[j] = sum of buf[0, seg]^2 (float64)."""
    main = buf[0]  # (N,)
    for t in range(which.shape[0]):
        j = which[t]
        lo, hi = offsets[j], offsets[j + 1]
        g = main[lo:hi]
        for r in range(1, n_rows):
            other = buf[r]
            for i in range(lo, hi):
                main[i] = main[i] + other[i]
        squares[j] = dot64_exact(g, g)


def balanced_split(sizes, n):
    """[indices of the items thread k takes] for k < n: each item, largest first, to the
    thread with the least so far (ties to the lowest k); each list ascending."""
    loads, parts = [0] * n, [[] for _ in range(n)]
    for j in sorted(range(len(sizes)), key=lambda j: -sizes[j]):
        k = loads.index(min(loads))
        loads[k] += sizes[j]
        parts[k].append(j)
    return [np.array(sorted(p), np.int64) for p in parts]


class FlatGrads:
    """The Params' gradients of `models` (a model and its replicas: the same Params in the
    same order, one dtype) moved into one (R, N) array: each p.grad becomes a view of its
    row (its values kept). `valid()` says whether every p.grad is still that view (a caller
    that re-points a p.grad gets the Param-by-Param path again). The Params are the models'
    at construction, as an optimizer's are: a Param added or replaced later is not summed."""

    def __init__(self, models, threads):
        self.params = [m.parameters() for m in models]
        first = self.params[0]
        sizes = [p.data.size for p in first]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)  # (P + 1,)
        self.buf = np.zeros((len(models), int(self.offsets[-1])), first[0].data.dtype)
        for row, params in zip(self.buf, self.params):
            for j, p in enumerate(params):
                view = row[self.offsets[j]:self.offsets[j + 1]].reshape(p.data.shape)
                if p.grad.any():  # (reading a fresh grad's zero pages maps none: a Param
                    view[...] = p.grad  # never trained, e.g. frozen, costs no memory)
                p.grad = view
        self.views = [[p.grad for p in params] for params in self.params]
        self.which = balanced_split(sizes, max(1, int(threads)))
        self.squares = np.zeros(len(first))  # (P,) float64, of the last sum_rows

    @staticmethod
    def fits(models):
        """Whether FlatGrads can take these models' gradients: one float dtype, every Param's
        data and grad of one shape and C-contiguous (not a ZeRO or pipeline placeholder of
        zero strides: dist/zero_layers.py empty_grad), and at least one Param."""
        params = [m.parameters() for m in models]
        if not params[0] or any(len(ps) != len(params[0]) for ps in params):
            return False
        dtype = params[0][0].data.dtype
        return dtype in (np.float32, np.float64) and all(
            p.data.dtype == dtype and p.grad.dtype == dtype and p.grad.shape == p.data.shape
            and p.data.shape == q.data.shape and p.grad.flags.c_contiguous
            and p.data.flags.c_contiguous
            for ps in params for p, q in zip(ps, params[0]))

    def valid(self):
        """Every p.grad is still its view of buf."""
        return all(p.grad is v for ps, vs in zip(self.params, self.views)
                   for p, v in zip(ps, vs))

    def zero(self, r):
        """Replica r's gradients set to 0 (one fill)."""
        self.buf[r].fill(0)

    def sum_rows(self, n_rows, k):
        """Thread k's share of: row 0 += rows 1 .. n_rows - 1, and squares[j] of row 0's
        Params (self.squares, in the model's parameters() order)."""
        _sum_rows_squares(self.buf, n_rows, self.offsets, self.which[k], self.squares)
