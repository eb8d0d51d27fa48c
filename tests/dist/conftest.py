"""Spawning `mpiexec -n P` from a test: skipped with the reason when the dist extra (mpi4py and
MPICH) is not installed; every run has a timeout, so a hang fails instead of blocking."""
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
