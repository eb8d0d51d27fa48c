"""Scatter-add of rows, the embedding's backward, as one Numba pass: dE[ids[i]] += dout[i].

NumPy's np.add.at(dE, ids, dout) (the readable twin; `add_rows` picks) runs its
generic indexed-ufunc loop: about 1.4 us a row of 128 floats, ~1.5 ms of the default
training step (1,024 rows), more than the rest of the embedding. The kernel adds the rows in
the same order (i = 0, 1, ...), each element with the same one addition in the table's
dtype, so a repeated id accumulates exactly as np.add.at does: the same bits. It releases the
GIL (nogil), so the data-parallel threads run it side by side.

Glossary: N rows scattered, D features, V table rows.
"""
import numpy as np
from numba import njit

from scratchllm.core.twins import use_fused


@njit(cache=True, nogil=True)
def _scatter_add_rows(table, ids, rows):
    """table[ids[i], :] += rows[i, :] for i = 0..N-1 in turn; ids in [0, V) (checked by the
    caller)."""
    for i in range(ids.shape[0]):
        dst = table[ids[i]]  # (D,)
        src = rows[i]  # (D,)
        for j in range(src.shape[0]):
            dst[j] += src[j]


def scatter_add_rows(table, ids, rows):
    """table[ids[i]] += rows[i] in place, in row order: np.add.at(table, ids, rows)'s bits.
    table (V, D) and rows (N, D) of one float dtype, table C-contiguous; ids (N,) ints in
    [0, V). Returns False (nothing done) for any other layout, for the caller's np.add.at."""
    if (table.dtype != rows.dtype or table.dtype not in (np.float32, np.float64)
            or not table.flags.c_contiguous or table.ndim != 2 or rows.ndim != 2
            or rows.shape[1] != table.shape[1] or ids.ndim != 1 or ids.dtype.kind not in "iu"):
        return False
    _scatter_add_rows(table, ids.astype(np.int64, copy=False), np.ascontiguousarray(rows))
    return True


def add_rows(table, ids, rows):
    """table[ids[i]] += rows[i] for every i, in place (ops.embedding_backward): the kernel,
    or np.add.at under SCRATCHLLM_READABLE=1 and for the layouts the kernel leaves alone."""
    if not (use_fused() and scatter_add_rows(table, ids, rows)):
        np.add.at(table, ids, rows)
