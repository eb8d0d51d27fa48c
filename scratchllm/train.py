"""python -m scratchllm train: train a small decoder LM on a CPU, every gradient hand-written.

With no arguments: train a byte-level BPE tokenizer on the bundled Python-docs corpus (cached),
train the `dense` preset, report the validation loss against the unigram baseline, save a
checkpoint directory and a loss-curve PNG, and print a short sample.

One step:  loss = CE(LM(x), y) + sum of MoE aux terms  ->  backward  ->  clip global grad norm
           ->  AdamW with lr = warmup + cosine(step)  ->  aux-free router bias update (MoE).
The run is deterministic given --seed, and --resume continues bit-exactly: the weights,
optimizer moments, step, losses and the batch RNG's state all live in the checkpoint.
"""
import argparse
import os
import signal
import sys
import time
from dataclasses import dataclass, asdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from scratchllm import checkpoint, corpus
from scratchllm.model import LM, PRESETS, ModelConfig, preset
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
    eval_tokens: int = 16384   # tokens per periodic validation (the final one uses all)
    seed: int = 0              # weight init and batch order
    threads: int = min(2, os.cpu_count() or 1)  # data-parallel batch shards, one thread each
                                                # (1 when the batch does not divide evenly)


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
        shards = settings.threads if settings.batch_size % settings.threads == 0 else 1
        if shards > 1:
            set_blas_threads(1)  # one BLAS thread per shard: no oversubscription
        self.dp = DataParallel(self.model, shards)
        self.rng = np.random.default_rng([settings.seed, 1])
        self.step = 0
        self.data = None   # the text file trained on (recorded so --resume finds it)
        self.losses = []   # train loss per step
        self.evals = []    # (step, val loss)

    def train_step(self, train_ids):
        """One optimizer step on a fresh random batch; returns (loss, routing stats)."""
        s, model = self.s, self.model
        x, y = corpus.sample_batch(train_ids, s.batch_size, s.seq_len, self.rng)
        ce, caches = self.dp.loss_backward(x, y)
        clip_grad_norm(model.parameters(), s.clip)
        self.opt.lr = cosine_schedule(self.step + 1, s.lr, s.lr / 10, s.warmup, s.steps)
        self.opt.step()
        stats = model.after_step(caches)
        self.step += 1
        self.losses.append(ce)
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


