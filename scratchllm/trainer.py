"""The training loop behind `python -m scratchllm train` and `compare`: settings, the mutable
state of a run (model, AdamW, batch RNG, step, losses), checkpoints, evaluation and plots.

One step:  loss = CE(LM(x), y) + sum of MoE aux terms  ->  backward (data-parallel threads)
           ->  clip the global grad norm  ->  AdamW with lr = warmup + cosine(step)
           ->  aux-free router bias update (MoE).
Deterministic given the seed; a checkpoint holds everything needed to continue bit-exactly:
weights, MoE biases, optimizer moments, step, losses and the batch RNG's state.
"""
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from scratchllm import checkpoint, corpus
from scratchllm.model import LM, ModelConfig
from scratchllm.optim import AdamW, clip_grad_norm, cosine_schedule
from scratchllm.parallel import DataParallel, set_blas_threads
from scratchllm.tokenizer import Tokenizer


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


def evaluate(model, batches, dp=None):
    """Mean cross-entropy (nats/token) over fixed batches, forward only (on dp's threads)."""
    losses = (dp.map if dp else map)(lambda b: model.cross_entropy(*b) * b[1].size, batches)
    return sum(losses) / max(sum(y.size for _, y in batches), 1)


class Run:
    """The mutable state of one training run: model, optimizer, batch RNG, step, history."""

    def __init__(self, cfg, settings, dtype=np.float32):
        self.cfg, self.s = cfg, settings
        self.model = LM(cfg, rng=np.random.default_rng(settings.seed), dtype=dtype)
        self.opt = make_optimizer(self.model, settings)
        if settings.threads > 1:
            set_blas_threads(1)  # one BLAS thread per shard: no oversubscription
        self.dp = DataParallel(self.model, settings.threads)
        self.rng = np.random.default_rng([settings.seed, 1])
        self.step = 0
        self.data = None   # the text file trained on (recorded so --resume finds it)
        self.losses = []   # train loss per step
        self.step_seconds = []  # wall time of each train_step in this process (not saved)
        self.evals = []    # (step, val loss)

    def train_step(self, train_ids):
        """One optimizer step on a fresh random batch; returns (loss, routing stats)."""
        s, model = self.s, self.model
        t0 = time.perf_counter()
        x, y = corpus.sample_batch(train_ids, s.batch_size, s.seq_len, self.rng)
        ce, caches = self.dp.loss_backward(x, y)
        clip_grad_norm(model.parameters(), s.clip)
        self.opt.lr = cosine_schedule(self.step + 1, s.lr, s.lr / 10, s.warmup, s.steps)
        self.opt.step()
        stats = model.after_step(caches)
        self.step += 1
        self.losses.append(ce)
        self.step_seconds.append(time.perf_counter() - t0)
        return ce, stats

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory, tokenizer=None):
        """Atomically write the checkpoint: config and tokenizer once, then state.npz."""
        directory = Path(directory)
        if not (directory / checkpoint.CONFIG).is_file():
            checkpoint.write_config(directory, self.cfg.to_dict())
        if tokenizer is not None and not (directory / corpus.TOKENIZER).exists():
            tmp = directory / f"{corpus.TOKENIZER}.tmp-{os.getpid()}"
            tokenizer.save(str(tmp))
            os.replace(tmp, directory / corpus.TOKENIZER)  # atomic, like state.npz
        arrays = {f"model.{n}": p.data for n, p in self.model.named_parameters()}
        arrays.update({f"buffer.{n}": b for n, b in self.model.named_buffers()})
        arrays.update({f"opt.{k}": v for k, v in self.opt.state_dict().items()})
        arrays["losses"] = np.asarray(self.losses, dtype=np.float64)
        arrays["evals"] = np.asarray(self.evals, dtype=np.float64).reshape(-1, 2)
        meta = {"step": self.step, "rng": self.rng.bit_generator.state,
                "settings": asdict(self.s), "dtype": str(self.model.dtype), "data": self.data}
        checkpoint.save_state(directory, arrays, meta)

    def load(self, directory):
        """Restore everything saved by `save`; CheckpointError on any mismatch."""
        arrays, meta = checkpoint.load_state(directory)
        where = str(Path(directory) / checkpoint.STATE)
        if meta.get("dtype") != str(self.model.dtype):
            raise checkpoint.CheckpointError(f"checkpoint: {where} holds {meta.get('dtype')} "
                                             f"weights, this run uses {self.model.dtype}")
        checkpoint.assign([(n, p.data) for n, p in self.model.named_parameters()], arrays,
                          "model.", where)
        checkpoint.assign(list(self.model.named_buffers()), arrays, "buffer.", where)
        opt_state = {k[4:]: v for k, v in arrays.items() if k.startswith("opt.")}
        try:
            self.opt.load_state_dict(opt_state)
        except (ValueError, KeyError) as e:
            raise checkpoint.CheckpointError(f"checkpoint: {where} optimizer state does not "
                                             f"match this model ({e})") from None
        self.rng.bit_generator.state = meta["rng"]
        self.step = int(meta["step"])
        self.losses = [float(v) for v in arrays["losses"]]
        self.evals = [(int(a), float(b)) for a, b in arrays["evals"]]


