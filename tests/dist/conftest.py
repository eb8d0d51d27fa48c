"""Spawning `mpiexec -n P` from a test: skipped with the reason when the dist extra (mpi4py and
MPICH) is not installed; every run has a timeout, so a hang fails instead of blocking. The
training tests share `small` (a slice of the fixture text) and `one` (the one-process run they
compare with), once per session."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mpirun():
    """mpirun(P, *python_args, timeout=60) -> CompletedProcess of
    `mpiexec -n P python *python_args` (text output, cwd = the repository)."""
    pytest.importorskip("mpi4py", reason='the dist extra is not installed (pip install -e '
                        '".[dist]" brings mpi4py and MPICH)')
    mpiexec = shutil.which("mpiexec")
    assert mpiexec, "mpi4py imports but no mpiexec is on PATH (pip install mpich)"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def run(n, *args, timeout=60):
        return subprocess.run([mpiexec, "-n", str(n), sys.executable, *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    return run


@pytest.fixture(scope="session")
def small(tmp_path_factory):
    """A 12 kB slice of the fixture text (its BPE trains in a second) and a runs folder whose
    cache/ every training run of the session shares."""
    from mpi_runs import FIXTURE
    root = tmp_path_factory.mktemp("dp")
    data = root / "small.txt"
    data.write_bytes(FIXTURE.read_bytes()[:12000])
    return data, root


@pytest.fixture(scope="session")
def one(small):
    """3 steps of the dense preset in one process, one thread, on the whole batch."""
    from mpi_runs import train_args
    from scratchllm.cli import train
    data, root = small
    assert train.main(train_args(data, root / "one", "--threads", "1")) == 0
    return root / "one"