# ---------------------------------------------------------------------------- the command
def build_parser():
    p = argparse.ArgumentParser(prog="python -m scratchllm train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Settings()
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model architecture (default: dense)")
    p.add_argument("--data", default=None,
                   help="UTF-8 text file to train on (default: the bundled Python docs)")
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps ({d.steps})")
    p.add_argument("--batch-size", type=int, default=None, help=f"sequences ({d.batch_size})")
    p.add_argument("--seq-len", type=int, default=None, help=f"context ({d.seq_len})")
    p.add_argument("--lr", type=float, default=None, help=f"peak learning rate ({d.lr})")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="parameter and activation dtype (float32)")
    p.add_argument("--out", default=None, help="checkpoint directory (runs/PRESET); the "
                   "tokenizer and token ids are cached beside it in OUT/../cache")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    p.add_argument("--seed", type=int, default=None, help=f"init and batch seed ({d.seed})")
    p.add_argument("--eval-every", type=int, default=None,
                   help=f"validate and checkpoint every N steps ({d.eval_every})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _settings(args, saved=None):
    """Flags given explicitly win; then the checkpoint's settings; then the defaults."""
    s = dict(asdict(Settings()), **(saved or {}))
    for name in ("steps", "batch_size", "seq_len", "lr", "seed", "eval_every"):
        if getattr(args, name) is not None:
            s[name] = getattr(args, name)
    for name in ("steps", "batch_size", "seq_len", "eval_every"):
        if s[name] <= 0:
            raise ValueError(f"train: --{name.replace('_', '-')} must be > 0, got {s[name]}")
    if s["lr"] <= 0:
        raise ValueError(f"train: --lr must be > 0, got {s['lr']}")
    s["warmup"] = min(s["warmup"], s["steps"])
    return Settings(**s)


def _config_for_resume(args, out):
    """The checkpoint's config; a --preset that disagrees with it is an error."""
    cfg = ModelConfig.from_dict(checkpoint.read_config(out))
    if args.preset is not None:
        differ = [k for k, v in preset(args.preset).to_dict().items() if cfg.to_dict()[k] != v]
        if differ:
            raise checkpoint.CheckpointError(
                f"train: --preset {args.preset} does not match the checkpoint in {out} "
                f"(differs in {', '.join(differ)}); drop --preset to resume it, or use "
                f"another --out")
    return cfg


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


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except (checkpoint.CheckpointError, ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _main(args):
    name = args.preset or "dense"
    out = Path(args.out or f"runs/{name}")
    saved_meta = None
    if args.resume:
        cfg = _config_for_resume(args, out)
        saved_meta = checkpoint.load_state(out)[1]
    else:
        if (out / checkpoint.STATE).exists():
            raise ValueError(f"train: {out} already holds a checkpoint; pass --resume to "
                             f"continue it, --out to start elsewhere, or delete {out}")
        cfg = preset(name)
    s = _settings(args, saved_meta and saved_meta["settings"])
    dtype = np.dtype(args.dtype or (saved_meta or {}).get("dtype", "float32"))
    data = args.data or (saved_meta or {}).get("data") or str(corpus.DEFAULT_CORPUS)
    t_start = time.perf_counter()
    print(f"data: {data} (tokenizer: BPE, vocab {cfg.vocab_size})")
    tok, ids, _ = corpus.prepare(data, cfg.vocab_size, out.parent / "cache")
    train_ids, val_ids = corpus.split(ids)
    baseline = corpus.unigram_baseline(train_ids, val_ids, cfg.vocab_size)
    print(f"tokens: {len(train_ids):,} train, {len(val_ids):,} validation "
          f"({time.perf_counter() - t_start:.1f} s); unigram baseline {baseline:.3f} nats/token")
    run = Run(cfg, s, dtype)
    run.data = str(Path(data).resolve())
    if args.resume:
        run.load(out)
        print(f"resumed {out} at step {run.step}")
    print(f"model: {cfg.name}, {run.model.n_params():,} parameters, {s.steps} steps of "
          f"{s.batch_size}x{s.seq_len} tokens, {dtype}")
    t_train = time.perf_counter()
    finished = fit(run, train_ids, val_ids, out=out, tokenizer=tok,
                   progress=not args.no_progress)
    if not finished:
        return 130
    train_time = time.perf_counter() - t_train
    val = evaluate(run.model, corpus.eval_batches(val_ids, s.batch_size, s.seq_len, len(val_ids)),
                   run.dp)
    run.evals.append((run.step, val))
    run.save(out, tok)
    print(f"validation loss {val:.3f} nats/token = {val / baseline:.2f} x unigram baseline "
          f"{baseline:.3f} (training {train_time:.0f} s, total "
          f"{time.perf_counter() - t_start:.0f} s)")
    print(f"checkpoint: {out}")
    if save_plot(out / "loss.png", run, baseline):
        print(f"loss curve: {out / 'loss.png'}")
    else:
        print("loss curve: skipped (matplotlib is not installed: pip install matplotlib)")
    _print_sample(run.model, tok)
    return 0


def _print_sample(model, tok):
    from scratchllm.generate import generate
    prompt = "The "
    print(f"sample (temperature 0.8, top-k 40):\n{prompt}", end="")
    for piece in generate(model, tok, prompt, max_new_tokens=60, temperature=0.8, top_k=40,
                          rng=np.random.default_rng(0)):
        print(piece, end="", flush=True)
    print()
