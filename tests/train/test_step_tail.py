"""The step's tail on the flat gradients (core/flat_grads.py: the replicas summed with each
Param's squares; the clip's factor taken into AdamW's pass) gives the bits of the Param by
Param path: the sum, clip_grad_norm's scaling, then AdamW."""
import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.core import fused_adamw
from scratchllm.core.flat_grads import FlatGrads
from scratchllm.train import DataParallel, Run, Settings


def _run(threads, clip, flat, monkeypatch):
    monkeypatch.setattr(FlatGrads, "fits", staticmethod(lambda models: flat))
    run = Run(lm_tiny("dense"), Settings(batch_size=5, seq_len=7, steps=20, threads=threads,
                                         clip=clip, warmup=2, lr=0.02))
    ids = np.random.default_rng(0).integers(0, 23, 400)
    for _ in range(6):
        run.train_step(ids)
    assert (run.dp.flat is not None) == flat and (run.dp.squares is not None) == flat
    return run.losses, [p.data.copy() for p in run.model.parameters()] + run.opt.m + run.opt.v


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("clip", [0.05, 1e3])  # every step clipped / none
def test_flat_tail_gives_the_bits_of_the_param_by_param_tail(threads, clip, monkeypatch):
    losses, arrays = _run(threads, clip, True, monkeypatch)
    losses0, arrays0 = _run(threads, clip, False, monkeypatch)
    assert losses == losses0
    for a, b in zip(arrays, arrays0):
        np.testing.assert_array_equal(a, b)


def test_data_parallel_leaves_each_summed_gradients_squares():
    model = Run(lm_tiny("dense"), Settings(batch_size=4, threads=2)).model
    dp = DataParallel(model, 2)
    rng = np.random.default_rng(1)
    dp.loss_backward(rng.integers(0, 23, (4, 7)), rng.integers(0, 23, (4, 7)))
    assert dp.squares.tolist() == [fused_adamw.sum_squares(p.grad) for p in model.parameters()]
