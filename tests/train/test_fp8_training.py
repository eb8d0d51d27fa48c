"""Training with FP8 matmuls (Settings.fp8): every Linear but the head runs the FP8 pair in the
step and in evaluation, the weights stay float32, and the loss stays near float32's."""
import numpy as np

from grads.cases import lm_tiny
from scratchllm.core.fp8 import FP8LinearCache
from scratchllm.train import trainer


def _run(fp8):
    s = trainer.Settings(batch_size=2, seq_len=8, steps=3, warmup=1, threads=1, fp8=fp8)
    return trainer.Run(lm_tiny("dense"), s)


def test_an_fp8_step_quantises_the_blocks_linears_and_not_the_head():
    ids = np.random.default_rng(0).integers(0, lm_tiny("dense").vocab_size, 400)
    runs = {fp8: _run(fp8) for fp8 in (False, True)}
    for run in runs.values():
        for _ in range(3):
            run.train_step(ids)
    a, b = runs[False].losses, runs[True].losses
    assert a[0] == b[0] or abs(a[0] - b[0]) < 0.05  # step 1: the same weights, FP8 rounding
    assert a != b and all(np.isfinite(b))
    assert all(p.data.dtype == np.float32 for p in runs[True].model.parameters())
    model = runs[True].model
    with runs[True].precision():
        _, cache = model.forward(ids[:16].reshape(2, 8))
    kinds = {type(c).__name__ for c in _leaves(cache)}
    assert "FP8LinearCache" in kinds
    assert not isinstance(cache.head.proj, FP8LinearCache)  # the head stays float


def _leaves(tree):
    if isinstance(tree, FP8LinearCache):
        yield tree
    elif isinstance(tree, (tuple, list)):
        for t in tree:
            yield from _leaves(t)
