"""Data-parallel training across processes: `mpiexec -n 2 python -m scratchllm train --dp 2`
gives, in float64, the parameters of one process on the whole batch (the checkpoint rank 0
writes loads like any other), MoE aux losses per data shard as with threads, ZeRO-1, 2 and 3
included and resumed across grids; a rank that raises
ends the job with its message, never a hang; a grid that does not fit is refused up front."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scratchllm.cli import train
from scratchllm.train import checkpoint
from scratchllm.train.checkpoint import load_model

from mpi_runs import max_rel, train_args

pytestmark = pytest.mark.slow  # each test trains under mpiexec (5-15 s); the fast tier's
# 2-rank equivalence is grads.mpi's (test_collectives_mpi.py)


def test_dense_on_2_ranks_equals_one_process_on_the_whole_batch(mpirun, small, one):
    """Batch 5: ranks take rows 0-2 and 3-4, weighted 3/5 and 2/5."""
    data, root = small
    proc = mpirun(2, "-m", "scratchllm", "train", "--dp", "2", *train_args(data, root / "dp"),
                  timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks: 2 (dp=2), 1 thread(s) each" in proc.stdout
    assert proc.stdout.count("validation loss") == 1  # rank 0 alone prints
    assert "communication model: 8,397,824 B all_reduce + 8 B sum_scalar sent per step" in \
        proc.stdout  # 2 (P - 1) / P of the grads, and the loss summed
    assert "(equal to the model's 8,397,832)" in proc.stdout
    rel, _ = max_rel(load_model(root / "dp")[0], load_model(one)[0])
    assert rel <= 1e-12, rel


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_equals_one_process_and_its_checkpoint_resumes_on_another_grid(mpirun, small, one,
                                                                            stage):
    """ZeRO-1/2/3 on 2 ranks: the parameters and the gathered AdamW moments of one process;
    then its checkpoint resumed in one process and the one-process checkpoint resumed with
    the same stage on 2 ranks (its moments, gradients and weights sharded on load) reach the
    same parameters 2 steps later."""
    data, root = small
    proc = mpirun(2, "-m", "scratchllm", "train", "--dp", "2", "--zero", str(stage),
                  *train_args(data, root / f"zero{stage}"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ZeRO-{stage}: AdamW state 8.01 MiB" in proc.stdout
    if stage == 1:
        assert "+ 4,199,424 B all_gather" in proc.stdout
    else:  # rank 0 keeps half the gradients (and at stage 3 half the weights)
        weights = "4.00" if stage == 3 else "8.01"
        assert f"gradients 4.00 MiB, weights {weights} MiB on rank 0 between steps, of " \
               f"16.02 MiB, 8.01 MiB, 8.01 MiB unsharded" in proc.stdout, proc.stdout
        assert "B reduce_scatter" in proc.stdout
    assert "(equal to the model's" in proc.stdout
    assert max_rel(load_model(root / f"zero{stage}")[0], load_model(one)[0])[0] <= 1e-12
    a, b = checkpoint.load_state(root / f"zero{stage}")[0], checkpoint.load_state(one)[0]
    assert sorted(a) == sorted(b)
    for k in (k for k in b if k.startswith(("opt.m", "opt.v"))):
        assert np.abs(a[k] - b[k]).max() <= 1e-12 * np.abs(b[k]).max(), k
    shutil.copytree(one, root / f"one-then-zero{stage}")
    more = ["--resume", "--steps", "5", "--no-progress", "--eval-every", "100"]
    proc = mpirun(2, "-m", "scratchllm", "train", "--dp", "2", "--zero", str(stage), *more,
                  "--out", str(root / f"one-then-zero{stage}"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert train.main(more + ["--out", str(root / f"zero{stage}")]) == 0
    rel, _ = max_rel(load_model(root / f"one-then-zero{stage}")[0],
                      load_model(root / f"zero{stage}")[0])
    assert rel <= 1e-12, rel


@pytest.mark.parametrize("zero", ["0", "3"])
def test_moe_on_2_ranks_keeps_the_aux_losses_per_data_shard(mpirun, small, zero):
    """mla (a balance loss and the aux-loss-free bias, whose counts are all-reduced): 2 ranks
    equal one process with 2 threads (2 data shards), not with 1 (one shard's aux loss);
    with ZeRO-3 too (the experts' weights gathered per block)."""
    data, root = small
    extra = ["--zero", zero] if zero != "0" else []
    proc = mpirun(2, "-m", "scratchllm", "train", "--dp", "2", *extra,
                  *train_args(data, root / f"dp-mla{zero}", "--preset", "mla"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(equal to the model's" in proc.stdout  # with each MoE layer's counts all-reduced
    dp = load_model(root / f"dp-mla{zero}")[0]
    if not (root / "t2").exists():
        assert train.main(train_args(data, root / "t2", "--preset", "mla", "--threads", "2")) == 0
        assert train.main(train_args(data, root / "t1", "--preset", "mla", "--threads", "1")) == 0
    rel, buffers = max_rel(dp, load_model(root / "t2")[0])
    assert rel <= 1e-12 and buffers <= 1e-12, (rel, buffers)
    assert max_rel(dp, load_model(root / "t1")[0])[0] > 1e-6


FAILS_ON_RANK_1 = """
import sys
from mpi4py import MPI
from scratchllm.cli import train
from scratchllm.train import trainer
if MPI.COMM_WORLD.rank == 1:
    step = trainer.Run.train_step
    def fails(self, ids):
        if self.step == 1:
            raise ValueError("rank one's disk is on fire")
        return step(self, ids)
    trainer.Run.train_step = fails
sys.exit(train.main(sys.argv[1:]))
"""


def test_a_rank_that_raises_ends_the_job_with_its_message(mpirun, small):
    """Rank 0 waits in step 2's gradient all-reduce for rank 1, which raised: the abort ends
    both (the timeout would fail the test on a hang)."""
    data, root = small
    proc = mpirun(2, "-c", FAILS_ON_RANK_1, "--dp", "2", *train_args(data, root / "fails"),
                  timeout=60)
    assert proc.returncode != 0
    assert "scratchllm train: rank 1 of 2: rank one's disk is on fire" in proc.stderr


def test_a_grid_that_does_not_fit_is_refused_before_any_work(mpirun, small):
    data, root = small
    proc = mpirun(2, "-m", "scratchllm", "train", "--dp", "3", *train_args(data, root / "no"))
    assert proc.returncode == 1
    assert proc.stderr.count("rank grid dp=3 needs 3 ranks, but 2 were started") == 1
    assert not (root / "no").exists() and "data:" not in proc.stdout
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_"))}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    alone = subprocess.run([sys.executable, "-m", "scratchllm", "train", "--dp", "2",
                            *train_args(data, root / "no")], capture_output=True, text=True,
                           env=env, timeout=60)
    assert alone.returncode == 1 and "1 was started (rank 0 alone: no mpiexec?)" in alone.stderr


INTERRUPTED_ON_RANK_1 = """
import signal
import sys
from mpi4py import MPI
from scratchllm.cli import train
from scratchllm.train import trainer
if MPI.COMM_WORLD.rank == 1:
    step = trainer.Run.train_step
    def interrupted(self, ids):
        out = step(self, ids)
        if self.step == 2:
            signal.raise_signal(signal.SIGINT)  # Ctrl-C reaching rank 1 alone
        return out
    trainer.Run.train_step = interrupted
sys.exit(train.main(sys.argv[1:]))
"""


def test_ctrl_c_on_one_rank_stops_every_rank_after_the_same_step(mpirun, small):
    data, root = small
    proc = mpirun(2, "-c", INTERRUPTED_ON_RANK_1, "--dp", "2",
                  *train_args(data, root / "int", "--steps", "6"), timeout=60)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert "interrupted at step 2; checkpoint saved" in proc.stdout
    assert checkpoint.load_state(root / "int")[1]["step"] == 2


# ---------------------------------------------------------------------------- tensor parallel
@pytest.mark.parametrize("sp", [False, True])
def test_tensor_parallel_equals_one_process_and_resumes_across_grids(mpirun, small, one, sp):
    """--tp 2 (heads, SwiGLU units and the vocabulary split; with --sequence-parallel the
    residual stream split along T too): the checkpoint holds the whole model, equal to one
    process's, with the whole AdamW state; one process resumes it, and a one-process
    checkpoint resumes on tp=2, to the same parameters."""
    data, root = small
    name = "tp-sp" if sp else "tp"
    extra = ["--sequence-parallel"] if sp else []
    proc = mpirun(2, "-m", "scratchllm", "train", "--tp", "2", *extra,
                  *train_args(data, root / name), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks: 2 (tp=2), 1 thread(s) each" in proc.stdout
    assert "model: dense, 1,049,728 parameters" in proc.stdout  # the whole model's count
    assert "B tp reduce_scatter" in proc.stdout if sp else "B tp all_reduce" in proc.stdout
    assert "(equal to the model's" in proc.stdout, proc.stdout
    assert max_rel(load_model(root / name)[0], load_model(one)[0])[0] <= 1e-12
    a, b = checkpoint.load_state(root / name)[0], checkpoint.load_state(one)[0]
    assert sorted(a) == sorted(b)
    for k in (k for k in b if k.startswith(("opt.m", "opt.v"))):
        assert np.abs(a[k] - b[k]).max() <= 1e-12 * np.abs(b[k]).max(), k
    shutil.copytree(one, root / f"one-then-{name}")
    more = ["--resume", "--steps", "5", "--no-progress", "--eval-every", "100"]
    proc = mpirun(2, "-m", "scratchllm", "train", "--tp", "2", *extra, *more, "--out",
                  str(root / f"one-then-{name}"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert train.main(more + ["--out", str(root / name)]) == 0
    rel, _ = max_rel(load_model(root / f"one-then-{name}")[0], load_model(root / name)[0])
    assert rel <= 1e-12, rel


@pytest.mark.parametrize("zero", ["0", "1"])
def test_a_2x2_grid_of_data_and_tensor_parallel_equals_one_process(mpirun, small, one, zero):
    """dp=2 x tp=2, with ZeRO-1 sharding each slice's AdamW state over the data-parallel
    ranks too: the parameters and the whole moments of one process."""
    data, root = small
    out = root / f"dp2tp2-zero{zero}"
    extra = ["--zero", zero] if zero != "0" else []
    proc = mpirun(4, "-m", "scratchllm", "train", "--dp", "2", "--tp", "2", *extra,
                  *train_args(data, out), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks: 4 (dp=2 x tp=2)" in proc.stdout
    assert "(equal to the model's" in proc.stdout, proc.stdout
    assert max_rel(load_model(out)[0], load_model(one)[0])[0] <= 1e-12
    a, b = checkpoint.load_state(out)[0], checkpoint.load_state(one)[0]
    for k in (k for k in b if k.startswith(("opt.m", "opt.v"))):
        assert np.abs(a[k] - b[k]).max() <= 1e-12 * np.abs(b[k]).max(), k


def test_tensor_parallel_refuses_what_it_does_not_split(mpirun, small):
    data, root = small
    for extra, message in (
            (["--tp", "2", "--zero", "2"], "--zero 2 with --tp 2"),
            (["--pp", "2", "--zero", "2"], "--zero 2 with --pp 2"),
            (["--dp", "2", "--sequence-parallel"], "--sequence-parallel splits"),
            (["--tp", "2", "--preset", "moe"], "--tp 2: tensor parallelism does not cover")):
        proc = mpirun(2, "-m", "scratchllm", "train", *train_args(data, root / "no-tp", *extra))
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------- pipeline
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipeline_equals_one_process_and_resumes_across_grids(mpirun, small, one, schedule):
    """--pp 2 with 4 micro-batches: the two stages' Params and moments, gathered into the
    checkpoint, equal one process's; the bubble is printed (predicted (P-1)/(M+P-1) = 20%),
    GPipe holds all 4 micro-batches' activations, 1F1B at most 2; a one-process checkpoint
    resumes on the pipeline to the parameters one process reaches."""
    data, root = small
    name = f"pp-{schedule}"
    proc = mpirun(2, "-m", "scratchllm", "train", "--pp", "2", "--micro-batches", "4",
                  "--schedule", schedule, *train_args(data, root / name), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"pipeline: {schedule}, 4 micro-batches on 2 stages: bubble (P-1)/(M+P-1) = 20% " \
           f"predicted" in proc.stdout, proc.stdout
    held = 4 if schedule == "gpipe" else 2
    assert f"at most {held} micro-batches' activations held" in proc.stdout
    assert "B pp send" in proc.stdout and "(equal to the model's" in proc.stdout
    assert max_rel(load_model(root / name)[0], load_model(one)[0])[0] <= 1e-12
    a, b = checkpoint.load_state(root / name)[0], checkpoint.load_state(one)[0]
    for k in (k for k in b if k.startswith(("opt.m", "opt.v"))):
        assert np.abs(a[k] - b[k]).max() <= 1e-12 * np.abs(b[k]).max(), k
    shutil.copytree(one, root / f"one-then-{name}")
    more = ["--resume", "--steps", "5", "--no-progress", "--eval-every", "100"]
    proc = mpirun(2, "-m", "scratchllm", "train", "--pp", "2", "--schedule", schedule, *more,
                  "--out", str(root / f"one-then-{name}"), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert train.main(more + ["--out", str(root / name)]) == 0
    rel, _ = max_rel(load_model(root / f"one-then-{name}")[0], load_model(root / name)[0])
    assert rel <= 1e-12, rel


def test_tensor_and_pipeline_parallel_on_a_2x2_grid_equal_one_process(mpirun, small, one):
    """--tp 2 --pp 2 on 4 ranks (each stage's blocks split Megatron's way, the last stage's
    vocab-parallel loss, an evaluation mid-run): the parameters and moments of one process;
    a one-process checkpoint resumes on that grid to the parameters one process reaches."""
    data, root = small
    out = root / "tp2pp2"
    proc = mpirun(4, "-m", "scratchllm", "train", "--tp", "2", "--pp", "2", "--micro-batches",
                  "2", *train_args(data, out, "--eval-every", "2"), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ranks: 4 (pp=2 x tp=2)" in proc.stdout and "(equal to the model's" in proc.stdout
    assert max_rel(load_model(out)[0], load_model(one)[0])[0] <= 1e-12
    a, b = checkpoint.load_state(out)[0], checkpoint.load_state(one)[0]
    for k in (k for k in b if k.startswith(("opt.m", "opt.v"))):
        assert np.abs(a[k] - b[k]).max() <= 1e-12 * np.abs(b[k]).max(), k
    shutil.copytree(one, root / "one-then-tp2pp2")
    shutil.copytree(one, root / "one-then-one")
    more = ["--resume", "--steps", "5", "--no-progress", "--eval-every", "100"]
    proc = mpirun(4, "-m", "scratchllm", "train", "--tp", "2", "--pp", "2", *more, "--out",
                  str(root / "one-then-tp2pp2"), timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert train.main(more + ["--out", str(root / "one-then-one")]) == 0
    rel, _ = max_rel(load_model(root / "one-then-tp2pp2")[0],
                     load_model(root / "one-then-one")[0])
    assert rel <= 1e-12, rel


def test_zero_1_over_the_data_parallel_ranks_of_each_stage_equals_one_process(mpirun, small,
                                                                             one):
    """--dp 2 --pp 2 --zero 1 on 4 ranks: each stage's AdamW state split over its two
    data-parallel ranks (a quarter of it on rank 0), the checkpoint's parameters and moments
    one process's."""
    data, root = small
    out = root / "dp2pp2-zero1"
    proc = mpirun(4, "-m", "scratchllm", "train", "--dp", "2", "--pp", "2", "--zero", "1",
                  "--micro-batches", "2", *train_args(data, out, "--eval-every", "2"),
                  timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ZeRO-1: AdamW state 4.00 MiB on rank 0 between steps, of 16.02 MiB" in proc.stdout
    assert "(equal to the model's" in proc.stdout, proc.stdout
    assert max_rel(load_model(out)[0], load_model(one)[0])[0] <= 1e-12
    a, b = checkpoint.load_state(out)[0], checkpoint.load_state(one)[0]
    assert sorted(a) == sorted(b)
    for k in (k for k in b if k.startswith(("opt.m", "opt.v"))):
        assert np.abs(a[k] - b[k]).max() <= 1e-12 * np.abs(b[k]).max(), k
