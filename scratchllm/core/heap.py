"""Keep freed memory in the process for reuse: glibc malloc's tuning for a training loop.

A training step allocates and frees the same few hundred arrays every step (activations,
caches, gradients: tens of MB). glibc's malloc serves an allocation above its mmap threshold
(128 KiB at start, raised as large blocks are freed) with a fresh mmap, and gives a freed
heap top back to the kernel above its trim threshold; each worker thread also gets an arena
of its own, whose heaps are given back the same way. Either way the next step's arrays land
on new pages, and the kernel zero-fills every 4 KiB page on its first touch: on the dense
preset that was ~12,900 page faults a step, 30-35 ms of system time out of ~235 ms of CPU
(1 thread), more with two threads faulting into one address space.

`keep_freed_memory` fixes the thresholds (mmap only above 32 MiB, never trim below 1 GiB
of free top) and puts every thread in one arena, so a step's arrays reuse the last step's
pages: the faults drop to a few a step. The cost: the process's resident size stays at its
high-water mark instead of shrinking between steps (it does not raise the peak). PyTorch's
CPU tuning guide gives the same advice for the same reason (swap in jemalloc or TCMalloc,
which cache freed blocks).

The parameters are mallopt(3)'s. Reference: bminor/glibc malloc/malloc.c (M_MMAP_THRESHOLD,
M_TRIM_THRESHOLD, M_ARENA_MAX); pytorch/tutorials recipes_source/recipes/tuning_guide.py
(CPU-specific optimizations).
"""
import ctypes
import ctypes.util
from functools import lru_cache

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # malloc.h's parameter numbers
MMAP_ABOVE = 32 << 20  # bytes: allocations above this still get their own mapping
TRIM_ABOVE = 1 << 30   # bytes of free heap top before any is given back


@lru_cache(maxsize=1)
def keep_freed_memory():
    """Tune glibc's malloc for a loop that reallocates the same arrays (module docstring),
    once per process. Returns True when it was applied, False where malloc is not glibc's
    (macOS, Windows, musl: nothing is changed)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, version = libc.mallopt, libc.gnu_get_libc_version  # glibc only
    except (OSError, AttributeError):
        return False
    del version
    settings = ((M_MMAP_THRESHOLD, MMAP_ABOVE), (M_TRIM_THRESHOLD, TRIM_ABOVE),
                (M_ARENA_MAX, 1))
    return all(mallopt(param, value) == 1 for param, value in settings)
