"""python -m scratchllm drill list|start|check NAME: retype a function by hand against the
clock, then check it the way the library's own version is checked.

    python -m scratchllm drill list                      # names, target times
    python -m scratchllm drill start rmsnorm_backward    # writes drills/rmsnorm_backward.py
    python -m scratchllm drill check rmsnorm_backward    # runs its checks, elapsed vs target

The drills are scratchllm/teach/drills/bank/ (one module per topic).
"""
import time
from pathlib import Path

from scratchllm.cli.common import Parser, print_results, run
from scratchllm.teach.drills.bank import DRILLS
from scratchllm.teach.drills.core import load_user_function, run_checks, start, started_at


def build_parser():
    parser = Parser("drill", __doc__)
    parser.add_argument("action", choices=["list", "start", "check"])
    parser.add_argument("name", nargs="?", help="the drill (see `list`)")
    parser.add_argument("--dir", default="drills", help="folder of drill files (default: drills)")
    parser.add_argument("--force", action="store_true", help="start: overwrite an existing file")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.action != "list" and args.name not in DRILLS:
        parser.error(f"{args.action} needs a drill name, one of: {', '.join(DRILLS)}; "
                     f"got {args.name!r}")
    return run("drill", _ACTIONS[args.action], args)


def _list(args):
    for d in DRILLS.values():
        print(f"{d.name:<26} {d.minutes:>3} min   {d.source}")
    return 0


def _start(args):
    drill = DRILLS[args.name]
    path = start(drill, args.dir, args.force)
    print(f"wrote {path}; target {drill.minutes} min. When done: "
          f"python -m scratchllm drill check {drill.name}")
    return 0


def _clock(seconds):
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def _check(args):
    drill, folder = DRILLS[args.name], Path(args.dir)
    results = run_checks(drill, load_user_function(folder / f"{drill.name}.py", drill.name))
    n_pass = print_results(results)
    began = started_at(folder, drill.name)
    if began is not None:
        elapsed = time.time() - began
        verdict = "within" if elapsed <= drill.minutes * 60 else "over"
        print(f"; {_clock(elapsed)} elapsed, target {drill.minutes}:00 ({verdict} target)", end="")
    print()
    return 0 if n_pass == len(results) else 1


_ACTIONS = {"list": _list, "start": _start, "check": _check}
