"""The test run on every core: setup.cfg's addopts run the tests in pytest-xdist workers
(`-n auto`, one per core this process may use, at most MAX_WORKERS), each test file whole on
one worker (its module fixtures are built once), tests/dist's files together on one worker
(their session fixtures are shared, and one `mpiexec` job runs at a time), and files that
compile the same Numba kernels together (SHARED_KERNELS); a kernel compiles in one worker at a
time (one_compile_at_a_time), the others then load it. With workers, each runs OpenBLAS on
one thread: two workers of two BLAS threads each on two cores would spin-wait for each other.
`-n 0` runs everything in this process with the defaults untouched."""
import os
import tempfile
import time

MAX_WORKERS = 4  # each worker holds its own NumPy, Numba and kernels (peaks near 1 GB measured)


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: the cores this process may use, at most MAX_WORKERS (one core: no workers;
    PYTEST_XDIST_AUTO_NUM_WORKERS, when set, decides instead)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    n = min(cores, MAX_WORKERS)
    return n if n > 1 else 0


def pytest_configure(config):
    """In the controller of a run with workers: one OpenBLAS thread per worker (set before the
    workers start, so it is in their environment before NumPy loads; a value the user set
    is kept) and a folder of compile locks (one_compile_at_a_time). In a worker: take them."""
    workers = getattr(config.option, "numprocesses", None)
    if workers and not hasattr(config, "workerinput"):
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        config._compile_locks = tempfile.TemporaryDirectory(prefix="scratchllm-compiles-")
        os.environ[LOCKS] = config._compile_locks.name
    elif hasattr(config, "workerinput") and os.environ.get(LOCKS):
        one_compile_at_a_time(os.environ[LOCKS])


def pytest_unconfigure(config):
    locks = getattr(config, "_compile_locks", None)
    if locks is not None:
        locks.cleanup()


LOCKS = "SCRATCHLLM_TEST_COMPILE_LOCKS"


def one_compile_at_a_time(folder, patience=900.0):
    """Each of scratchllm's Numba kernels compiles in one process at a time: a lock file per
    kernel in `folder`, taken around Numba's Dispatcher.compile (which first looks in the
    memory of this process, then in Numba's on-disk cache, and only then compiles, saving to
    that cache). A worker that needs a kernel another worker (or a process it forked) is
    compiling waits, then loads it from the cache, instead of compiling it a second time side
    by side. Reentrant in a process (a kernel compiling the kernels it calls); after
    `patience` seconds of waiting it compiles anyway."""
    import fcntl

    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.dispatcher import Dispatcher

    compile_ = Dispatcher.compile
    held = set()  # the kernels this process holds the lock of

    def compile(self, sig):
        name = f"{self.py_func.__module__}.{self.py_func.__qualname__}"
        if not name.startswith("scratchllm.") or name in held:
            return compile_(self, sig)
        with global_compiler_lock, open(os.path.join(folder, name), "a") as lock:
            deadline = time.monotonic() + patience
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)
            held.add(name)
            try:
                return compile_(self, sig)
            finally:
                held.discard(name)  # closing the file releases the lock

    Dispatcher.compile = compile


# Files that compile the same Numba kernels run as one work unit, one after the other on one
# worker: the second loads what the first compiled from Numba's cache. Side by side on two
# workers, each would compile them itself (a kernel lands in the cache only when compiled).
SHARED_KERNELS = {
    "tests/tokenizer/test_unigram_kernels.py": "unigram EM kernels",
    "tests/tokenizer/test_unigram.py": "unigram EM kernels",
}


def work_unit(nodeid):
    """The work unit of a test: its file, its SHARED_KERNELS group, or tests/dist."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/dist/"):
        return "tests/dist"
    return SHARED_KERNELS.get(path, path)


def pytest_xdist_make_scheduler(config, log):
    """Work units for the workers (work_unit), largest first (xdist's order by test count)."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return work_unit(nodeid)

    return FileScheduling(config, log)
