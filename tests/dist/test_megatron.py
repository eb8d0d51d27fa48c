"""Tensor and pipeline parallelism without MPI: on a group of one rank MegatronLM is the
LM it was cut from (loss and every gradient, with and without sequence parallelism), the
splits and the configs it refuses; the pipeline schedules and their bubble. Across ranks:
grads.mpi (fast tier) and test_data_parallel_mpi.py (slow tier)."""
import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm import dist
from scratchllm.lm import LM, preset
from scratchllm.train.megatron import (MegatronLM, check_tensor_parallel, local_config,
                                       split_axis)


@pytest.mark.parametrize("sequence", [False, True])
def test_on_one_rank_megatron_is_the_lm_it_was_cut_from(sequence):
    cfg = lm_tiny("dense", vocab_size=24)
    rng = np.random.default_rng(1)
    ids, targets = rng.integers(0, 24, (2, 6)), rng.integers(0, 24, (2, 6))
    plain = LM(cfg, rng=np.random.default_rng(5), dtype=np.float64)
    tp = MegatronLM(cfg, dist.Group.single(), rng=np.random.default_rng(5), dtype=np.float64,
                    sequence=sequence)
    for model in (plain, tp):
        model.zero_grad()
        loss, cache = model.loss(ids, targets)
        model.loss_backward(1.0, cache)
    assert float(tp.loss(ids, targets)[0]) == pytest.approx(float(plain.loss(ids, targets)[0]),
                                                            rel=1e-14)
    for (n, p), (_, q) in zip(plain.named_parameters(), tp.named_parameters()):
        np.testing.assert_allclose(q.grad, p.grad, rtol=1e-12, atol=1e-15, err_msg=n)


def test_the_splits_follow_megatron():
    assert [split_axis(f"layers.0.{n}") for n in ("mixer.wq", "mixer.wo", "ffn.W1", "ffn.W2",
                                                  "norm1.g")] == [1, 0, 1, 0, None]
    assert (split_axis("embed.E"), split_axis("head.W"), split_axis("norm.g")) == (0, 1, None)
    local = local_config(preset("dense"), 2)
    assert (local.vocab_size, local.layers[0].mixer.n_heads, local.layers[0].mixer.n_kv_heads,
            local.layers[0].mixer.head_dim, local.layers[0].ffn.d_ff) == (512, 2, 1, 32, 192)


def test_configs_it_cannot_split_are_named():
    with pytest.raises(ValueError, match=r"--tp 4: .*2 KV heads \(not multiples of 4\)"):
        check_tensor_parallel(preset("dense"), 4)
    with pytest.raises(ValueError, match=r"--tp 2: .*layer 0's FFN"):
        check_tensor_parallel(preset("moe"), 2)
    with pytest.raises(ValueError, match=r"vocab_size 23 \(not a multiple of 2\)"):
        check_tensor_parallel(lm_tiny("dense"), 2)


def test_pipeline_schedules_and_their_bubble():
    from scratchllm.train.pipeline import bubble_fraction, schedule
    assert schedule("gpipe", 2, 0, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("B", 1),
                                          ("B", 2)]
    # 1F1B on the first of 2 stages: one warm-up forward, then forward/backward pairs
    assert schedule("1f1b", 2, 0, 3) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1),
                                         ("B", 2)]
    assert schedule("1f1b", 2, 1, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2),
                                         ("B", 2)]
    for P, M in ((2, 4), (4, 8), (3, 1)):
        for s in range(P):
            ops = schedule("1f1b", P, s, M)
            assert sorted(ops) == sorted(schedule("gpipe", P, s, M))
            held = max(sum(op == "F" for op, _ in ops[:i + 1]) -
                       sum(op == "B" for op, _ in ops[:i + 1]) for i in range(len(ops)))
            assert held == min(P - s, M)  # 1F1B's memory bound; GPipe holds M
    assert bubble_fraction(2, 4) == pytest.approx(0.2) and bubble_fraction(4, 1) == 0.75
    with pytest.raises(ValueError, match="schedule must be one of"):
        schedule("zigzag", 2, 0, 2)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_the_simulated_schedule_idles_for_the_formula_s_bubble(name):
    """Each stage running its schedule, ops starting when their input has arrived: the idle
    share is (P-1)/(M+P-1) at every size up to 32 micro-batches (equal stages; a backward
    twice a forward, or as cheap as one)."""
    from scratchllm.train.pipeline import bubble_fraction, simulated_bubble
    for P in (2, 3, 4):
        for M in (1, 2, 4, 8, 16, 32):
            assert simulated_bubble(name, P, M) == pytest.approx(bubble_fraction(P, M))
    assert simulated_bubble(name, 4, 16) == pytest.approx(3 / 19)
    assert simulated_bubble(name, 2, 8, f_cost=1.0, b_cost=1.0) == pytest.approx(1 / 9)


def test_expert_parallel_bytes_count_the_slots_that_change_rank():
    """expert_bytes against a count slot by slot: rank r sends the slots of its run owned by
    another rank's experts and receives its experts' slots of other runs, each way twice
    (forward and backward); the all-gathers send every run but the successor's, twice; and
    the config's bound holds when every slot is kept."""
    from scratchllm.specs.presets import preset
    from scratchllm.train.parallel_moe import expert_bytes, expert_bytes_bound
    rng = np.random.default_rng(0)
    for P, E in ((2, 4), (4, 8), (3, 6)):
        for _ in range(5):
            per_expert = rng.integers(0, 7, E)
            bounds = np.concatenate(([0], np.cumsum(per_expert)))
            M = int(bounds[-1])
            owner = np.repeat(np.arange(E) // (E // P), per_expert)  # (M,) each slot's owner
            run = np.concatenate([np.full(len(c), j) for j, c in
                                  enumerate(np.array_split(np.arange(M), P))])  # (M,)
            for r in range(P):
                moved = int(np.sum((run == r) & (owner != r)) + np.sum((owner == r) & (run != r)))
                succ = int(np.sum(run == (r + 1) % P))
                assert expert_bytes(bounds, r, P, 12) == {"ep all_to_all": 2 * moved * 12,
                                                          "ep all_gather": 2 * (M - succ) * 12}
    cfg = preset("moe")
    k, E = cfg.layers[0].ffn.router.top_k, cfg.layers[0].ffn.router.n_experts
    n_moe = sum(1 for ls in cfg.layers if hasattr(ls.ffn, "router"))
    bound = expert_bytes_bound(cfg, 2, 10, 4)
    M = 10 * k  # no capacity: every slot kept
    assert bound == {"ep all_to_all (at most)": n_moe * 2 * M * cfg.d_model * 4,
                     "ep all_gather (at most)": n_moe * 2 * (M - M // 2) * cfg.d_model * 4}
    worst = np.array([0] + [M] * E)  # every slot on expert 0 (rank 0 receives half)
    assert sum(expert_bytes(worst, 0, 2, cfg.d_model * 4).values()) * n_moe <= \
        sum(bound.values())


def test_threads_per_rank_go_with_context_and_expert_parallel_only():
    """--cp and --ep take data-parallel threads (each thread's collectives on its twin of the
    group); --tp and --pp refuse them by name."""
    from scratchllm.train.parallel_run import check_combination
    check_combination({"cp": 2}, threads=2, zero=0)
    check_combination({"ep": 2}, threads=2, zero=0)
    for axis in ("tp", "pp"):
        with pytest.raises(ValueError, match=rf"--{axis} 2: one data shard per rank \(got "
                                             rf"--threads 2; use --threads 1; --cp and --ep"):
            check_combination({axis: 2}, threads=2, zero=0)
