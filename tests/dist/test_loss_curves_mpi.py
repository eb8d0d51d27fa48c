"""Loss curves in float32: 5 steps on 2 ranks of each kind of parallelism (data, tensor,
pipeline, context, expert) against one process on the whole batch agree to 1e-5 relative, step
by step (float32 sums in another order: the curves are not bit-equal, and must not drift)."""
import numpy as np
import pytest

from scratchllm.cli import train
from scratchllm.train import checkpoint

from mpi_runs import train_args

pytestmark = pytest.mark.slow  # five trainings under mpiexec

F32 = ["--dtype", "float32", "--steps", "5"]


@pytest.fixture(scope="module")
def curves(small):
    """{preset: the one-process loss curve}, dense and moe, float32, one data shard."""
    data, root = small
    out = {}
    for preset in ("dense", "moe"):
        run = root / f"f32-{preset}"
        assert train.main(train_args(data, run, "--preset", preset, "--threads", "1",
                                     *F32)) == 0
        out[preset] = checkpoint.load_state(run)[0]["losses"]
    return out


@pytest.mark.parametrize("axis,preset", [("dp", "dense"), ("tp", "dense"), ("pp", "dense"),
                                         ("cp", "dense"), ("ep", "moe")])
def test_the_float32_loss_curve_on_2_ranks_is_one_process_s(mpirun, small, curves, axis,
                                                             preset):
    data, root = small
    run = root / f"f32-{axis}"
    proc = mpirun(2, "-m", "scratchllm", "train", f"--{axis}", "2",
                  *train_args(data, run, *F32, "--preset", preset), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got, want = checkpoint.load_state(run)[0]["losses"], curves[preset]
    assert got.shape == want.shape == (5,)
    rel = np.abs(got - want).max() / np.abs(want).max()
    assert rel <= 1e-5, (rel, got, want)
