"""Independent (batch, head) lanes run in threads: how the delta rule's chunked form (and the
elementwise steps of linear attention and SSD) use a second core; and run_spans, which hands
spans of lanes to a serial Numba kernel that releases the GIL (GLA's chunked form, and through
it linear attention, RetNet and SSD: gla_chunks.py; many NumPy steps per group shared the cores
badly, see there).

Every chunked form of the family computes each (batch, head) lane on its own: no sum runs across lanes. So the lanes
are cut into groups (along the batch when it has enough rows, else along the heads), each group
is run by the same NumPy code in its own thread, and each thread copies its results into the
full arrays. NumPy's loops, its batched matmuls (OpenBLAS) and Numba kernels release the GIL,
so the groups overlap; only the Python between NumPy calls is serial. Every group computes
exactly what the whole call would for its lanes (same code, same order of every sum), so the
result is bit for bit the single-thread one, whatever the number of threads.

The thread count is Numba's (NUMBA_NUM_THREADS, or numba.set_num_threads in this thread); a
Numba kernel called inside a group runs on one thread (the groups are the parallelism). With
Numba's workqueue threading layer, which cannot be entered from two threads at once, groups
run one after another.

glibc hands freed heap memory back to the kernel, so the next array of the same size faults in
fresh zeroed pages; with two threads those page faults contend in the kernel (perf of the delta
rule on two threads: clear_page, exc_page_fault and the page lists' spinlock above the BLAS
kernels). map_lanes calls core/heap.py's keep_freed_memory, which keeps freed memory for reuse
instead (the delta rule's fwd + bwd at B 4, T 1,024, d 256: 185 -> 145 ms on one thread, 1.2x
-> 1.6x from a second one). The price: freed memory stays with the process instead of going
back to the system.

Glossary: lane = one (batch row, head); group = a basic slice of the lanes (a view); n
groups = min(threads, lanes along the cut axis).
"""
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
from numba.np.ufunc.parallel import _launch_threads

from scratchllm.core.blas import one_blas_thread
from scratchllm.core.heap import keep_freed_memory

_POOL = {}
_LOCK = threading.Lock()
_THREADABLE = []      # [bool] once known
MIN_WORK = 1 << 16    # elements of input below which one thread is faster than handing off


def _pool(n):
    with _LOCK:
        if n not in _POOL:
            _POOL[n] = ThreadPoolExecutor(n, thread_name_prefix="scratchllm-lanes")
        return _POOL[n]


def _can_thread():
    """False under Numba's workqueue layer (not reentrant from two threads)."""
    if not _THREADABLE:
        try:
            _launch_threads()
            _THREADABLE.append(numba.threading_layer() != "workqueue")
        except Exception:  # noqa: BLE001 (no threading layer at all: stay on one thread)
            _THREADABLE.append(False)
    return _THREADABLE[0]


def lane_groups(B, H, n):
    """Index tuples cutting the (B, H) lanes into at most n groups of basic slices: along B
    when B >= n, else along H. [(slice(None),)] for one group."""
    axis, size = (0, B) if B >= n or B >= H else (1, H)
    n = max(1, min(n, size))
    cuts = [size * i // n for i in range(n + 1)]
    return [(slice(None),) * axis + (slice(a, b),) for a, b in zip(cuts[:-1], cuts[1:])]


def _threads():
    return numba.get_num_threads()


def _one_thread(fn, idx):
    numba.set_num_threads(1)          # thread-local: this group's Numba kernels stay serial
    return fn(idx)


def map_lanes(fn, B, H, work):
    """fn(idx) for each lane group idx of lane_groups(B, H, threads), in threads (one call
    fn((slice(None),)) when work, the elements of the input, is under MIN_WORK). fn returns a
    flat tuple of arrays whose first two axes are the group's lanes; returns the same tuple
    with every array assembled over all lanes (B, H, ...)."""
    groups = lane_groups(B, H, _threads() if work >= MIN_WORK else 1)
    keep_freed_memory()
    if len(groups) == 1 or not _can_thread():
        return fn(groups[0])
    pool = _pool(len(groups))
    parts = list(pool.map(_one_thread, [fn] * len(groups), groups))
    axis = len(groups[0]) - 1
    full = []
    for k, a in enumerate(parts[0]):
        shape = list(a.shape)
        shape[axis] = sum(p[k].shape[axis] for p in parts)
        full.append(np.empty(shape, a.dtype))

    def put(i):
        for k, out in enumerate(full):
            out[groups[i]] = parts[i][k]
    list(pool.map(put, range(len(groups))))
    return tuple(full)


def for_lanes(fn, B, H, work):
    """fn(idx) for each lane group idx of lane_groups(B, H, threads), in threads as map_lanes,
    for an fn that writes its lanes of arrays allocated beforehand (nothing returned): no
    parts to copy into whole arrays afterwards (for an elementwise step that copy costs as
    much as the step: linear attention's CPU at 2 threads was 25% above 1 thread's)."""
    groups = lane_groups(B, H, _threads() if work >= MIN_WORK else 1)
    keep_freed_memory()
    if len(groups) == 1 or not _can_thread():
        fn(groups[0])
        return
    list(_pool(len(groups)).map(_one_thread, [fn] * len(groups), groups))


def spans(L, n):
    """[(lo, hi)]: range(L) cut into min(n, L) spans of nearly equal length (at least one)."""
    n = max(1, min(n, L))
    cuts = [L * i // n for i in range(n + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def run_spans(kernel, L, work):
    """kernel(lo, hi) for spans of the L lanes, one span per thread (one call kernel(0, L)
    when work, the elements of the output, is under MIN_WORK): for a serial Numba kernel
    compiled with nogil=True, whose lanes write disjoint rows (so the bits do not depend on
    the thread count). The calling thread runs the last span; OpenBLAS stays at one thread
    meanwhile (the lanes are the parallelism)."""
    parts = spans(L, _threads() if work >= MIN_WORK else 1)
    if len(parts) == 1:
        kernel(0, L)
        return
    with one_blas_thread():
        pending = [_pool(len(parts) - 1).submit(kernel, lo, hi) for lo, hi in parts[:-1]]
        kernel(*parts[-1])
        for job in pending:
            job.result()


def lanes_of(cache, idx, fields):
    """The NamedTuple `cache` with each of `fields` (arrays with leading (B, H)) cut to the
    lane group idx."""
    return cache._replace(**{f: getattr(cache, f)[idx] for f in fields})
