"""The training loop behind `python -m scratchllm train` and `compare`: settings, the mutable
state of a run (model, AdamW, batch RNG, step, losses) and evaluation. The checkpoint layout
is in checkpoint.py, the plots in plots.py.

One step:  loss = CE(LM(x), y) + sum of MoE aux terms  ->  backward (data-parallel threads)
           ->  [across processes: all-reduce the gradients over the data-parallel group]
           ->  clip the global grad norm  ->  AdamW with lr = warmup + cosine(step)
           ->  aux-free router bias update (MoE).
Under MPI (a RankGrid) every rank draws the same global batch and keeps its contiguous slice
(np.array_split over the dp ranks); each scales its loss by its share of the batch, so the
all-reduced gradients are the whole batch's and the replicated optimizer keeps the weights
equal on every rank (with ZeRO-1, each rank updates its shard of the Params and they are
all-gathered: dist/zero.py); rank 0 alone prints and writes the checkpoint.
Deterministic given the seed; a checkpoint holds everything needed to continue bit-exactly:
weights, MoE biases, optimizer moments, step, losses and the batch RNG's state.
"""
import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from scratchllm.core.nn import detect_anomaly
from scratchllm.core.optim import AdamW, NonFiniteError, clip_grad_norm, cosine_schedule
from scratchllm.dist import (Group, ZeroAdamW, all_reduce_forward, all_reduce_grads,
                             bytes_per_step)
from scratchllm.lm import LM
from scratchllm.train import checkpoint, corpus
from scratchllm.train.parallel import DataParallel, set_blas_threads


@dataclass
class Settings:
    """How to train (not what): everything here may change on --resume except where noted."""
    steps: int = 600           # total optimizer steps
    batch_size: int = 16       # sequences per step
    seq_len: int = 128         # tokens per sequence (context length while training)
    lr: float = 8e-3           # peak learning rate (after warmup), cosine down to lr / 10
    warmup: int = 30           # linear warmup steps
    weight_decay: float = 0.1  # AdamW decoupled decay on matrices (not norms, not biases)
    clip: float = 1.0          # global gradient-norm clip
    eval_every: int = 100      # validation every N steps (and at the end)
    eval_tokens: int = 65536   # validation tokens per evaluation (at most; the same set)
    seed: int = 0              # weight init and batch order
    threads: int = min(2, os.cpu_count() or 1)  # data-parallel batch shards, one thread each


def _decays(name, p):
    """Weight decay on matrices only: not on norms' gains, vectors, or Mamba's A_log."""
    return p.data.ndim >= 2 and not name.endswith("A_log")


