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

The lanes are cut finer than the threads (_tasks: a Numba kernel's spans 8 a thread, at most
one lane a span; the NumPy steps' groups 2 a thread, per batch row and then per heads) and the
threads take the pieces in order as they come free (core/blas.run_tasks, the calling thread one
of them): cut in fixed halves, a call waited for its slower half, whether the second thread woke
late (~0.1-0.3 ms on an idle core here) or another process held its core (RWKV-4's scan, B 4,
T 1,024, D 256, two threads: 57 -> 44 ms a fwd + bwd, 75 ms on one).

Glossary: lane = one (batch row, head); group = a basic slice of the lanes (a view); n
groups = min(n asked, lanes along the cut axis).
"""
import numba
import numpy as np
from numba.np.ufunc.parallel import _launch_threads

from scratchllm.core.blas import run_tasks
from scratchllm.core.heap import keep_freed_memory

_THREADABLE = []      # [bool] once known
MIN_WORK = 1 << 16    # elements of input below which one thread is faster than handing off
TASKS_PER_THREAD = 8  # spans of lanes per thread (at most one lane a span): run_spans
GROUPS_PER_THREAD = 2  # lane groups per thread for NumPy steps (for_lanes): finer groups make
#                        NumPy calls of tens of microseconds, and the GIL between them costs more


def _can_thread():
    """False under Numba's workqueue layer (not reentrant from two threads)."""
    if not _THREADABLE:
        try:
            _launch_threads()
            _THREADABLE.append(numba.threading_layer() != "workqueue")
        except Exception:  # noqa: BLE001 (no threading layer at all: stay on one thread)
            _THREADABLE.append(False)
    return _THREADABLE[0]


def _cuts(size, n):
    """spans(size, n) as slices."""
    return [slice(lo, hi) for lo, hi in spans(size, n)]


def lane_groups(B, H, n):
    """Index tuples cutting the (B, H) lanes into at most n groups of basic slices: along B
    when B >= n; else, with H > 1 and n >= 2B, every batch row cut along H into n // B pieces;
    else along the longer of B and H. [(slice(None),)] for one group."""
    if n <= 1:
        return [(slice(None),)]
    if B >= n:
        return [(rows,) for rows in _cuts(B, n)]
    per_row = min(H, n // B)
    if B > 1 and per_row > 1:
        return [(slice(b, b + 1), heads) for b in range(B) for heads in _cuts(H, per_row)]
    if B >= H:
        return [(rows,) for rows in _cuts(B, n)]
    return [(slice(None), heads) for heads in _cuts(H, n)]


def _threads():
    return numba.get_num_threads()


def _tasks(threads, size, per_thread=TASKS_PER_THREAD):
    """How many pieces `size` lanes are cut into for `threads` threads: one piece on one
    thread, else per_thread per thread (at most one lane each). The threads take the
    pieces in order as they come free (core/blas.run_tasks; the calling thread is one of
    them), so a thread that starts late (a wake-up on an idle core costs ~0.1-0.3 ms here) or
    is slowed by another process leaves its share to the others instead of the whole call
    waiting for its fixed half."""
    return 1 if threads <= 1 else min(size, per_thread * threads)


def _one_thread(fn, idx):
    """fn(idx) with Numba at one thread in this thread (the groups are the parallelism), the
    thread's count restored after (the calling thread runs groups too)."""
    n = numba.get_num_threads()
    numba.set_num_threads(1)          # thread-local
    try:
        return fn(idx)
    finally:
        numba.set_num_threads(n)


def _threads_for(work):
    """The threads a call of `work` elements runs on: Numba's count, one below MIN_WORK or
    under the workqueue layer."""
    return _threads() if work >= MIN_WORK and _can_thread() else 1


def map_lanes(fn, B, H, work):
    """fn(idx) for each lane group idx of lane_groups(B, H, threads), in threads (one call
    fn((slice(None),)) when work, the elements of the input, is under MIN_WORK). fn returns a
    flat tuple of arrays whose first two axes are the group's lanes; returns the same tuple
    with every array assembled over all lanes (B, H, ...)."""
    threads = _threads_for(work)
    groups = lane_groups(B, H, threads)
    keep_freed_memory()
    if len(groups) == 1:
        return fn(groups[0])
    parts = run_tasks(lambda j: _one_thread(fn, groups[j]), len(groups), threads)
    full = [np.empty((B, H) + a.shape[2:], a.dtype) for a in parts[0]]  # (B, H, ...)

    def put(i):
        for k, out in enumerate(full):
            out[groups[i]] = parts[i][k]
    run_tasks(put, len(groups), threads)
    return tuple(full)


def for_lanes(fn, B, H, work):
    """fn(idx) for each lane group idx of lane_groups(B, H, GROUPS_PER_THREAD · threads), in
    threads as map_lanes, for an fn that writes its lanes of arrays allocated
    beforehand (nothing returned): no parts to copy into whole arrays afterwards (for an
    elementwise step that copy costs as much as the step: linear attention's CPU at 2 threads
    was 25% above 1 thread's). The groups are finer than the threads (_tasks)."""
    threads = _threads_for(work)
    groups = lane_groups(B, H, _tasks(threads, B * H, GROUPS_PER_THREAD))
    keep_freed_memory()
    if len(groups) == 1:
        fn(groups[0])
        return
    run_tasks(lambda j: _one_thread(fn, groups[j]), len(groups), threads)


def spans(L, n):
    """[(lo, hi)]: range(L) cut into min(n, L) spans of nearly equal length (at least one)."""
    n = max(1, min(n, L))
    cuts = [L * i // n for i in range(n + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def run_spans(kernel, L, work):
    """kernel(lo, hi) for spans of the L lanes, _tasks(threads, L) spans taken in order by the
    threads as they come free (one call kernel(0, L) when work, the elements of the output,
    is under MIN_WORK): for a serial Numba kernel compiled with nogil=True, whose lanes write
    disjoint rows (so the bits do not depend on the thread count). The calling thread is one
    of the threads; OpenBLAS stays at one thread meanwhile (the lanes are the parallelism)."""
    threads = _threads() if work >= MIN_WORK else 1  # serial kernels: any threading layer
    parts = spans(L, _tasks(threads, L))
    if len(parts) == 1:
        kernel(0, L)
        return
    run_tasks(lambda i: kernel(*parts[i]), len(parts), threads)


def lanes_of(cache, idx, fields):
    """The NamedTuple `cache` with each of `fields` (arrays with leading (B, H)) cut to the
    lane group idx."""
    return cache._replace(**{f: getattr(cache, f)[idx] for f in fields})
