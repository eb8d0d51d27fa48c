"""python -m scratchllm size MODEL [--explain]: parameters (total and active per token), FLOPs
per token, KV cache and serving memory of a real model, exact integers beside rounded units,
and the chapters' rules beside them (12·L·D², 2N / 6N, the attention/MLP crossover context,
L·W, KV against Mamba state at 1k / 32k / 1M, F ≈ 8/3·D, the embedding's share, an MLA cache
against DeepSeek 67B's); --explain prints each line's formula. The arithmetic is scratchllm/teach/sizing.py and the rules scratchllm/teach/rules.py (pure Python:
this command loads no numpy).

--parallel dp=8,tp=8,pp=4 [--zero S] prints the per-GPU memory (weights, gradients, AdamW) and
the bytes each GPU sends per step per axis of training on that grid (scratchllm/teach/sharding.py).

--serve prints the roofline of one decode step per batch size instead (--hw a100 | h100 | h200
| laptop | this, --batch 1,8,64, --json, --plot PNG: scratchllm/cli/size_serve.py over
scratchllm/teach/serving.py); only --hw this (measured here) loads numpy.
"""
import argparse
import sys

from scratchllm.cli.common import Parser, run
from scratchllm.cli.size_report import describe, report
from scratchllm.cli.size_serve import save_serve_plot, serve_json, serve_table
from scratchllm.specs import PRESETS, preset
from scratchllm.teach.arch import MODELS
from scratchllm.teach.serving import HARDWARE, hardware
from scratchllm.teach.sharding import parse_grid, per_gpu
from scratchllm.teach.sizing import DTYPE_BYTES, dtype_bytes, human, human_bytes


def build_parser():
    parser = Parser("size", __doc__)
    parser.add_argument("model", nargs="?", help="a model name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the known models")
    parser.add_argument("--context", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--batch", type=batch_list, default=[1],
                        help="sequences served at once (--serve: a list, e.g. 1,8,64)")
    parser.add_argument("--dtype", default="bf16", type=dtype_name,
                        help=f"dtype of the weights (and of the cache unless --kv-dtype): "
                             f"{', '.join(DTYPE_BYTES)}; int4 carries a bf16 scale per group "
                             f"of 128 numbers, int4-gN per group of N")
    parser.add_argument("--kv-dtype", type=dtype_name, help="dtype of the cache (as --dtype)")
    parser.add_argument("--explain", action="store_true",
                        help="print the formula behind each line")
    serve = parser.add_argument_group("serving (the roofline of a decode step)")
    serve.add_argument("--serve", action="store_true",
                       help="bytes read, FLOPs, intensity and time per decode step per batch")
    serve.add_argument("--hw", choices=[*HARDWARE, "this"],
                       help="the device (default h100; this: measured here with numpy)")
    serve.add_argument("--json", action="store_true", help="print only a JSON list")
    serve.add_argument("--plot", metavar="PNG", help="tokens/s against batch, to this file")
    serve.add_argument("--measure", action="store_true",
                       help="with --hw this: also time the library's own decode of MODEL (a "
                            "preset: dense, moe, mla, ...) at each batch size")
    par = parser.add_argument_group("training on a grid of GPUs")
    par.add_argument("--parallel", metavar="GRID", help="per-GPU memory and bytes sent per "
                     "step on a grid, e.g. dp=8,tp=8,pp=4 (--batch: the micro-batch)")
    par.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                     help="with --parallel: the ZeRO stage over the dp ranks")
    return parser


def dtype_name(text):
    """An argparse `type`: a dtype sizing knows (DTYPE_BYTES, or int4-gN)."""
    try:
        dtype_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("sizing: ")) from None
    return text


