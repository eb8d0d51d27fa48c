"""Compile the training step's Numba kernels in the background while the data is prepared.

On a fresh clone every fused kernel of the step (RMSNorm, RoPE, the softmax, SwiGLU's gate,
the cross-entropy, AdamW: one signature each) compiles at the first step, one after another:
Numba holds one compiler lock per process, so a thread cannot compile beside the tokenizer's
own kernels. A forked process can: `KernelWarmup` forks one that runs a step of the same
model, batch shape and dtype on made-up ids, so each kernel compiles there with the
signature the run will ask for and lands in Numba's on-disk cache; the run waits for it
(`wait`) before its first step and then only loads them. With a warm cache the child loads
them too and ends within a second. Anything it fails at, the run compiles itself, as before.
`KernelWarmup.encoder()` forks one for the BPE encoding kernel alone: the first run starts it
once its own counting kernels are compiled (the encoder loads GPT-2's scanner from their
cache), so on two cores the encoder compiles beside the tokenizer's training and the step's
warm-up instead of after either.
"""
import multiprocessing as mp
from dataclasses import replace

import numpy as np

from scratchllm.core.compiling import CompileLog
from scratchllm.tokenizer import EOT, Tokenizer
from scratchllm.tokenizer.train import assemble_vocab, count_chunk
from scratchllm.train import corpus
from scratchllm.train.trainer import Run

__all__ = ["EncoderFirst", "KernelWarmup", "sum_warmed"]


def _warm(cfg, settings, dtype, conn, tokenizer):
    """In the child: with a cfg, one step and one validation batch of a fresh model of cfg on
    random ids (threads, batch and context as the run's); with `tokenizer`, encode a few bytes
    with a BPE tokenizer of two merges (the encoding kernel, with the signature of the run's:
    GPT-2's scanner must be in the cache by then, or it compiles twice); then send (kernels
    compiled, seconds)."""
    try:
        with CompileLog() as log:
            if cfg is not None:
                _warm_step(cfg, settings, dtype)
            if tokenizer:
                merges = [(b"a", b" "), (b"1", b".")]
                Tokenizer(assemble_vocab(merges, [EOT]), merges, special_tokens=[EOT]).encode(
                    "a 1. a", allowed_special={EOT})
        conn.send((log.count, log.seconds))
    except BaseException as e:  # the run compiles what is missing itself
        conn.send(f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def _warm_step(cfg, settings, dtype):
    """One training step and one validation batch of a fresh model of cfg on random ids."""
    run = Run(cfg, replace(settings, steps=1, warmup=0), dtype)
    run.eot = 0  # any id: --pack-documents' masks need a separator
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, 4 * settings.seq_len
                                            * settings.batch_size, dtype=np.int32)
    run.train_step(ids)
    run.evaluate(corpus.eval_batches(ids, settings.batch_size, settings.seq_len,
                                     settings.seq_len)[:1])
    run.dp.close()


class KernelWarmup:
    """A forked process compiling the step's kernels of (cfg, settings, dtype) into Numba's
    on-disk cache (cfg None: no step), and then the BPE encoding kernel with tokenizer=True;
    wait() before the run's first step (or its encoding)."""

    def __init__(self, cfg, settings, dtype, tokenizer=False):
        ctx = mp.get_context("fork")
        self._conn, child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_warm, args=(cfg, settings, None if dtype is None else
                                                    np.dtype(dtype), child, tokenizer),
                                daemon=True, name="scratchllm-warmup")
        self.proc.start()
        child.close()

    @classmethod
    def encoder(cls):
        """A warm-up of the BPE encoding kernel alone (no step)."""
        return cls(None, None, None, tokenizer=True)

    def wait(self):
        """Block until the child is done; returns (kernels it compiled, seconds), or the
        error it met as a string (the run then compiles for itself)."""
        try:
            result = self._conn.recv()
        except EOFError:
            result = f"the warm-up process ended with exit code {self.proc.exitcode}"
        self.proc.join()
        self._conn.close()
        return result


class EncoderFirst:
    """The encoder's warm-up of a run that trains its tokenizer, and the run's PhaseClock for
    corpus.prepare: created, it compiles the tokenizer's counting kernels here (GPT-2's scanner
    and the unique pre-token counter, with the signatures train_bpe's counting asks for), then
    forks KernelWarmup.encoder(), which loads the scanner from their cache, so on two cores
    the encoder compiles beside the BPE training and the step's warm-up; when the encoding
    phase begins it waits for that warm-up (the encoder then loads from the cache instead of
    compiling a second time beside it)."""

    def __init__(self, clock):
        self.clock, self.warmed = clock, None
        with clock.phase("BPE training"):
            count_chunk("a 1.", (EOT,), "gpt2")
        self.encoder = KernelWarmup.encoder()

    def phase(self, name):
        if name == "encoding":
            with self.clock.phase("waiting for the warm-up"):
                self.wait()
        return self.clock.phase(name)

    def wait(self):
        """The encoder warm-up's result (waiting for it the first time)."""
        if self.warmed is None:
            self.warmed = self.encoder.wait()
        return self.warmed


def sum_warmed(step, encoder):
    """The warm-up processes' (kernels, seconds) added up, or the first error (a string);
    encoder None: the step's alone."""
    for w in (step, encoder):
        if isinstance(w, str):
            return w
    return step if encoder is None else (step[0] + encoder[0], step[1] + encoder[1])