def load_model(directory, dtype=None):
    """(model, tokenizer, meta) from a checkpoint directory, for sampling."""
    cfg = ModelConfig.from_dict(checkpoint.read_config(directory))
    arrays, meta = checkpoint.load_state(directory)
    dtype = np.dtype(meta.get("dtype", "float32") if dtype is None else dtype)
    model = LM(cfg, rng=np.random.default_rng(0), dtype=dtype)
    where = str(Path(directory) / checkpoint.STATE)
    checkpoint.assign([(n, p.data) for n, p in model.named_parameters()], arrays, "model.", where)
    checkpoint.assign(list(model.named_buffers()), arrays, "buffer.", where)
    return model, Tokenizer.load(str(Path(directory) / corpus.TOKENIZER)), meta


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
    bar = tqdm(total=s.steps, initial=run.step, disable=not progress, unit="step",
               dynamic_ncols=True, file=sys.stderr)
    t0, done0, stats = time.perf_counter(), run.step, None
    with _StopFlag() as flag:
        while run.step < s.steps and not flag.stop:
            loss, stats = run.train_step(train_ids)
            tok_s = (run.step - done0) * tokens_per_step / (time.perf_counter() - t0)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tok_s:,.0f}", refresh=False)
            if run.step % s.eval_every == 0 and run.step < s.steps:
                run.evals.append((run.step, evaluate(run.model, eval_set, run.dp)))
                msg = f"step {run.step}: train {loss:.3f}, val {run.evals[-1][1]:.3f}"
                if stats:
                    msg += "\n  expert usage " + expert_usage_line(stats)
                bar.write(msg, file=sys.stderr)
                if out is not None:
                    run.save(out, tokenizer)
    bar.close()
    if flag.stop:
        if out is not None:
            run.save(out, tokenizer)
        log(f"interrupted at step {run.step}; checkpoint saved to {out} "
            f"(continue with --resume --out {out})")
        return False
    return True


def save_loss_plot(path, series, baseline, title, ylabel="cross-entropy (nats/token)"):
    """Curves [(label, steps, losses, matplotlib fmt)] and the unigram baseline to a PNG.
    Returns False (nothing written) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, steps, losses, fmt in series:
        ax.plot(steps, losses, fmt, lw=0.9, label=label)
    ax.axhline(baseline, ls="--", c="gray", label="unigram baseline")
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def save_plot(path, run, baseline):
    """The run's train losses and validation points."""
    series = [("train", np.arange(1, len(run.losses) + 1), run.losses, "-")]
    if run.evals:
        series.append(("validation", *zip(*run.evals), "o-"))
    return save_loss_plot(path, series, baseline, run.cfg.name)