def make_optimizer(model, s):
    """AdamW (betas 0.9, 0.95) with decoupled weight decay where _decays says so."""
    decay = [p for n, p in model.named_parameters() if _decays(n, p)]
    rest = [p for n, p in model.named_parameters() if not _decays(n, p)]
    return AdamW([{"params": decay, "weight_decay": s.weight_decay},
                  {"params": rest, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95))


def evaluate(model, batches, dp=None, group=None):
    """Mean cross-entropy (nats/token) over fixed batches, forward only (on dp's threads);
    with a data-parallel group, rank d takes batches d, d + size, ... and the sums are
    all-reduced."""
    if not batches:
        raise ValueError("evaluate: no evaluation batches (the mean of nothing is no loss)")
    mine = batches if group is None else batches[group.rank::group.size]
    losses = (dp.map if dp else map)(lambda b: model.cross_entropy(*b) * b[1].size, mine)
    total = sum(losses)
    if group is not None:
        total = group.sum_scalar(total)
    return total / max(sum(y.size for _, y in batches), 1)


class Run:
    """The mutable state of one training run: model, optimizer, batch RNG, step, history."""

    def __init__(self, cfg, settings, dtype=np.float32, model=None, grid=None, zero=0):
        """model: an LM of cfg to train (e.g. a loaded checkpoint); default a fresh one.
        grid: the dist.RankGrid of an MPI run (data parallel over grid.groups["dp"]); None for
        one process. zero: 1 shards AdamW's state over the data-parallel ranks (ZeRO-1)."""
        self.cfg, self.s = cfg, settings
        self.model = model or LM(cfg, rng=np.random.default_rng(settings.seed), dtype=dtype)
        self.group = Group.single() if grid is None else grid.groups["dp"]
        self.opt = make_optimizer(self.model, settings)
        if zero:
            self.opt = ZeroAdamW(self.opt, self.group)
        self.writer = grid is None or grid.is_first()  # prints, saves
        if settings.batch_size < self.group.size:
            raise ValueError(f"--batch-size {settings.batch_size} is smaller than the "
                             f"{self.group.size} data-parallel ranks (each needs a sequence)")
        self.rows = np.array_split(np.arange(settings.batch_size), self.group.size)[
            self.group.rank]  # this rank's contiguous slice of the global batch
        moe = [layer.ffn for layer in self.model.layers if hasattr(layer.ffn, "update_bias")]
        self.comm_model = bytes_per_step(  # bytes this rank sends per step: predicted
            [p.data.nbytes for p in self.model.parameters()], self.group.size, zero=zero,
            small=[8 * f.spec.router.n_experts for f in moe], rank=self.group.rank)
        self.sent = []  # bytes this rank sent in each step: measured (not saved)
        if settings.threads > 1 or self.group.size > 1:
            set_blas_threads(1)  # one BLAS thread per shard or rank: no oversubscription
        self.dp = DataParallel(self.model, settings.threads)
        self.rng = np.random.default_rng([settings.seed, 1])
        self.step = 0
        self.data = None   # the text file trained on (recorded so --resume finds it)
        self.losses = []   # train loss per step
        self.step_seconds = []  # wall time of each train_step in this process (not saved)
        self.evals = []    # (step, val loss)
        self.detect_anomaly = False  # check every Module's outputs and gradients (slow)

    def train_step(self, train_ids):
        """One optimizer step on a fresh random batch; returns (loss, routing stats)."""
        s, model = self.s, self.model
        t0, sent0 = time.perf_counter(), self.group.total_sent()
        x, y = corpus.sample_batch(train_ids, s.batch_size, s.seq_len, self.rng)
        with detect_anomaly(*self.dp.replicas) if self.detect_anomaly else nullcontext():
            if self.group.size == 1:
                ce, caches = self.dp.loss_backward(x, y)
            else:  # this rank's rows, weighted as a part of the global batch
                lo, hi = self.rows[0], self.rows[-1] + 1
                ce, caches = self.dp.loss_backward(x[lo:hi], y[lo:hi], total=s.batch_size)
        across = None
        if self.group.size > 1:
            all_reduce_grads(model.parameters(), self.group)  # grad = sum_d (n_d / B) grad_d
            ce = self.group.sum_scalar(ce)
            across = self._sum_over_ranks
        if not math.isfinite(ce):
            raise NonFiniteError(f"step {self.step + 1}: the training loss is {ce}; "
                                 f"{self.likely_cause()}")
        try:
            clip_grad_norm(model.parameters(), s.clip)
        except NonFiniteError as e:
            raise NonFiniteError(f"step {self.step + 1}: {e}; {self.likely_cause()}") from None
        self.opt.lr = cosine_schedule(self.step + 1, s.lr, s.lr / 10, s.warmup, s.steps)
        self.opt.step()
        stats = model.after_step(caches, across)
        self.step += 1
        self.losses.append(ce)
        self.step_seconds.append(time.perf_counter() - t0)
        self.sent.append(self.group.total_sent() - sent0)
        return ce, stats

    def agree(self, stop):
        """Whether any data-parallel rank wants to stop (Ctrl-C reaches the ranks at
        different moments: they must stop after the same step, or one waits in the next
        all-reduce forever)."""
        return bool(stop) if self.group.size == 1 else self.group.sum_scalar(bool(stop)) > 0

    def _sum_over_ranks(self, a):
        return all_reduce_forward(a, group=self.group)[0]

    def evaluate(self, batches):
        """evaluate() on this run's threads and data-parallel ranks."""
        return evaluate(self.model, batches, self.dp, None if self.group.size == 1 else
                        self.group)

    def likely_cause(self):
        """Why a step went NaN or inf, as far as the run can tell (for the error message)."""
        bad = [n for n, p in self.model.named_parameters() if not np.isfinite(p.data).all()]
        if bad:
            return (f"the weights already hold NaN or inf ({', '.join(bad[:3])}): a corrupt "
                    f"checkpoint or an earlier update that overflowed")
        return (f"the run diverged: the learning rate (peak {self.s.lr:g}, {self.opt.lr:g} at "
                f"this step) is likely too high; lower --lr, or rerun with --detect-anomaly "
                f"to see which layer went non-finite first")

    def save(self, directory, tokenizer=None):
        """Atomically write the checkpoint (checkpoint.save_run); on rank 0 only under MPI
        (every rank holds the same weights and optimizer state)."""
        opt_state = self.opt.state_dict()  # collective under ZeRO: every rank calls it
        if self.writer:
            checkpoint.save_run(self, directory, tokenizer, opt_state)

    def load(self, directory):
        """Restore everything `save` wrote (checkpoint.load_run); CheckpointError on any
        mismatch."""
        checkpoint.load_run(self, directory)


# ---------------------------------------------------------------------------- the loop
class _StopFlag:
    """SIGINT sets a flag; the loop saves after the current step and exits. A second Ctrl-C
    interrupts at once (the default handler is back)."""

    def __init__(self):
        self.stop = False

    def __enter__(self):
        self._old = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, *_):
        self.stop = True
        signal.signal(signal.SIGINT, self._old)

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self._old)


