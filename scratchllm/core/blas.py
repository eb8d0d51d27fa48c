"""OpenBLAS's thread count, read and set from Python, and tasks on threads beside it.

OpenBLAS's own threads spin-wait for each other: a small product (a 256 x 64 tile, a model of
width 64) split over two BLAS threads is slower than on one, and on a busy machine a thread
that waits for a core can make one such product take many times longer. So the library's own
threads (training shards, flash attention's lanes) run with BLAS at one thread each.

The controls are the get/set functions of every OpenBLAS library mapped into this process
(NumPy's, SciPy's), found in /proc/self/maps; without /proc or OpenBLAS there are none and
every function here does nothing.
"""
import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from functools import lru_cache

_NAMES = ("scipy_openblas_{}_num_threads64_", "scipy_openblas_{}_num_threads",
          "openblas_{}_num_threads64_", "openblas_{}_num_threads")


@lru_cache(maxsize=1)
def thread_controls():
    """[(get, set)]: the thread-count functions of each OpenBLAS library in this process,
    read once (`set_blas_threads` reads them again, for a library loaded since)."""
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower()})
    except OSError:
        return []
    controls = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _NAMES:
            if hasattr(lib, name.format("get")) and hasattr(lib, name.format("set")):
                controls.append((getattr(lib, name.format("get")),
                                 getattr(lib, name.format("set"))))
                break
    return controls


def blas_threads():
    """[thread count of each OpenBLAS library loaded in this process] ([] when none)."""
    return [int(get()) for get, _ in thread_controls()]


def set_blas_threads(n):
    """Set the thread count of every OpenBLAS library loaded in this process. Returns how
    many libraries were set (0: none found, nothing changed)."""
    thread_controls.cache_clear()  # a library loaded since the last read
    for _, set_threads in thread_controls():
        set_threads(int(n))
    return len(thread_controls())


@contextmanager
def one_blas_thread():
    """One OpenBLAS thread inside the block; each library's count restored after."""
    controls = thread_controls()
    before = [int(get()) for get, _ in controls]
    for _, set_threads in controls:
        set_threads(1)
    try:
        yield
    finally:
        for (_, set_threads), n in zip(controls, before):
            set_threads(n)


def run_tasks(fn, n_tasks, workers):
    """[fn(i) for i in range(n_tasks)] on `workers` threads (BLAS at one thread meanwhile,
    then restored), or in turn for one worker. The calling thread is one of the workers and
    the others are a pool kept for the process (`pool_for`): a step that calls this every
    time (AdamW's update, flash attention's lanes) neither starts threads nor waits for a new
    one to wake. The tasks are taken in index order by whichever worker is free, so the
    first ones start first (Muon puts its largest matrices there). A call from inside a
    pool's task runs its tasks in turn (a worker waiting for its own pool could deadlock)."""
    if workers <= 1 or n_tasks < 2 or getattr(_in_pool, "yes", False):
        return [fn(i) for i in range(n_tasks)]
    results, errors = [None] * n_tasks, []
    order, lock = iter(range(n_tasks)), threading.Lock()

    def drain():  # take the next task until none is left
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                return
            try:
                results[i] = fn(i)
            except BaseException as e:  # noqa: B036 (re-raised below, on the caller)
                errors.append((i, e))
    with one_blas_thread():
        helpers = [pool_for(workers - 1).submit(drain)
                   for _ in range(min(workers, n_tasks) - 1)]
        try:
            drain()
        finally:  # a helper still queued (behind another caller's) has nothing left to do
            wait([h for h in helpers if not h.cancel()])
    if errors:
        raise min(errors, key=lambda ie: ie[0])[1]  # the first failing task's error
    return results


_POOLS = {}  # (process id, threads) -> ThreadPoolExecutor
_POOLS_LOCK = threading.Lock()
_in_pool = threading.local()  # .yes on the pools' threads


def _mark_pool_thread():
    _in_pool.yes = True


def pool_for(n):
    """A pool of n threads kept for the rest of the process (a forked child gets its own:
    its parent's threads do not exist in it)."""
    key = (os.getpid(), n)
    with _POOLS_LOCK:
        if key not in _POOLS:
            _POOLS[key] = ThreadPoolExecutor(n, thread_name_prefix="scratchllm-tasks",
                                             initializer=_mark_pool_thread)
        return _POOLS[key]


def flat_spans(arrays, k, n):
    """The k-th of n equal spans of each array's flat view, [a.reshape(-1)[lo:hi], ...] (views:
    writes reach the arrays), so n threads can share an elementwise pass over them; None when
    the arrays differ in shape or one is not C-contiguous (no flat view): take them whole."""
    first = arrays[0]
    if not all(a.flags.c_contiguous and a.shape == first.shape for a in arrays):
        return None
    lo, hi = first.size * k // n, first.size * (k + 1) // n
    return [a.reshape(-1)[lo:hi] for a in arrays]
