"""The collectives across ranks: the distributed gradient check of every pair (and of the
tensor-parallel Linear pairs) on 2 and 4 ranks (grads/mpi.py, spawned with mpiexec), a wrong
backward caught by it, and what needs no MPI: the rank grid's error, a one-rank group, ZeRO's
partition, the install message. The fast tier keeps the 2-rank check (one mpiexec, about a
second); the 4-rank run and the broken backward are in the slow tier."""
import builtins
import re

import numpy as np
import pytest

from scratchllm import dist


def test_every_collective_pair_passes_the_distributed_check_on_2_ranks(mpirun):
    """The fast tier's one mpiexec: every pair's gradients and bytes, and a tiny LM trained
    data parallel (plain, ZeRO-1, 2 and 3), tensor parallel (with and without sequence
    parallelism), pipeline parallel (GPipe and 1F1B), context parallel (ring attention) and
    expert parallel (an MoE dropping slots at capacity, the drops counted) equal to one
    process in float64; the MoE balance loss across the data-parallel ranks equal to one
    shard's, and in numbers against the per-rank one."""
    proc = mpirun(2, "-m", "grads.mpi", timeout=180)  # a loaded CI machine
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok    ring_attention (causal, zig-zag) == sdpa on the whole sequence" in proc.stdout
    assert "ok    cp_attention == gqa on the whole sequence (out, dx)" in proc.stdout
    assert "ok    pipeline_hop (a pipeline's point-to-point step)" in proc.stdout
    assert "ok    expert_parallel == the one-process experts (4 experts on 2 ranks" in proc.stdout
    for what in ("dp=2 (plain)", "dp=2 (ZeRO-1)", "dp=2 (ZeRO-2)", "dp=2 (ZeRO-3)", "tp=2",
                 "tp=2 (sequence parallel)", "pp=2 (gpipe, 2 micro-batches)",
                 "pp=2 (1f1b, 2 micro-batches)", "cp=2 (ring attention)",
                 "ep=2 (capacity drops)"):
        assert f"ok    train {what} == one process" in proc.stdout, proc.stdout
    assert "ok    train dp=2 (MoE, balance loss across the ranks; one process on one shard)" \
        in proc.stdout
    assert "ok    ep=2 drops [12, 14] slots per layer at capacity factor 0.6" in proc.stdout
    assert "ok    balance loss per micro-batch 1.96 (mean over 2 ranks) vs across the ranks " \
        "1.00" in proc.stdout
    # the expert-parallel bytes: those the step's routing gives (parallel_moe.expert_bytes)
    assert re.search(r"ok    bytes ep=2 \(capacity drops\): ([\d,]+) sent by rank 0, model \1",
                     proc.stdout), proc.stdout
    assert "ok    train ep=2, 2 threads == one process" in proc.stdout
    assert "ok    train cp=2, 2 threads == one process" in proc.stdout
    assert "63/63 distributed checks pass" in proc.stdout, proc.stdout


@pytest.mark.slow
def test_on_4_ranks_and_on_the_groups_of_a_2x2_grid(mpirun):
    proc = mpirun(4, "-m", "grads.mpi", "--directions", "2", timeout=300)  # 4 ranks on 2 cores
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all_gather on the tp group of dp=2 x tp=2" in proc.stdout
    assert "ok    column then row == the one-process x W1 W2 + b" in proc.stdout
    assert "ok    train dp=4 (ZeRO-3) == one process" in proc.stdout
    assert "ok    train dp=2 x tp=2 (sequence parallel) == one process" in proc.stdout
    assert "ok    train pp=2 x dp=2 (1f1b, 2 micro-batches) == one process" in proc.stdout
    assert "ok    train cp=4 (ring attention) == one process" in proc.stdout
    assert "ok    train ep=4 (capacity drops) == one process" in proc.stdout
    for grid in ("dp=2 x cp=2 (ZeRO-1)", "dp=2 x tp=2 (ZeRO-1)", "dp=2 x ep=2 (ZeRO-1; 2 shards)",
                 "pp=2 x tp=2 (gpipe, 2 micro-batches)", "pp=2 x tp=2 (1f1b, 2 micro-batches)",
                 "pp=2 x dp=2 (ZeRO-1, 1f1b, 2 micro-batches)"):
        assert f"ok    train {grid} == one process" in proc.stdout, proc.stdout
    assert "77/77 distributed checks pass" in proc.stdout, proc.stdout


BROKEN = """
import sys
import numpy as np
from scratchllm import dist
from grads import mpi
world = dist.Group.world()
# g's backward as an all-reduce: the loss of the replicated output counted P times
broken = (dist.reduce_from_group_forward, dist.all_reduce_backward)
x = np.full(3, world.rank + 1.0)
res = mpi.dist_check("g", broken, {"x": x}, world, world, rng=np.random.default_rng(world.rank),
                     rep_out=True)
print(res.ok, res.err)
sys.exit(0 if not res.ok else 1)
"""


@pytest.mark.slow
def test_the_check_catches_an_all_reduce_in_place_of_g_s_identity_backward(mpirun):
    proc = mpirun(2, "-c", BROKEN)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("False"), proc.stdout


