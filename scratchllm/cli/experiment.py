"""python -m scratchllm experiment list|run NAME: the chapters' claims, measured.

    python -m scratchllm experiment list                 # one name per line, then its claim
    python -m scratchllm experiment run induction        # the full run (README's numbers)
    python -m scratchllm experiment run induction --quick --out runs/induction

Each run prints a table, the chapter's claim beside the measured outcome, and writes
OUT/results.json (the metrics, "config" and "seed") and OUT/NAME.png. --quick finishes in
under 2 minutes on 2 cores; --smoke in seconds (what the fast tests run).
The experiments are scratchllm/experiments/ (one module each).
"""
from scratchllm.cli.common import Parser, int_at_least, run
from scratchllm.experiments import EXPERIMENTS, run_experiment


def build_parser():
    parser = Parser("experiment", __doc__)
    parser.add_argument("action", choices=["list", "run"])
    parser.add_argument("name", nargs="?", help="the experiment (see `list`)")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="under 2 minutes on 2 cores")
    size.add_argument("--smoke", action="store_true", help="seconds: checks that it runs")
    parser.add_argument("--out", default=None,
                        help="directory for results.json and the figure "
                             "(default runs/experiments/NAME)")
    parser.add_argument("--seed", type=int_at_least(0), default=0)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.action == "run" and args.name not in EXPERIMENTS:
        parser.error(f"run needs an experiment name, one of: {', '.join(EXPERIMENTS)}; "
                     f"got {args.name!r}")
    return run("experiment", _ACTIONS[args.action], args)


def _list(args):
    for name, experiment in EXPERIMENTS.items():
        print(f"{name:<10} {experiment.claim}")
    return 0


def _run(args):
    mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    out = args.out or f"runs/experiments/{args.name}"
    run_experiment(args.name, mode, out, args.seed)
    return 0


_ACTIONS = {"list": _list, "run": _run}
