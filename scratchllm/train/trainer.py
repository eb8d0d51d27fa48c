"""The training loop behind `python -m scratchllm train` and `compare`: the mutable state of a
run (model, AdamW, batch RNG, step, losses) and evaluation. How to train (Settings, the first
run's) is in settings.py, the checkpoint layout in checkpoint.py, the plots in plots.py.

One step:  loss = CE(LM(x), y) + sum of MoE aux terms  ->  backward (data-parallel threads;
           with Settings.fp8 both in FP8 matmuls, core/fp8.py)
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
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from scratchllm.core.fp8 import FP8Spec, fp8_matmuls
from scratchllm.core.heap import keep_freed_memory
from scratchllm.core.nn import detect_anomaly
from scratchllm.core.optim import (AdamW, NonFiniteError, clip_grad_norm, clip_scale,
                                   cosine_schedule)
from scratchllm.dist import all_reduce_forward, all_reduce_grads
from scratchllm.lm import LM
from scratchllm.train import checkpoint, corpus, parallel_run
from scratchllm.train.parallel import DataParallel, set_blas_threads
from scratchllm.train.optimizers import make_optimizer
from scratchllm.train.parallel_run import attach_parallel, parallel_model


def evaluate(model, batches, dp=None, group=None):
    """Mean cross-entropy (nats/token) over fixed batches ((x, y), or (x, y, doc_ids) of a
    packed batch), forward only (on dp's threads);
    with a data-parallel group, rank d takes batches d, d + size, ... and the sums are
    all-reduced."""
    if not batches:
        raise ValueError("evaluate: no evaluation batches (the mean of nothing is no loss)")
    mine = batches if group is None else batches[group.rank::group.size]
    losses = (dp.map if dp else map)(lambda b: model.cross_entropy(*b) * b[1].size, mine)
    total = sum(losses)
    if group is not None:
        total = group.sum_scalar(total)
    return total / max(sum(b[1].size for b in batches), 1)


class Run:
    """The mutable state of one training run: model, optimizer, batch RNG, step, history."""

    def __init__(self, cfg, settings, dtype=np.float32, model=None, grid=None, zero=0,
                 sequence=False, pipeline=("1f1b", 0)):
        """model: an LM of cfg to train (e.g. a loaded checkpoint); default a fresh one.
        grid: the dist.RankGrid of an MPI run (data parallel over grid.groups["dp"]), or None.
        zero: the ZeRO stage over the data-parallel ranks: 1 shards AdamW's state, 2 the
        gradients too, 3 the weights too (dist/zero.py, dist/zero_layers.py).
        With grid.shape.tp > 1 the model is this rank's MegatronLM slice (megatron.py);
        sequence: sequence parallelism inside it. With grid.shape.pp > 1 this rank runs its
        stage of the blocks (pipeline.py); pipeline: (schedule, micro-batches; 0: one per
        stage). With cp or ep > 1, its ContextParallelLM or ExpertParallelLM (parallel_run.py
        says which model each axis builds)."""
        self.cfg, self.s = cfg, settings
        self.world, self.group, axes, model = parallel_model(
            cfg, settings, dtype, grid, model, zero, sequence,
            lambda m: make_optimizer(m, settings))
        self.tp, self.cp, self.ep = axes["tp"], axes["cp"], axes["ep"]
        self.sliced = self.tp or self.ep  # a model of slices (SlicedLM), or None
        self.model = model or LM(cfg, rng=np.random.default_rng(settings.seed), dtype=dtype)
        self.opt = make_optimizer(self.model, settings)
        attach_parallel(self, axes, zero, pipeline)  # .stage, .shards, .rows, .comm_model
        self.writer = grid is None or grid.is_first()  # prints, saves
        self.sent = []  # bytes this rank sent in each step: measured (not saved)
        # one BLAS thread per shard or rank, --threads 1 included: OpenBLAS's own threads
        # spin-wait, so a "one-thread" run would otherwise keep two cores busy (and be many
        # times slower on a loaded machine)
        set_blas_threads(1)
        # each step frees and reallocates the same arrays: keep the pages (core/heap.py),
        # or the kernel zero-fills ~50 MB of fresh ones a step (~14% of the dense step)
        keep_freed_memory()
        self.dp = DataParallel(self.model, settings.threads)
        self.rng, self.step = np.random.default_rng([settings.seed, 1]), 0
        self.data = None   # the text file trained on (recorded so --resume finds it)
        self.losses = []   # train loss per step
        self.mtp_losses = []  # per step, each MTP module's cross-entropy (not saved)
        self.step_seconds = []  # wall time of each train_step in this process (not saved)
        self.evals = []    # (step, val loss)
        self.detect_anomaly = False  # check every Module's outputs and gradients (slow)
        self.eot = None  # the document separator's token id (settings.pack_documents)
        self.last_stats = []  # [(layer, share of routed slots per expert)] of the last step

    def train_step(self, train_ids):
        """One optimizer step on a fresh random batch; returns (loss, routing stats)."""
        s, model = self.s, self.model
        t0, sent0 = time.perf_counter(), self._sent()
        x, y = corpus.sample_batch(train_ids, s.batch_size, s.seq_len, self.rng)
        docs = self._documents(x)  # (B, T) or None
        if self.shards is not None:
            self.shards.begin_step()
        with self.precision(), \
                detect_anomaly(*self.dp.replicas) if self.detect_anomaly else nullcontext():
            if self.stage is not None:  # this rank's stage, on its rows' micro-batches
                if docs is not None:
                    raise ValueError("pack_documents with pipeline parallel (--pp) is not "
                                     "available: the stages pass no document ids")
                model.zero_grad()
                lo, hi = self.rows[0], self.rows[-1] + 1
                ce = self.stage.pp_sum(self.stage.step(x[lo:hi], y[lo:hi], s.batch_size))
                caches = []
            elif self.group.size == 1:
                ce, caches = self.dp.loss_backward(x, y, **({} if docs is None else
                                                           {"docs": docs}))
            else:  # this rank's rows, weighted as a part of the global batch
                lo, hi = self.rows[0], self.rows[-1] + 1
                packed = {} if docs is None else {"docs": docs[lo:hi]}
                ce, caches = self.dp.loss_backward(x[lo:hi], y[lo:hi], total=s.batch_size,
                                                   **packed)
        across, params, norm_across = None, None, None  # params None: the model's
        if self.stage is not None:  # a stage's own Params; the norm summed over the stages
            params, norm_across = self.stage.params, self.stage.pp_sum
            if self.group.size > 1:
                all_reduce_grads(params, self.group)
        elif self.shards is not None:  # each rank holds its Params' summed gradients only
            self.shards.end_backward()
            params, norm_across = self.opt.owned(), self.group.sum_scalar
        elif self.group.size > 1:
            all_reduce_grads(model.parameters(), self.group)  # grad = sum_d (n_d / B) grad_d
        if self.sliced is not None:  # the norm of the whole model's gradient (of the stages)
            norm_across = model.squares_over_group if self.stage is None else \
                (lambda local: self.stage.pp_sum(model.squares_over_group(local)))
        if self.group.size > 1:
            ce = self.group.sum_scalar(ce)
            across = self._sum_over_ranks
        if not math.isfinite(ce):
            raise NonFiniteError(f"step {self.step + 1}: the training loss is {ce}; "
                                 f"{self.likely_cause()}")
        # the data-parallel sum's squares (of all Params) for the clip; AdamW scales in its pass
        whole = self.dp.squares is not None and self.group.size == 1 and params is None
        fold = whole and norm_across is None and isinstance(self.opt, AdamW)
        params = model.parameters() if params is None and not fold else params
        try:
            if fold:
                _, scale = clip_scale((), s.clip, squares=self.dp.squares)
            else:
                clip_grad_norm(params, s.clip, norm_across, self.dp.squares if whole else None)
        except NonFiniteError as e:
            raise NonFiniteError(f"step {self.step + 1}: {e}; {self.likely_cause()}") from None
        self.opt.lr = cosine_schedule(self.step + 1, s.lr, s.lr * s.final_lr, s.warmup, s.steps)
        if fold:
            self.opt.step(grad_scale=scale)
        elif self.stage is None:
            self.opt.step()
        else:
            self.opt.step(only=self.stage.opt_indices(self.opt))
        stats = model.after_step(caches, across)
        self.last_stats = stats
        self.step += 1
        self.losses.append(ce)
        if caches and caches[0].mtp_cache is not None:  # each MTP module's CE, shard mean
            self.mtp_losses.append(np.mean([c.mtp_cache.losses for c in caches], axis=0))
        self.step_seconds.append(time.perf_counter() - t0)
        self.sent.append(self._sent() - sent0)
        return ce, stats

    def _sent(self):
        return parallel_run.sent(self)

    def _documents(self, x):
        """The documents of windows x (B, T) when packing (corpus.document_ids), else None."""
        if not self.s.pack_documents:
            return None
        if self.eot is None:
            raise ValueError("pack_documents needs the separator's token id: set Run.eot (the "
                             "tokenizer's <|endoftext|> id)")
        return corpus.document_ids(x, self.eot)

    def eval_set(self, val_ids):
        """The fixed evaluation batches of val_ids: (x, y), or (x, y, doc_ids) when packing."""
        s = self.s
        batches = corpus.eval_batches(val_ids, s.batch_size, s.seq_len, s.eval_tokens)
        if not s.pack_documents:
            return batches
        return [(x, y, self._documents(x)) for x, y in batches]

    def agree(self, stop):
        """Whether any data-parallel rank wants to stop (Ctrl-C reaches the ranks at
        different moments: they must stop after the same step, or one waits in the next
        all-reduce forever)."""
        return bool(stop) if self.world.size == 1 else self.world.sum_scalar(bool(stop)) > 0

    def _sum_over_ranks(self, a):
        return all_reduce_forward(a, group=self.group)[0]

    def precision(self):
        """The matmuls' precision for one step: FP8 (core.fp8.fp8_matmuls with DeepSeek-V3's
        tiles: e4m3, 1 x 128 activations, 128 x 128 weights; e5m2 gradients) with
        settings.fp8, else the model's float dtype. The weights the optimizer updates stay in
        that float dtype."""
        return fp8_matmuls(FP8Spec()) if self.s.fp8 else nullcontext()

    def whole(self):
        """A context in which every weight is on this rank (ZeRO-3 gathers them; collective),
        else nothing."""
        return nullcontext() if self.shards is None else self.shards.gathered()

    def evaluate(self, batches):
        """evaluate() on this run's threads and data-parallel ranks (in the step's
        precision); on the stages or ZeRO-3's shards, parallel_run.evaluate_parts."""
        if parallel_run.evaluates_in_parts(self):
            with self.precision():
                return parallel_run.evaluate_parts(self, batches)
        with self.precision():
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
        # the whole model and moments on rank 0 alone (collective: slices, stages, shards)
        with parallel_run.whole_on_root(self, opt_state) as (model, opt_state):
            if self.writer:
                checkpoint.save_run(self, directory, tokenizer, opt_state, model=model)

    def load(self, directory):
        """Restore everything `save` wrote (checkpoint.load_run); CheckpointError on any
        mismatch."""
        if self.sliced is not None or self.stage is not None:  # the whole run in one
            whole = Run(self.cfg, replace(self.s, threads=1), self.model.dtype)  # process,
            checkpoint.load_run(whole, directory)  # then this rank's part
            return parallel_run.load_part(self, whole)
        with self.whole():
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
        eval_set = run.eval_set(val_ids)
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