def test_a_grid_that_does_not_fit_the_ranks_is_an_error_naming_them():
    with pytest.raises(dist.GridError, match=r"dp=2 x tp=2 needs 4 ranks, but 2 were started "
                                             r"\(ranks 0-1; this is rank 1\).*mpiexec -n 4.*"
                                             r"--dp 2"):
        dist.check_shape(dist.GridShape(dp=2, tp=2), 2, rank=1)
    with pytest.raises(dist.GridError, match="must be >= 1"):
        dist.check_shape(dist.GridShape(dp=0), 1)
    grid = dist.RankGrid(dist.GridShape(), dist.Group.single())
    assert grid.coords == dict.fromkeys(dist.AXES, 0) and grid.groups["dp"].size == 1


def test_rank_coordinates_put_tensor_parallel_ranks_next_to_each_other():
    shape = dist.GridShape(dp=2, tp=2, pp=2)
    assert [dist.coords_of(r, shape)["tp"] for r in range(8)] == [0, 1] * 4
    assert [dist.coords_of(r, shape)["dp"] for r in range(8)] == [0, 0, 1, 1] * 2
    assert [dist.coords_of(r, shape)["pp"] for r in range(8)] == [0] * 4 + [1] * 4


def test_on_one_rank_every_collective_is_a_copy_and_sends_nothing():
    g, x = dist.Group.single(), np.arange(6.0).reshape(2, 3)
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "ring_shift"):
        y, cache = getattr(dist, f"{name}_forward")(x, group=g)
        np.testing.assert_array_equal(y, x)
        np.testing.assert_array_equal(getattr(dist, f"{name}_backward")(x, cache)["x"], x)
    for name in ("all_gather", "reduce_scatter"):  # the -v forms, as ZeRO-2/3 use them
        y, cache = getattr(dist, f"{name}_forward")(x, group=g, counts=[2])
        np.testing.assert_array_equal(y, x)
        np.testing.assert_array_equal(getattr(dist, f"{name}_backward")(x, cache)["x"], x)
    with pytest.raises(ValueError, match=r"all_gather: counts\[0\] = 3, but this rank's x "
                                         r"has 2 rows"):
        dist.all_gather_forward(x, group=g, counts=[3])
    assert g.total_sent() == 0


def test_zero_3_refuses_data_parallel_threads_and_on_one_rank_keeps_every_weight():
    from grads.cases import lm_tiny
    from scratchllm.train.settings import Settings
    from scratchllm.train.trainer import Run
    grid = dist.RankGrid(dist.GridShape(), dist.Group.single())
    with pytest.raises(ValueError, match=r"--zero 3 .* --threads 2 is not supported"):
        Run(lm_tiny("dense"), Settings(threads=2), np.float64, grid=grid, zero=3)
    run = Run(lm_tiny("dense"), Settings(threads=1), np.float64, grid=grid, zero=3)
    weights, grads = run.shards.held_bytes()
    assert weights == grads == run.model.n_params() * 8


def test_gradient_buckets_keep_reverse_order_and_the_size_limit():
    from scratchllm.core.nn import Param
    params = [Param(np.zeros(n)) for n in (10, 200, 30, 40)]
    plan = dist.buckets(params, bucket_bytes=8 * 100)
    assert [[p.data.size for p in b] for b in plan] == [[40, 30], [200], [10]]


def test_without_mpi4py_the_error_says_how_to_install_it(monkeypatch):
    real_import = builtins.__import__

    def no_mpi(name, *args, **kwargs):
        if name.startswith("mpi4py"):
            raise ImportError("No module named 'mpi4py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mpi)
    with pytest.raises(dist.MPIUnavailable, match=r'pip install -e "\.\[dist\]"'):
        dist.mpi()


def test_zero_partition_gives_whole_params_largest_first_to_the_least_loaded_rank():
    assert dist.partition([10, 200, 30, 40], 2) == [1, 0, 1, 1]
    assert dist.partition([5, 5, 5], 3) == [0, 1, 2]


def test_zero_adamw_on_one_rank_is_adamw_and_keeps_its_state_layout():
    from scratchllm.core.nn import Param
    from scratchllm.core.optim import AdamW
    rng = np.random.default_rng(0)
    a = [Param(rng.standard_normal(s)) for s in ((3, 4), (5,))]
    b = [Param(p.data.copy()) for p in a]
    plain, zero = AdamW(a, lr=0.1), dist.ZeroAdamW(AdamW(b, lr=0.1), dist.Group.single())
    for _ in range(2):
        for p, q in zip(a, b):
            p.grad[...] = q.grad[...] = rng.standard_normal(p.data.shape)
        plain.step()
        zero.step()
    for p, q in zip(a, b):
        np.testing.assert_array_equal(p.data, q.data)
    want, got = plain.state_dict(), zero.state_dict()
    assert list(want) == list(got)
    for k in want:
        np.testing.assert_array_equal(want[k], got[k])


def test_train_with_dp_but_without_mpi_says_how_to_install_it(monkeypatch, capsys):
    from scratchllm.cli import train

    def missing():
        raise dist.MPIUnavailable("parallel training needs MPI, which is not installed; "
                                  f"install it with: {dist.INSTALL}")

    monkeypatch.setattr(train.Group, "world", missing)
    assert train.main(["--dp", "2", "--steps", "1"]) == 1
    assert 'scratchllm train: parallel training needs MPI' in capsys.readouterr().err
