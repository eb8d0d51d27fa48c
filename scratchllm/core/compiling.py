"""Where a run's first seconds go: Numba's compilations, counted and timed.

A kernel with `cache=True` compiles once per signature and machine, then loads from its
on-disk cache (__pycache__, or NUMBA_CACHE_DIR). A fresh clone, a new NumPy or a changed
kernel compiles again, and on two cores that costs seconds per kernel. CompileLog listens to
Numba's "numba:compile" event, which fires only when a kernel really compiles (a cache hit
loads without it), and keeps one record per top-level compilation (a kernel compiled while
typing another is part of its caller's time, and counted in `nested`).

    with CompileLog() as log:
        run_the_job()
    log.count, log.seconds, log.records   # [(kernel name, phase, seconds), ...]

PhaseClock times the named phases of a run (data, train, ...) and says which phase each
compilation fell in (the phase the main thread was in, whichever thread compiled):

    clock = PhaseClock()
    with clock.phase("data"):
        ...
    print(clock.summary())
"""
import os
import threading
import time
from contextlib import contextmanager

import numba
from numba.core import event
from numba.core.registry import CPUDispatcher

__all__ = ["CompileLog", "PhaseClock", "cpu_seconds", "inner_kernel"]


class CompileLog(event.Listener):
    """Every Numba compilation of this process while entered (all threads; not the forked
    worker processes of a Pool, which compile for themselves)."""

    def __init__(self):
        self.records = []  # (kernel name, phase, seconds) per top-level compilation
        self.nested = 0    # kernels compiled inside another one's compilation
        self.restarted = 0.0  # seconds of compilations abandoned and started again
        self.phase = None  # the label of the records made from now on (PhaseClock sets it)
        self._local = threading.local()
        self._lock = threading.Lock()

    def on_start(self, ev):
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append((time.perf_counter(), len(ev.data["dispatcher"].overloads)))

    def on_end(self, ev):
        stack = self._local.stack
        t0, n_before = stack.pop()
        dispatcher = ev.data["dispatcher"]
        name = getattr(dispatcher, "__qualname__", "?")
        failed = len(dispatcher.overloads) == n_before  # it raised: no new specialisation
        with self._lock:
            if stack:
                self.nested += 1
            elif failed:  # e.g. retyped with literal arguments (numba.literally): same kernel
                self.restarted += time.perf_counter() - t0
            else:
                self.records.append((name, self.phase, time.perf_counter() - t0))

    @property
    def count(self):
        """Top-level compilations."""
        return len(self.records)

    @property
    def seconds(self):
        """Wall seconds spent in top-level compilations (summed over threads)."""
        return sum(r[2] for r in self.records) + self.restarted

    def __enter__(self):
        event.register("numba:compile", self)
        return self

    def __exit__(self, *exc):
        event.unregister("numba:compile", self)


def _process_start():
    """perf_counter() at this process's start (from /proc; None where there is no /proc)."""
    try:
        with open(f"/proc/{os.getpid()}/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return time.perf_counter() - (float(f.read().split()[0]) - started)
    except (OSError, ValueError, IndexError):
        return None


class PhaseClock:
    """Where a run's wall time went: seconds per named phase, each phase's own (a phase
    entered inside another pauses it, so the phases and "other" add up to the total), with a
    CompileLog that labels each compilation with the phase it fell in. Listens to Numba from
    its creation until close()."""

    def __init__(self):
        self.seconds = {}        # phase -> its own wall seconds (its compilations included)
        self.log = CompileLog()
        self.started = _process_start() or time.perf_counter()
        self._since = None       # perf_counter() when the current phase last (re)started
        self.log.__enter__()
        self._open = True

    def _charge(self):
        """Add the time since the last switch to the current phase."""
        now = time.perf_counter()
        if self.log.phase is not None:
            name = self.log.phase
            self.seconds[name] = self.seconds.get(name, 0.0) + now - self._since
        self._since = now

    @contextmanager
    def phase(self, name):
        self._charge()
        outer, self.log.phase = self.log.phase, name
        self.seconds.setdefault(name, 0.0)
        try:
            yield
        finally:
            self._charge()
            self.log.phase = outer

    def timed(self, name, fn):
        """fn wrapped so that each call counts as the phase `name`."""
        def timed_fn(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)
        return timed_fn

    def close(self):
        """Stop listening to Numba (idempotent)."""
        if self._open:
            self.log.__exit__(None, None, None)
            self._open = False

    def summary(self):
        """'time: 71 s in all: data 0.2 s, BPE training 8.1 s, encoding 3.2 s, train 51.2 s,
        ..., other 2.1 s; Numba compiled 13 kernels in 10.2 s of it (train 9.1 s, ...); CPU
        130.2 s (...)' ("other": imports, printing, anything outside a phase)."""
        total = time.perf_counter() - self.started
        other = total - sum(self.seconds.values())
        parts = [f"{k} {v:.1f} s" for k, v in self.seconds.items()]
        line = f"time: {total:.0f} s in all: {', '.join(parts)}, other {other:.1f} s"
        by = {}
        for _, where, sec in self.log.records:
            by[where] = by.get(where, 0.0) + sec
        n = self.log.count
        line += f"; Numba compiled {n} kernel{'s' * (n != 1)} in {self.log.seconds:.1f} s of it"
        if n:
            line += " (" + ", ".join(f"{k} {v:.1f} s" for k, v in by.items()) + ")"
        return line + "; " + cpu_seconds()


def cpu_seconds():
    """'CPU 130.2 s (this process 118.0 s, its finished child processes 12.2 s)': user +
    system time so far (os.times), the measure that a loaded machine does not inflate much
    (wall time there mostly waits for a core)."""
    t = os.times()
    own, children = t.user + t.system, t.children_user + t.children_system
    return (f"CPU {own + children:.1f} s (this process {own:.1f} s, its finished child "
            f"processes {children:.1f} s)")


class _InnerDispatcher(CPUDispatcher):
    """A dispatcher whose kernels have no CPython entry point (inner_kernel): a call from
    Python is refused here instead of jumping to the missing entry (a segmentation fault)."""

    def __call__(self, *args, **kwargs):
        raise TypeError(f"{self.py_func.__qualname__} is an inner kernel (compiled without a "
                        f"Python entry point): call it from a Numba kernel, not from Python")


def inner_kernel(fn):
    """nb.njit(cache=True) for a kernel that only other kernels call, compiled without its
    CPython wrapper (the code that unboxes every argument from Python objects and boxes the
    result, as Numba's own @overload implementations are): per helper it costs more to type,
    lower, optimise and emit than a small helper itself. The BPE merge loop's 13 helpers took
    ~1 of its ~5.5 CPU s cold with their wrappers. A caller links the helper's native function,
    not its wrapper, so nothing else changes; a call from Python is a TypeError."""
    if numba.config.DISABLE_JIT:
        return fn
    disp = _InnerDispatcher(py_func=fn, locals={},
                            targetoptions={"nopython": True, "no_cpython_wrapper": True})
    disp.enable_caching()
    return disp
