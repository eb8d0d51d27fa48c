"""Numba's on-disk cache (`cache=True`) of a kernel is checked against the source file that
defines the kernel only. A kernel that calls (or inlines) kernels of another module keeps
their old machine code after that module changes. `drop_stale` removes a module's cache files
when a module it calls is newer than them, so the next call compiles afresh.

Only the cache beside the source (__pycache__, Numba's default when it is writable) is
handled; with NUMBA_CACHE_DIR set, clear that directory by hand after editing a kernel.
"""
from pathlib import Path


def drop_stale(path, *deps):
    """Delete __pycache__/<stem>.*.nbi / .nbc of the module file `path` that are older than
    any of `deps` (file names beside `path`)."""
    here = Path(path)
    newest = max((here.parent / d).stat().st_mtime for d in deps)
    for f in (here.parent / "__pycache__").glob(here.stem + ".*.nb[ic]"):
        try:
            if f.stat().st_mtime < newest:
                f.unlink()
        except OSError:                         # another process removed it first
            pass
