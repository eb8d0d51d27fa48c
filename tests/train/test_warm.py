"""The warm-up processes compile the training step's kernels and the BPE encoder into Numba's
on-disk cache (with the run's signatures), so the run's first step and its encoding compile
nothing; each reports what it did."""
from scratchllm.core.compiling import CompileLog
from scratchllm.lm import preset
from scratchllm.tokenizer import EOT, Tokenizer
from scratchllm.tokenizer.train import assemble_vocab
from scratchllm.train.settings import Settings
from scratchllm.train.trainer import Run
from scratchllm.train.warm import KernelWarmup, sum_warmed
import numpy as np

CFG = preset("dense", vocab_size=300, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
             d_ff=32)
S = Settings(steps=2, batch_size=4, seq_len=8, threads=2, warmup=1)


def test_after_the_warm_ups_the_first_step_and_the_encoding_compile_nothing():
    step, encoder = KernelWarmup(CFG, S, np.float32), KernelWarmup.encoder()
    for n, seconds in (step.wait(), encoder.wait()):
        assert n >= 0 and seconds >= 0
    run = Run(CFG, S)
    ids = np.random.default_rng(1).integers(0, 300, 500, dtype=np.int32)
    merges = [(b"a", b"b"), (b"ab", b"c")]
    tok = Tokenizer(assemble_vocab(merges, [EOT]), merges, special_tokens=[EOT])
    with CompileLog() as log:
        run.train_step(ids)
        encoded = tok.encode("abc ab<|endoftext|>", allowed_special={EOT})
    run.dp.close()
    assert log.count == 0, log.records
    assert encoded == [257, 32, 256, 258]  # abc, " ", ab, <|endoftext|>


def test_a_failed_warm_up_says_why():
    bad = KernelWarmup(CFG, Settings(steps=1, batch_size=4, seq_len=10 ** 9), np.float32)
    assert isinstance(bad.wait(), str)


def test_the_warm_ups_results_add_up_and_an_error_wins():
    assert sum_warmed((12, 7.0), (2, 4.5)) == (14, 11.5)
    assert sum_warmed((12, 7.0), None) == (12, 7.0)
    assert sum_warmed((12, 7.0), "EOFError: gone") == "EOFError: gone"
    assert sum_warmed("ValueError: bad", (2, 4.5)) == "ValueError: bad"