def expert_usage_line(stats):
    """'layer 1: 13 12 ... %' per MoE layer: the share of routing slots each expert got."""
    return "; ".join(f"L{i}: " + " ".join(f"{100 * f:.0f}" for f in frac)
                     for i, frac in stats) + " (% of slots per expert)"


def fit(run, train_ids, val_ids, *, out=None, tokenizer=None, progress=True, log=print,
        eval_set=None):
    """Train `run` up to run.s.steps, evaluating (on eval_set, default: eval_tokens of
    val_ids) every eval_every steps and saving a checkpoint to `out` then. Ctrl-C saves and
    returns False. Returns True when all steps ran."""
    s = run.s
    if eval_set is None:
        eval_set = corpus.eval_batches(val_ids, s.batch_size, s.seq_len, s.eval_tokens)
    tokens_per_step = s.batch_size * s.seq_len
    bar = tqdm(total=s.steps, initial=run.step, disable=not (progress and run.writer),
               unit="step", dynamic_ncols=True, file=sys.stderr)
    t0, done0, stats = time.perf_counter(), run.step, None
    with _StopFlag() as flag:
        while run.step < s.steps and not run.agree(flag.stop):
            try:
                loss, stats = run.train_step(train_ids)
            except NonFiniteError as e:
                bar.close()
                raise NonFiniteError(f"training stopped at {e}. {_kept(out)}") from None
            tok_s = (run.step - done0) * tokens_per_step / (time.perf_counter() - t0)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
            if run.step % s.eval_every == 0 and run.step < s.steps:
                run.evals.append((run.step, run.evaluate(eval_set)))
                if not math.isfinite(run.evals[-1][1]):
                    bar.close()
                    raise NonFiniteError(f"training stopped at step {run.step}: the validation "
                                         f"loss is {run.evals[-1][1]}; {run.likely_cause()}. "
                                         f"{_kept(out)}")
                msg = f"step {run.step}: train {loss:.3f}, val {run.evals[-1][1]:.3f}"
                if stats:
                    msg += "\n  expert usage " + expert_usage_line(stats)
                if run.writer:
                    bar.write(msg, file=sys.stderr)
                if out is not None:
                    run.save(out, tokenizer)
    bar.close()
    if run.agree(flag.stop):
        if out is not None:
            run.save(out, tokenizer)
        if run.writer:
            log(f"interrupted at step {run.step}; checkpoint saved to {out} "
                f"(continue with --resume --out {out})")
        return False
    return True


def _kept(out):
    """What is left on disk after a run stopped: the last good checkpoint, or none."""
    if out is None or not (Path(out) / checkpoint.STATE).is_file():
        return "No checkpoint was written."
    return (f"The last good checkpoint in {out} (step {checkpoint.load_state(out)[1]['step']}) "
            f"is kept.")


def train_preset(cfg, train_ids, eval_set, settings, progress):
    """Train one config (as `compare` does); returns (losses per step, tokens/s of the median
    step, final val loss, n_params). The median keeps a burst of load on a shared machine out
    of the rate."""
    run = Run(cfg, settings)
    fit(run, train_ids, None, progress=progress, eval_set=eval_set)
    tok_s = settings.batch_size * settings.seq_len / float(np.median(run.step_seconds))
    val = run.evaluate(eval_set)
    run.dp.close()
    return run.losses, tok_s, val, run.model.n_params()
