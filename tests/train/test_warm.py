"""The warm-up process compiles the training step's kernels into Numba's on-disk cache (with
the run's signatures), so the run's first step compiles nothing; it reports what it did."""
from scratchllm.core.compiling import CompileLog
from scratchllm.lm import preset
from scratchllm.train.trainer import Run, Settings
from scratchllm.train.warm import KernelWarmup
import numpy as np

CFG = preset("dense", vocab_size=300, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
             d_ff=32)
S = Settings(steps=2, batch_size=4, seq_len=8, threads=2, warmup=1)


def test_after_the_warm_up_the_first_step_compiles_nothing():
    n, seconds = KernelWarmup(CFG, S, np.float32, tokenizer=True).wait()
    assert n >= 0 and seconds >= 0
    run = Run(CFG, S)
    ids = np.random.default_rng(1).integers(0, 300, 500, dtype=np.int32)
    with CompileLog() as log:
        run.train_step(ids)
    run.dp.close()
    assert log.count == 0, log.records


def test_a_failed_warm_up_says_why():
    bad = KernelWarmup(CFG, Settings(steps=1, batch_size=4, seq_len=10 ** 9), np.float32)
    assert isinstance(bad.wait(), str)
