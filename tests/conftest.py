"""The test run on every core: setup.cfg's addopts run the tests in pytest-xdist workers
(`-n auto`, one per core this process may use, at most MAX_WORKERS), each test file whole on
one worker (its module fixtures are built once), tests/dist's files together on one worker
(their session fixtures are shared, and one `mpiexec` job runs at a time). With workers, each runs OpenBLAS on one thread: two workers
of two BLAS threads each on two cores would spin-wait for each other. `-n 0` runs everything
in this process with the defaults untouched."""
import os

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
    workers start, so it is in their environment before NumPy loads); a value the user set
    is kept."""
    workers = getattr(config.option, "numprocesses", None)
    if workers and not hasattr(config, "workerinput"):
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def pytest_xdist_make_scheduler(config, log):
    """Work units for the workers: one per test file, tests/dist's files all one."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            return "tests/dist" if path.startswith("tests/dist/") else path

    return FileScheduling(config, log)
