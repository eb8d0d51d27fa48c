"""python -m scratchllm train: train a small decoder LM on a CPU, every gradient hand-written.

With no arguments: train a byte-level BPE tokenizer on the bundled Python-docs corpus (cached),
train the first run's model (the `dense` preset narrowed to d_model 96, d_ff 256:
settings.first_run_model; --preset dense trains the preset itself), report the validation loss
against the unigram baseline, save a checkpoint directory and a loss-curve PNG, and print a
short sample.

One step:  loss = CE(LM(x), y) + sum of MoE aux terms  ->  backward  ->  clip global grad norm
           ->  AdamW with lr = warmup + cosine(step) (--optimizer muon: Muon on the blocks'
           matrices, core/muon.py)  ->  aux-free router bias update (MoE).
The run is deterministic given --seed, and --resume continues bit-exactly: the weights,
optimizer moments, step, losses and the batch RNG's state all live in the checkpoint.
The loop itself lives in scratchllm/train/trainer.py.

Across processes (the dist extra: mpi4py + MPICH):
    mpiexec -n N python -m scratchllm train --dp N [--threads T] ...
trains data parallel on N ranks: --batch-size is the global batch, each rank takes its
contiguous slice, gradients are all-reduced, rank 0 prints and writes the checkpoint (the same
files as a one-process run). --threads defaults to 1 per rank under MPI. --zero 1|2|3 shards
the optimizer state, the gradients, the weights; --tp B splits heads, SwiGLU units and the
vocabulary over B ranks (Megatron; --sequence-parallel splits the sequence between them), and
--dp A --tp B runs on A x B ranks; --pp C cuts the blocks into C stages fed --micro-batches
M micro-batches on the --schedule gpipe or 1f1b, and prints the pipeline bubble; --cp D
splits every sequence into D ranks' zig-zag chunks (ring attention); --ep E splits each MoE
layer's experts over E ranks (dispatch and combine all-to-alls).
"""
import resource
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from scratchllm.cli.common import LR, Parser, int_at_least, run, run_on_ranks
from scratchllm.core.atomic import remove_stale_temps
from scratchllm.core.compiling import PhaseClock
from scratchllm.dist import (AXES, GridError, GridShape, Group, MPIUnavailable, RankGrid,
                             launched_by_mpiexec)
from scratchllm.lm import generate, preset
from scratchllm.specs import PRESETS, MTPSpec, to_dict
from scratchllm.specs.unflat import flat_view
from scratchllm.tokenizer import EOT
from scratchllm.train import checkpoint, corpus
from scratchllm.train.checkpoint import load_model
from scratchllm.train import parallel_run
from scratchllm.train.parallel_run import check_combination, check_split
from scratchllm.train.pipeline import bubble_fraction
from scratchllm.train.plots import save_run_plot
from scratchllm.train.optimizers import OPTIMIZERS
from scratchllm.train.settings import Settings, first_run, first_run_model
from scratchllm.train.trainer import Run, fit
from scratchllm.train.warm import EncoderFirst, KernelWarmup, sum_warmed


def build_parser():
    p = Parser("train", __doc__)
    d = first_run()
    p.add_argument("--preset", choices=sorted(PRESETS), default=None,
                   help="model architecture (default: the first run's model, the dense "
                   "preset narrowed to d_model 96 and d_ff 256: settings.first_run_model)")
    p.add_argument("--data", default=None,
                   help="UTF-8 text file to train on (default: the bundled Python docs)")
    p.add_argument("--steps", type=int_at_least(1), default=None,
                   help=f"optimizer steps ({d.steps})")
    p.add_argument("--batch-size", type=int_at_least(1), default=None,
                   help=f"sequences ({d.batch_size})")
    p.add_argument("--seq-len", type=int_at_least(1), default=None, help=f"context ({d.seq_len})")
    p.add_argument("--lr", type=LR, default=None, help=f"peak learning rate ({d.lr}; in (0, 1]; "
                   f"AdamW's, of every Param with --optimizer adamw)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default=None, help=f"adamw: AdamW "
                   f"everywhere; muon: Muon on the blocks' matrices (attention and MLP "
                   f"projections: momentum, then the update orthogonalised by a Newton-Schulz "
                   f"iteration), AdamW on embeddings, head and gains ({d.optimizer}; adamw "
                   f"under mpiexec)")
    p.add_argument("--muon-lr", type=LR, default=None,
                   help=f"Muon's peak learning rate ({d.muon_lr}; same warmup and cosine)")
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
    p.add_argument("--mtp", type=int_at_least(0), default=None, metavar="D",
                   help="add D multi-token-prediction modules (DeepSeek-V3's MTP: module k "
                   "predicts the token k + 1 ahead; loss weight 0.3 / D); default 0")
    p.add_argument("--fp8", action="store_true", default=None, help="train with FP8 matmuls "
                   "as DeepSeek-V3 does: e4m3 weights and activations on 128 x 128 / 1 x 128 "
                   "scales, e5m2 gradients, float32 master weights; the head stays float")
    p.add_argument("--detect-anomaly", action="store_true", help="check every Module's output "
                   "and gradient; name the first to go NaN or inf (slower)")
    p.add_argument("--pack-documents", action="store_true", default=None, help="attend within "
                   "each document of a window only (split at <|endoftext|>), positions "
                   "restarting at each: Llama 3's document masking")
    p.add_argument("--threads", type=int_at_least(1), default=None, help=f"data-parallel "
                   f"threads per process ({d.threads}; 1 per rank under MPI)")
    for axis, what in (("dp", "data"), ("tp", "tensor"), ("pp", "pipeline"),
                       ("cp", "context"), ("ep", "expert")):
        p.add_argument(f"--{axis}", type=int_at_least(1), default=1, help=f"{what}-parallel "
                       f"ranks (1; under `mpiexec -n N`, the sizes multiply to N)")
    p.add_argument("--zero", type=int, choices=(1, 2, 3), default=0, help="ZeRO stage over "
                   "the --dp ranks: 1 shards AdamW's state, 2 the gradients too (reduce-"
                   "scattered per block), 3 the weights too (all-gathered per block on use)")
    p.add_argument("--sequence-parallel", action="store_true", help="with --tp: split the "
                   "residual stream along T between the tensor-parallel regions (norms on 1/tp "
                   "of the tokens; all-gather / reduce-scatter in place of the all-reduces)")
    p.add_argument("--micro-batches", type=int_at_least(1), default=0, help="with --pp: "
                   "micro-batches per step on each data-parallel rank (default: one per stage)")
    p.add_argument("--balance-across-ranks", dest="balance_across", action="store_true",
                   default=None, help="MoE: the balance loss over every data-parallel rank's "
                   "tokens (routed counts and probabilities all-reduced), not per rank's "
                   "micro-batch (the default, as Switch and GShard compute it per device)")
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b", help="with --pp: "
                   "all forwards then all backwards (gpipe), or one forward one backward (1f1b)")
    return p


def _settings(args, saved=None, ranks=1):
    """Flags given explicitly win; then the checkpoint's settings (one saved before
    Settings.optimizer existed is AdamW's: Settings()); then the first run's (settings.first_run;
    and one thread per rank when ranks > 1)."""
    s = dict(asdict(Settings() if saved else first_run()), **(saved or {}))
    if ranks > 1:
        s["threads"] = 1
    for name in ("steps", "batch_size", "seq_len", "lr", "seed", "eval_every", "threads",
                 "fp8", "pack_documents", "balance_across", "optimizer", "muon_lr"):
        if getattr(args, name) is not None:
            s[name] = getattr(args, name)
    for name in ("steps", "batch_size", "seq_len", "eval_every"):
        if s[name] <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be > 0, got {s[name]}")
    if s["lr"] <= 0:
        raise ValueError(f"--lr must be > 0, got {s['lr']}")
    if ranks > 1 and s["optimizer"] == "muon":
        raise ValueError("--optimizer muon runs in one process (it orthogonalises whole "
                         "matrices; the ranks' slices and ZeRO's shards are AdamW's); use "
                         "--optimizer adamw under mpiexec")
    s["warmup"] = min(s["warmup"], s["steps"])
    return Settings(**s)


def _model(name):
    """The config of --preset NAME; without one, the first run's (settings.first_run_model)."""
    return first_run_model() if name is None else preset(name)


def _config_for_resume(args, out):
    """The checkpoint's config; a --preset that disagrees with it is an error."""
    cfg = checkpoint.read_config(out)
    have = 0 if cfg.mtp is None else cfg.mtp.depth
    if args.mtp is not None and args.mtp != have:
        raise checkpoint.CheckpointError(
            f"--mtp {args.mtp} does not match the checkpoint in {out} ({have} MTP modules); "
            f"drop --mtp to resume it, or use another --out")
    want_cfg = None if args.preset is None else replace(preset(args.preset), mtp=cfg.mtp)
    if want_cfg is not None and want_cfg != cfg:
        want, have = _fields(want_cfg), _fields(cfg)
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
        if args.sequence_parallel and shape.pp > 1:
            raise GridError("--sequence-parallel with --pp: the stages pass whole (B, T, D) "
                            "activations; use --tp with --pp without it")
        if args.sequence_parallel and shape.tp == 1:
            raise GridError("--sequence-parallel splits the tensor-parallel ranks' sequence: "
                            "it needs --tp above 1")
        if not args.resume:  # what the split models do not cover, before any work
            cfg = _model(args.preset)
            cfg = replace(cfg, mtp=MTPSpec(depth=args.mtp)) if args.mtp else cfg
            check_split(cfg, shape, args.seq_len or first_run().seq_len)
        check_combination(shape._asdict(), args.threads or 1, args.zero)
    except (GridError, ValueError) as e:
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
        cfg = _model(args.preset)
        if args.mtp:
            cfg = replace(cfg, mtp=MTPSpec(depth=args.mtp))
    s = _settings(args, saved_meta and saved_meta["settings"], 1 if grid is None else
                  grid.world.size)
    dtype = np.dtype(args.dtype or (saved_meta or {}).get("dtype", "float32"))
    data = args.data or (saved_meta or {}).get("data") or str(corpus.DEFAULT_CORPUS)
    t_start, clock = time.perf_counter(), PhaseClock()
    # one process: the kernels compile in a forked child while the data is prepared
    fresh = not corpus.is_prepared(data, cfg.vocab_size, out.parent / "cache")
    warm = None if grid is not None or s.fp8 else KernelWarmup(cfg, s, dtype)
    say(f"data: {data} (tokenizer: BPE, vocab {cfg.vocab_size})")
    encoder = None  # the encoder's warm-up, when the tokenizer is to be trained
    with clock.phase("data"):
        if fresh and warm is not None:
            encoder = EncoderFirst(clock)
        tok, ids = _prepare(data, cfg.vocab_size, out.parent / "cache", grid,
                            clock if encoder is None else encoder)
    if args.resume:
        checkpoint.check_tokenizer(out, tok, saved_meta)
    train_ids, val_ids = corpus.split(ids)
    baseline = corpus.unigram_baseline(train_ids, val_ids, cfg.vocab_size)
    say(f"tokens: {len(train_ids):,} train, {len(val_ids):,} validation "
        f"({time.perf_counter() - t_start:.1f} s); unigram baseline {baseline:.3f} nats/token")
    job = Run(cfg, s, dtype, grid=grid, zero=args.zero, sequence=args.sequence_parallel,
              pipeline=(args.schedule, args.micro_batches))
    job.data = str(Path(data).resolve())
    job.detect_anomaly = args.detect_anomaly
    job.eot = tok.special_tokens.get(EOT)
    if args.resume:
        job.load(out)
        say(f"resumed {out} at step {job.step}")
    mtp = f" (with {cfg.mtp.depth} MTP modules)" if cfg.mtp else ""
    n_params = job.model.n_params() if job.sliced is None else cfg.n_params()  # not a slice's
    say(f"model: {cfg.name}{mtp}, {n_params:,} parameters, {s.steps} steps of "
        f"{s.batch_size}x{s.seq_len} tokens, {dtype}{', FP8 matmuls' if s.fp8 else ''}")
    if grid is not None:
        say(f"ranks: {grid.world.size} ({grid.shape.describe()}), {s.threads} thread(s) "
            f"each; rank 0 writes {out}")
        say(f"communication model: {_bytes(job.comm_model)} sent per step by rank 0")
        if args.zero:
            say(_zero_line(job, args.zero, dtype))
    if warm is not None:
        with clock.phase("waiting for the warm-up"):
            warmed = sum_warmed(warm.wait(), encoder and encoder.wait())
    job.evaluate = clock.timed("validation", job.evaluate)
    job.save = clock.timed("checkpoints", job.save)
    t_train = time.perf_counter()
    with clock.phase("train"):
        finished = fit(job, train_ids, val_ids, out=out, tokenizer=tok,
                       progress=not args.no_progress)
    if not finished:
        clock.close()
        return 130
    train_time = time.perf_counter() - t_train
    val = job.evaluate(job.eval_set(val_ids))
    if not np.isfinite(val):
        raise ValueError(f"the final validation loss is {val}; {job.likely_cause()} (the "
                         f"checkpoint in {out} was not overwritten)")
    job.evals.append((job.step, val))
    job.save(out, tok)
    say(f"validation loss {val:.3f} nats/token = {val / baseline:.2f} x unigram baseline "
        f"{baseline:.3f} (training {train_time:.0f} s, total "
        f"{time.perf_counter() - t_start:.0f} s)")
    if job.stage is not None:
        say(_bubble_line(job))
    if grid is not None and job.sent:
        predicted = parallel_run.predicted_sent(job)
        same = "equal to" if job.sent[-1] == predicted else "NOT equal to"
        routed = "" if job.ep is None else (  # the all-to-alls' sizes are the routing's
            f", its expert-parallel all-to-alls and gathers sized from the step's routing: "
            f"{_bytes(job.model.routed_bytes)}, within the config's bound "
            f"{sum(n for k, n in job.comm_model.items() if k.endswith('(at most)')):,}")
        say(f"communication measured: {job.sent[-1]:,} bytes sent by rank 0 in the last step "
            f"({same} the model's {predicted:,}{routed})")
    if grid is not None:  # collective
        say(_memory_line(grid))
    if job.mtp_losses:
        last = np.mean(job.mtp_losses[-20:], axis=0)
        say("MTP modules' train cross-entropy (mean of the last 20 steps): " + ", ".join(
            f"{v:.3f} (token +{k + 2})" for k, v in enumerate(last)))
    say(f"checkpoint: {out}")
    if job.writer:
        with clock.phase("plot"):
            say(f"loss curve: {save_run_plot(out / 'loss.png', job, baseline)}")
        with clock.phase("sample"):  # a split model (tp, cp, ep) samples badly or not at
            # all: the whole model it saved
            _print_sample(job.model if grid is None else load_model(out)[0], tok)
    clock.close()
    say(clock.summary() + ("" if warm is None else _warm_line(warmed, 1 + bool(encoder))))
    return 0


def _warm_line(warmed, n_procs):
    """'; the 2 warm-up processes compiled 14 kernels in 9.8 s beside it' (or the error)."""
    if isinstance(warmed, str):
        return f"; a warm-up process failed ({warmed}), the run compiled for itself"
    n, sec = warmed
    procs = "warm-up process" if n_procs == 1 else f"{n_procs} warm-up processes"
    return f"; the {procs} compiled {n} kernel{'s' * (n != 1)} in {sec:.1f} s beside it"


def _zero_line(job, stage, dtype):
    """'ZeRO-2: AdamW state 8.01 MiB, gradients ..., weights ... on rank 0 of ... unsharded'."""
    n = job.model.n_params() * dtype.itemsize
    line = f"ZeRO-{stage}: AdamW state {job.opt.state_bytes() / 2**20:.2f} MiB"
    whole = f"{2 * n / 2**20:.2f} MiB"
    if job.shards is not None:
        weights, grads = job.shards.held_bytes()
        line += f", gradients {grads / 2**20:.2f} MiB, weights {weights / 2**20:.2f} MiB"
        whole += f", {n / 2**20:.2f} MiB, {n / 2**20:.2f} MiB"
    return f"{line} on rank 0 between steps, of {whole} unsharded"


def _bubble_line(job):
    """'pipeline: 1f1b, 4 micro-batches on 2 stages: bubble 20% predicted ..., measured ...'
    (collective: every rank calls it)."""
    P, M = job.stage.group.size, job.stage.n_micro
    measured, held = job.stage.measured_bubble()
    return (f"pipeline: {job.stage.name}, {M} micro-batches on {P} stages: bubble (P-1)/(M+P-1) "
            f"= {bubble_fraction(P, M):.0%} predicted, {measured:.0%} measured in the last "
            f"step (idle share of the schedule, mean over stages); at most {held} micro-batches' "
            f"activations held on a stage")


def _memory_line(grid):
    """'peak memory per rank: 412, 398 MiB' (resident set size; collective)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    per_rank = grid.world.comm.gather(peak, root=0)
    return ("peak memory (resident) per rank: " + ", ".join(f"{m:,.0f}" for m in per_rank)
            + " MiB" if per_rank else "")


def _bytes(model):
    """'2,099,456 B all_reduce + ...' of a communication model."""
    return " + ".join(f"{n:,} B {op}" for op, n in model.items()) or "nothing"


def _prepare(data, vocab_size, cache, grid, clock):
    """corpus.prepare, on rank 0 first under MPI (the others then read its cache)."""
    if grid is not None and not grid.is_first():
        grid.world.barrier()
    tok, ids, _ = corpus.prepare(data, vocab_size, cache, clock)
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