def batch_list(text):
    """An argparse `type`: "1,8,64" -> [1, 8, 64], each an integer >= 1."""
    try:
        batches = [int(t) for t in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got "
                                         f"{text!r}") from None
    if min(batches) < 1:
        raise argparse.ArgumentTypeError(f"every batch must be >= 1, got {text}")
    return batches


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.model is not None and args.model not in MODELS and args.model not in PRESETS:
        parser.error(f"unknown model {args.model!r}; known: {', '.join(MODELS)} and the "
                     f"presets {', '.join(PRESETS)}")
    if args.context < 1:
        parser.error(f"--context must be >= 1, got {args.context}")
    given = [f for f in ("hw", "json", "plot", "measure") if getattr(args, f)]
    if not args.serve and given:
        parser.error(f"--{given[0]} belongs to --serve")
    if not args.serve and len(args.batch) > 1:
        parser.error(f"one --batch without --serve, got {len(args.batch)}")
    if args.serve and args.model is None:
        parser.error("--serve needs a MODEL")
    if args.measure and (args.hw != "this" or args.json):
        parser.error("--measure times this machine: it needs --hw this, and prints a table "
                     "(not --json)")
    return run("size", _size, args)


def _size(args):
    if args.list or args.model is None:
        print("\n".join(f"{name:<16} {describe(cfg)}" for name, cfg in MODELS.items()))
        print(f"\npresets (the models this library trains): {', '.join(PRESETS)}")
        return 0
    if args.serve:
        return _serve(args)
    if args.parallel:
        print(parallel_report(_model(args.model), parse_grid(args.parallel), args.zero,
                              args.batch[0], args.context))
        return 0
    print(report(_model(args.model), args.context, args.batch[0], args.dtype, args.kv_dtype,
                 args.explain))
    return 0


def parallel_report(cfg, grid, zero, micro_batch, context):
    """The lines of `size MODEL --parallel dp=A,tp=B,pp=C` (teach/sharding.py)."""
    g = per_gpu(cfg, grid, zero=zero, micro_batch=micro_batch, context=context)
    n = grid.dp * grid.tp * grid.pp
    lines = [f"{cfg.name} on dp={grid.dp} x tp={grid.tp} x pp={grid.pp} = {n:,} GPUs, ZeRO-"
             f"{zero}, micro-batch {micro_batch} x {context:,} tokens, {grid.pp} micro-batches"
             f" per step", f"  parameters per GPU   {g['params']:>16,}  ({human(g['params'])})"]
    for name in ("weights", "gradients", "adamw", "total"):
        lines.append(f"  {name + ' (bytes)':<20} {g[name]:>16,}  ({human_bytes(g[name])})")
    for axis, what in (("dp", "gradient all-reduce"), ("tp", "f/g all-reduces"),
                       ("pp", "activations and their gradients")):
        lines.append(f"  sent per step, {axis}   {g[axis]:>16,}  ({human_bytes(g[axis])}: "
                     f"{what})")
    lines.append(f"  pipeline bubble      {g['bubble']:>16.1%}  ((pp-1)/(m+pp-1))")
    return "\n".join(lines)


def _model(name):
    """A published config (teach/arch.py) or a preset (scratchllm.specs.PRESETS)."""
    return MODELS[name] if name in MODELS else preset(name)


def _serve(args):
    cfg, dtypes = _model(args.model), (args.dtype, args.kv_dtype or args.dtype)
    measured = experts = None
    if args.hw == "this":
        # numpy measures this machine: imported only here, so `size` otherwise loads no numpy
        from scratchllm.cli.hardware import measure_decode, measure_experts, measure_this
        hw = measure_this()
        if args.measure:
            measured = measure_decode(cfg, args.batch, args.context)
            experts = measure_experts(cfg, args.batch)
    else:
        hw = hardware(args.hw or "h100")
    if args.json:
        print(serve_json(cfg, hw, args.batch, args.context, dtypes))
    else:
        print(serve_table(cfg, hw, args.batch, args.context, dtypes, measured, experts))
    if args.plot and not save_serve_plot(args.plot, cfg, hw, args.context, dtypes, measured):
        print(f"scratchllm size: no plot written (matplotlib missing, or not even one "
              f"sequence fits {hw.name})", file=sys.stderr)
    return 0
