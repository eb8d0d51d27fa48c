"""python -m scratchllm compare: train every preset on the same tokens, print one table.

The MHA/GQA/MQA/MLA/MoE/SSM trade-off table of interview prep, made executable:
    params total / active per token       (MoE: only K of E routed experts run per token)
    cache bytes per token at 4k and 128k  (KV cache for attention, rolling window for SWA,
                                           latent for MLA, fixed conv/SSM state for Mamba,
                                           bf16; a fixed-size cache shrinks per token as the
                                           context grows)
    training tokens/s (median step), final validation loss
Every preset sees the same batches (same seed) for the same number of steps; the loss curves
go to a PNG. --positions rope,alibi,sinusoidal,nope trains each preset once per position
scheme (rows "dense/alibi", ...), side by side. The cache and parameter arithmetic comes from
scratchllm/teach/sizing.py.
"""
from pathlib import Path

from scratchllm.cli.common import LR, Parser, int_at_least, run
from scratchllm.lm import preset
from scratchllm.specs import PRESETS
from scratchllm.train.extrapolation import POSITIONS
from scratchllm.teach import sizing
from scratchllm.train import corpus
from scratchllm.train.plots import save_compare_plot
from scratchllm.train.settings import Settings
from scratchllm.train.trainer import train_preset

TABLE_CONTEXTS = (4096, 131072)  # the table's cache/token columns: 4k and 128k


def sizes(cfg):
    """(params total, params active per token, [cache bytes per token at each of
    TABLE_CONTEXTS]) of a scratchllm.specs.ModelConfig."""
    p = sizing.parameters(cfg)
    per_token = [sizing.kv_cache(cfg, context=c, dtype="bf16").bytes / c
                 for c in TABLE_CONTEXTS]
    return p.total, p.active, per_token


def _fmt_bytes(n):
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n:.0f} B" if n >= 10 else f"{n:.2f} B"


def table(rows, baseline):
    head = (f"{'preset':<8}{'params':>10}{'active':>10}{'cache/token 4k':>16}"
            f"{'cache/token 128k':>18}{'tokens/s':>10}{'val loss':>10}{'x unigram':>11}")
    width = max([8] + [len(name) + 1 for name, *_ in rows])
    lines = [head.replace(f"{'preset':<8}", f"{'preset':<{width}}", 1)]
    for name, (total, active, cache), tok_s, val in rows:
        lines.append(f"{name:<{width}}{total:>10,}{active:>10,}{_fmt_bytes(cache[0]):>16}"
                     f"{_fmt_bytes(cache[1]):>18}{tok_s:>10,.0f}{val:>10.3f}"
                     f"{val / baseline:>11.2f}")
    return "\n".join(lines)


def build_parser():
    p = Parser("compare", __doc__)
    p.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets")
    p.add_argument("--data", default=str(corpus.DEFAULT_CORPUS), help="UTF-8 text file")
    p.add_argument("--positions", default=None,
                   help="comma-separated position schemes (rope, alibi, sinusoidal, nope): "
                        "each preset once per scheme")
    p.add_argument("--steps", type=int_at_least(1), default=100, help="steps per preset (100)")
    p.add_argument("--batch-size", type=int_at_least(1), default=16)
    p.add_argument("--seq-len", type=int_at_least(1), default=128)
    p.add_argument("--lr", type=LR, default=8e-3, help="peak learning rate (8e-3: 100 steps "
                   "of 16 sequences, as compare's table in README was measured)")
    p.add_argument("--out", default="runs/compare",
                   help="directory for the plot (token cache in OUT/../cache)")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.presets.split(",") if n.strip()]
    unknown = [n for n in names if n not in PRESETS]
    if unknown or not names:
        parser.error(f"--presets: unknown preset(s) {unknown}; choose from {sorted(PRESETS)}")
    schemes = [None] if args.positions is None else [
        s.strip() for s in args.positions.split(",") if s.strip()]
    if not schemes or set(schemes) - {None, *POSITIONS}:
        parser.error(f"--positions: got {args.positions!r}; choose from {list(POSITIONS)}")
    variants = [(n if pos is None else f"{n}/{pos}", n, pos) for n in names for pos in schemes]
    return run("compare", lambda a: _compare(a, variants), args)


def _config(name, pos):
    return preset(name) if pos is None else preset(name, positions=pos)


def _compare(args, variants):
    out = Path(args.out)
    names = [name for _, name, _ in variants]
    vocab = {preset(n).vocab_size for n in names}
    if len(vocab) != 1:
        raise ValueError(f"the presets use different vocab sizes {sorted(vocab)}")
    _, ids, _ = corpus.prepare(args.data, vocab.pop(), out.parent / "cache")
    train_ids, val_ids = corpus.split(ids)
    baseline = corpus.unigram_baseline(train_ids, val_ids, preset(names[0]).vocab_size)
    settings = Settings(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                        lr=args.lr, warmup=min(Settings.warmup, args.steps),
                        eval_every=args.steps + 1)
    eval_set = corpus.eval_batches(val_ids, settings.batch_size, settings.seq_len, 16384)
    print(f"{len(variants)} models x {args.steps} steps x {args.batch_size}x{args.seq_len} "
          f"tokens, same batches; unigram baseline {baseline:.3f} nats/token")
    rows, curves = [], {}
    for label, name, pos in variants:
        cfg = _config(name, pos)
        losses, tok_s, val, _ = train_preset(cfg, train_ids, eval_set, settings,
                                             not args.no_progress)
        curves[label] = losses
        rows.append((label, sizes(cfg), tok_s, val))
        print(f"{label}: val loss {val:.3f}, {tok_s:,.0f} tokens/s", flush=True)
    print()
    print(table(rows, baseline))
    out.mkdir(parents=True, exist_ok=True)
    print(f"\nloss curves: {save_compare_plot(out / 'compare.png', curves, baseline)}")
    return 0
