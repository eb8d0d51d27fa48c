"""Context and expert parallel training through the CLI: `mpiexec -n 2 python -m scratchllm
train --cp 2` (ring attention over the zig-zag chunks of every sequence) and `--ep 2` (each MoE
layer's experts split, dispatch and combine all-to-alls) give, in float64, the parameters and
AdamW moments of one process on the whole batch, and their checkpoints resume across grids;
`--dp 2 --balance-across-ranks` computes the MoE balance loss over both ranks' tokens."""
import re
import shutil

import numpy as np
import pytest

from scratchllm.cli import train
from scratchllm.train import checkpoint
from scratchllm.train.checkpoint import load_model

from mpi_runs import max_rel, train_args

pytestmark = pytest.mark.slow  # each test trains under mpiexec; the fast tier's cp=2 and
# ep=2 (with capacity drops) equivalences are grads.mpi's (test_collectives_mpi.py)

MORE = ["--resume", "--steps", "5", "--no-progress", "--eval-every", "100"]


def _same_moments(a, b):
    a, b = checkpoint.load_state(a)[0], checkpoint.load_state(b)[0]
    assert sorted(a) == sorted(b)
    for k in (k for k in b if k.startswith(("opt.m", "opt.v"))):
        assert np.abs(a[k] - b[k]).max() <= 1e-12 * np.abs(b[k]).max(), k


def _resumes_across_grids(mpirun, axis, one, split):
    """A copy of the one-process checkpoint `one` resumed on --AXIS 2 and the split run's
    checkpoint `split` resumed in one process reach the same parameters 2 steps later."""
    both = split.parent / f"one-then-{axis}"
    shutil.copytree(one, both)
    proc = mpirun(2, "-m", "scratchllm", "train", f"--{axis}", "2", *MORE, "--out", str(both),
                  timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert train.main(MORE + ["--out", str(split)]) == 0
    rel, _ = max_rel(load_model(both)[0], load_model(split)[0])
    assert rel <= 1e-12, rel


def test_context_parallel_equals_one_process_and_resumes_in_one(mpirun, small, one):
    """--cp 2 on the dense preset: T = 16 in 4 chunks, rank 0 holding 0-3 and 12-15; its
    predicted bytes (the ring's blocks and the gradients' all-reduce) are the counted ones."""
    data, root = small
    proc = mpirun(2, "-m", "scratchllm", "train", "--cp", "2", *train_args(data, root / "cp"),
                  timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks: 2 (cp=2), 1 thread(s) each" in proc.stdout
    assert "B cp ring_shift + 8,397,824 B cp all_reduce" in proc.stdout, proc.stdout
    assert "(equal to the model's" in proc.stdout, proc.stdout
    assert max_rel(load_model(root / "cp")[0], load_model(one)[0])[0] <= 1e-12
    _same_moments(root / "cp", one)
    _resumes_across_grids(mpirun, "cp", one, root / "cp")


@pytest.fixture(scope="module")
def moe_one(small):
    """3 steps of the moe preset in one process on one data shard (one thread)."""
    data, root = small
    assert train.main(train_args(data, root / "moe-one", "--preset", "moe", "--threads",
                                 "1")) == 0
    return root / "moe-one"


def test_expert_parallel_equals_one_process_on_one_shard_and_resumes_across_grids(
        mpirun, small, moe_one):
    """--ep 2 on the moe preset (8 experts per layer, 4 per rank) against one process with
    --threads 1 (the aux losses of one data shard): parameters, MoE buffers and the gathered
    moments; a one-process checkpoint resumes on ep=2 (the experts sliced on load)."""
    data, root = small
    proc = mpirun(2, "-m", "scratchllm", "train", "--ep", "2",
                  *train_args(data, root / "ep", "--preset", "moe"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks: 2 (ep=2)" in proc.stdout and "model: moe, 2,823,296 parameters" in \
        proc.stdout
    # the bytes counted in the last step are those the step's routing gives (expert_bytes)
    assert re.search(r"communication measured: [\d,]+ bytes sent by rank 0 in the last step "
                     r"\(equal to the model's [\d,]+, its expert-parallel all-to-alls and "
                     r"gathers sized from the step's routing", proc.stdout), proc.stdout
    rel, buffers = max_rel(load_model(root / "ep")[0], load_model(moe_one)[0])
    assert rel <= 1e-12 and buffers <= 1e-12, (rel, buffers)
    _same_moments(root / "ep", moe_one)
    _resumes_across_grids(mpirun, "ep", moe_one, root / "ep")


def test_expert_parallel_with_two_threads_per_rank_equals_one_process_on_two(mpirun, small):
    """--ep 2 --threads 2 (each thread's all-to-alls on its twin of the group; evaluation on
    one thread) against one process with --threads 2 (two shards' aux losses): parameters
    and buffers, the printed validation loss, and the bytes the routing gives."""
    data, root = small
    assert train.main(train_args(data, root / "moe-t2", "--preset", "moe", "--threads",
                                 "2")) == 0
    proc = mpirun(2, "-m", "scratchllm", "train", "--ep", "2", "--threads", "2",
                  *train_args(data, root / "ep-t2", "--preset", "moe"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks: 2 (ep=2), 2 thread(s) each" in proc.stdout
    assert "(equal to the model's" in proc.stdout, proc.stdout
    rel, buffers = max_rel(load_model(root / "ep-t2")[0], load_model(root / "moe-t2")[0])
    assert rel <= 1e-12 and buffers <= 1e-12, (rel, buffers)
    evals = [checkpoint.load_state(root / d)[0]["evals"] for d in ("ep-t2", "moe-t2")]
    assert np.allclose(evals[0], evals[1], rtol=1e-12, atol=0), evals


def test_the_balance_loss_across_ranks_is_one_shards_and_per_rank_is_not(mpirun, small,
                                                                         moe_one):
    """--dp 2 --balance-across-ranks equals one process on one shard (the balance loss over
    the whole batch); plain --dp 2 (a balance loss per rank's micro-batch) does not."""
    data, root = small
    proc = mpirun(2, "-m", "scratchllm", "train", "--dp", "2", "--balance-across-ranks",
                  *train_args(data, root / "across", "--preset", "moe"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(equal to the model's" in proc.stdout, proc.stdout
    assert max_rel(load_model(root / "across")[0], load_model(moe_one)[0])[0] <= 1e-12
    proc = mpirun(2, "-m", "scratchllm", "train", "--dp", "2",
                  *train_args(data, root / "per-rank", "--preset", "moe"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert max_rel(load_model(root / "per-rank")[0], load_model(moe_one)[0])[0] > 1e-9


def test_context_and_expert_parallel_refuse_what_they_do_not_cover(mpirun, small):
    data, root = small
    for extra, message in (
            (["--cp", "2", "--preset", "moe"], "--cp 2: context parallelism does not cover "
                                               "moe's layer 0's FFN MoESpec"),
            (["--cp", "2", "--seq-len", "6"], "--seq-len 6 (the zig-zag split needs a "
                                              "multiple of 2 x 2)"),
            (["--ep", "2"], "--ep 2: expert parallelism does not cover dense's dense FFNs"),
            (["--cp", "2", "--zero", "3"], "--zero 3 with --cp 2"),
            (["--pp", "2", "--threads", "2"], "--pp 2: one data shard per rank (got --threads 2"),
            (["--dp", "2", "--balance-across-ranks"], "the model has no top-k MoE layer")):
        proc = mpirun(2, "-m", "scratchllm", "train", *train_args(data, root / "no-cp"),
                      *extra)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr
