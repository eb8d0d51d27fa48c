"""python -m scratchllm train: train a small decoder LM on a CPU, every gradient hand-written.

With no arguments: train a byte-level BPE tokenizer on the bundled Python-docs corpus (cached),
train the `dense` preset, report the validation loss against the unigram baseline, save a
checkpoint directory and a loss-curve PNG, and print a short sample.

One step:  loss = CE(LM(x), y) + sum of MoE aux terms  ->  backward  ->  clip global grad norm
           ->  AdamW with lr = warmup + cosine(step)  ->  aux-free router bias update (MoE).
The run is deterministic given --seed, and --resume continues bit-exactly: the weights,
optimizer moments, step, losses and the batch RNG's state all live in the checkpoint.
The loop itself lives in scratchllm/train/trainer.py.

Across processes (the dist extra: mpi4py + MPICH):
    mpiexec -n N python -m scratchllm train --dp N [--threads T] ...
trains data parallel on N ranks: --batch-size is the global batch, each rank takes its
contiguous slice, gradients are all-reduced, rank 0 prints and writes the checkpoint (the same
files as a one-process run). --threads defaults to 1 per rank under MPI.
"""
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from scratchllm.cli.common import LR, Parser, int_at_least, run, run_on_ranks
from scratchllm.core.atomic import remove_stale_temps
from scratchllm.dist import (AXES, GridError, GridShape, Group, MPIUnavailable, RankGrid,
                             launched_by_mpiexec)
from scratchllm.lm import generate, preset
from scratchllm.specs import PRESETS, to_dict
from scratchllm.specs.unflat import flat_view
from scratchllm.train import checkpoint, corpus
from scratchllm.train.plots import save_run_plot
from scratchllm.train.trainer import Run, Settings, fit


def build_parser():
    p = Parser("train", __doc__)
    d = Settings()
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model architecture (default: dense)")
    p.add_argument("--data", default=None,
                   help="UTF-8 text file to train on (default: the bundled Python docs)")
    p.add_argument("--steps", type=int_at_least(1), default=None,
                   help=f"optimizer steps ({d.steps})")
    p.add_argument("--batch-size", type=int_at_least(1), default=None,
                   help=f"sequences ({d.batch_size})")
    p.add_argument("--seq-len", type=int_at_least(1), default=None, help=f"context ({d.seq_len})")
    p.add_argument("--lr", type=LR, default=None, help=f"peak learning rate ({d.lr}; in (0, 1])")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="parameter and activation dtype (float32)")
    p.add_argument("--out", default=None, help="checkpoint directory (runs/PRESET); the "
                   "tokenizer and token ids are cached beside it in OUT/../cache")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --out")
    p.add_argument("--seed", type=int_at_least(0), default=None,
                   help=f"init and batch seed ({d.seed})")
    p.add_argument("--eval-every", type=int_at_least(1), default=None,
                   help=f"validate and checkpoint every N steps ({d.eval_every})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--detect-anomaly", action="store_true", help="check every Module's output "
                   "and gradient; name the first to go NaN or inf (slower)")
    p.add_argument("--threads", type=int_at_least(1), default=None, help=f"data-parallel "
                   f"threads per process ({d.threads}; 1 per rank under MPI)")
    for axis, what in (("dp", "data"), ("tp", "tensor"), ("pp", "pipeline"),
                       ("cp", "context"), ("ep", "expert")):
        p.add_argument(f"--{axis}", type=int_at_least(1), default=1, help=f"{what}-parallel "
                       f"ranks (1; under `mpiexec -n N`, the sizes multiply to N)")
    p.add_argument("--zero", type=int, choices=(1, 2, 3), default=0, help="ZeRO stage: 1 "
                   "shards AdamW's state over the --dp ranks (2 and 3: not available yet)")
    return p


def _settings(args, saved=None, ranks=1):
    """Flags given explicitly win; then the checkpoint's settings; then the defaults (and one
    thread per rank when ranks > 1)."""
    s = dict(asdict(Settings()), **(saved or {}))
    if ranks > 1:
        s["threads"] = 1
    for name in ("steps", "batch_size", "seq_len", "lr", "seed", "eval_every", "threads"):
        if getattr(args, name) is not None:
            s[name] = getattr(args, name)
    for name in ("steps", "batch_size", "seq_len", "eval_every"):
        if s[name] <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {s[name]}")
    if s["lr"] <= 0:
        raise ValueError(f"--lr must be > 0, got {s['lr']}")
    s["warmup"] = min(s["warmup"], s["steps"])
    return Settings(**s)


def _config_for_resume(args, out):
    """The checkpoint's config; a --preset that disagrees with it is an error."""
    cfg = checkpoint.read_config(out)
    if args.preset is not None and preset(args.preset) != cfg:
        want, have = _fields(preset(args.preset)), _fields(cfg)
        differ = [k for k, v in want.items() if have.get(k) != v]
        raise checkpoint.CheckpointError(
            f"--preset {args.preset} does not match the checkpoint in {out} (differs in "
            f"{', '.join(differ)}); drop --preset to resume it, or use another --out")
    return cfg


def _fields(cfg):
    """{name: value} of a config to compare: its flat names, or the fields of its format-2
    dict when it has no flat form."""
    try:
        return asdict(flat_view(cfg))
    except ValueError:
        return to_dict(cfg)


def main(argv=None):
    args = build_parser().parse_args(argv)
    shape = GridShape(**{a: getattr(args, a) for a in AXES})
    if shape.n_ranks() == 1 and launched_by_mpiexec() == 1:
        return run("train", _main, args)
    return _on_ranks(args, shape)


def _on_ranks(args, shape):
    """The run on every rank of an MPI job: the grid checked before any work (rank 0 prints
    the error; every rank exits 1), then _main with any rank's error aborting the job."""
    try:
        world = Group.world()
    except MPIUnavailable as e:
        print(f"scratchllm train: {e}", file=sys.stderr)
        return 1
    try:
        grid = RankGrid(shape, world)
        later = [f"--{a} {getattr(shape, a)}" for a in AXES
                 if a != "dp" and getattr(shape, a) > 1]
        if later:
            raise GridError(f"{', '.join(later)}: this version trains data parallel only "
                            f"(--dp); tensor, pipeline, context and expert parallel training "
                            f"are not available yet")
        if args.zero > 1:
            raise GridError(f"--zero {args.zero}: this version has ZeRO stage 1 only (sharded "
                            f"optimizer state); stages 2 and 3 are not available yet")
    except GridError as e:
        if world.rank == 0:
            print(f"scratchllm train: {e}", file=sys.stderr)
        return 1
    return run_on_ranks("train", lambda a: _main(a, grid), args, world)


def _quiet(*_, **__):
    pass


def _main(args, grid=None):
    say = print if grid is None or grid.is_first() else _quiet  # rank 0 speaks
    name = args.preset or "dense"
    out = Path(args.out or f"runs/{name}")
    if out.is_dir() and (grid is None or grid.is_first()):
        remove_stale_temps(out)  # left by a write that was killed, even if we stop below
    saved_meta = None
    if args.resume:
        cfg = _config_for_resume(args, out)
        saved_meta = checkpoint.load_state(out)[1]
    else:
        if (out / checkpoint.STATE).exists():
            raise ValueError(f"{out} already holds a checkpoint; pass --resume to "
                             f"continue it, --out to start elsewhere, or delete {out}")
        cfg = preset(name)
    s = _settings(args, saved_meta and saved_meta["settings"], 1 if grid is None else
                  grid.world.size)
    dtype = np.dtype(args.dtype or (saved_meta or {}).get("dtype", "float32"))
    data = args.data or (saved_meta or {}).get("data") or str(corpus.DEFAULT_CORPUS)
    t_start = time.perf_counter()
    say(f"data: {data} (tokenizer: BPE, vocab {cfg.vocab_size})")
    tok, ids = _prepare(data, cfg.vocab_size, out.parent / "cache", grid)
    if args.resume:
        checkpoint.check_tokenizer(out, tok, saved_meta)
    train_ids, val_ids = corpus.split(ids)
    baseline = corpus.unigram_baseline(train_ids, val_ids, cfg.vocab_size)
    say(f"tokens: {len(train_ids):,} train, {len(val_ids):,} validation "
        f"({time.perf_counter() - t_start:.1f} s); unigram baseline {baseline:.3f} nats/token")
    job = Run(cfg, s, dtype, grid=grid, zero=args.zero)
    job.data = str(Path(data).resolve())
    job.detect_anomaly = args.detect_anomaly
    if args.resume:
        job.load(out)
        say(f"resumed {out} at step {job.step}")
    say(f"model: {cfg.name}, {job.model.n_params():,} parameters, {s.steps} steps of "
        f"{s.batch_size}x{s.seq_len} tokens, {dtype}")
    if grid is not None:
        say(f"ranks: {grid.world.size} ({grid.shape.describe()}), {s.threads} thread(s) "
            f"each; rank 0 writes {out}")
        say(f"communication model: {_bytes(job.comm_model)} sent per step by rank 0")
        if args.zero:
            say(f"ZeRO-1: AdamW state {job.opt.state_bytes() / 2**20:.2f} MiB on rank 0 of "
                f"{2 * job.model.n_params() * dtype.itemsize / 2**20:.2f} MiB unsharded")
    t_train = time.perf_counter()
    finished = fit(job, train_ids, val_ids, out=out, tokenizer=tok,
                   progress=not args.no_progress)
    if not finished:
        return 130
    train_time = time.perf_counter() - t_train
    val = job.evaluate(corpus.eval_batches(val_ids, s.batch_size, s.seq_len, s.eval_tokens))
    if not np.isfinite(val):
        raise ValueError(f"the final validation loss is {val}; {job.likely_cause()} (the "
                         f"checkpoint in {out} was not overwritten)")
    job.evals.append((job.step, val))
    job.save(out, tok)
    say(f"validation loss {val:.3f} nats/token = {val / baseline:.2f} x unigram baseline "
        f"{baseline:.3f} (training {train_time:.0f} s, total "
        f"{time.perf_counter() - t_start:.0f} s)")
    if grid is not None and job.sent:
        predicted = sum(job.comm_model.values())
        say(f"communication measured: {job.sent[-1]:,} bytes sent by rank 0 in the last step "
            f"({'equal to' if job.sent[-1] == predicted else 'NOT equal to'} the model's "
            f"{predicted:,})")
    say(f"checkpoint: {out}")
    if job.writer:
        say(f"loss curve: {save_run_plot(out / 'loss.png', job, baseline)}")
        _print_sample(job.model, tok)
    return 0


def _bytes(model):
    """'2,099,456 B all_reduce + ...' of a communication model."""
    return " + ".join(f"{n:,} B {op}" for op, n in model.items()) or "nothing"


def _prepare(data, vocab_size, cache, grid):
    """corpus.prepare, on rank 0 first under MPI (the others then read its cache)."""
    if grid is not None and not grid.is_first():
        grid.world.barrier()
    tok, ids, _ = corpus.prepare(data, vocab_size, cache)
    if grid is not None and grid.is_first():
        grid.world.barrier()
    return tok, ids


def _print_sample(model, tok):
    prompt = "The "
    print(f"sample (temperature 0.8, top-k 40):\n{prompt}", end="")
    for piece in generate(model, tok, prompt, max_new_tokens=60, temperature=0.8, top_k=40,
                          rng=np.random.default_rng(0)):
        print(piece, end="", flush=True)
    print()
