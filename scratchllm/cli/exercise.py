"""python -m scratchllm exercise list|show|check N: the chapters' exercises, each a statement,
a hint and a checked solution.

    python -m scratchllm exercise list                       # numbers, titles, notebooks
    python -m scratchllm exercise show 2 [--solution]        # statement, hint, the function
    python -m scratchllm exercise check 2                    # the library's solution
    python -m scratchllm exercise check 2 --file answer.py   # your function of that name

The exercises are scratchllm/teach/exercises/.
"""
from pathlib import Path

from scratchllm.cli.common import Parser, print_results, run
from scratchllm.teach.drills.core import load_user_function
from scratchllm.teach.exercises import EXERCISES, check


def build_parser():
    parser = Parser("exercise", __doc__)
    parser.add_argument("action", choices=["list", "show", "check"])
    parser.add_argument("number", nargs="?", type=int, help="the exercise (see `list`)")
    parser.add_argument("--solution", action="store_true", help="show: the worked solution too")
    parser.add_argument("--file", help="check: a .py file defining the exercise's function")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.action != "list" and args.number not in EXERCISES:
        parser.error(f"{args.action} needs an exercise number, one of: "
                     f"{', '.join(map(str, sorted(EXERCISES)))}; got {args.number!r}")
    if args.file and args.action != "check":
        parser.error(f"--file is for check, not {args.action}")
    if args.solution and args.action != "show":
        parser.error(f"--solution is for show, not {args.action}")
    return run("exercise", _ACTIONS[args.action], args)


def _list(args):
    for ex in sorted(EXERCISES.values(), key=lambda e: e.number):
        print(f"Ex. {ex.number}  {ex.title:<64} notebooks/{ex.notebook}.ipynb")
    return 0


def _show(args):
    ex = EXERCISES[args.number]
    print(f"Ex. {ex.number}: {ex.title}\n\n{ex.statement}\nHint: {ex.hint}\n"
          f"Write (then `exercise check {ex.number} --file FILE`):\n\n{ex.template}")
    if args.solution:
        print(f"Solution\n\n{ex.proof}")
    return 0


def _check(args):
    ex = EXERCISES[args.number]
    fn = load_user_function(Path(args.file), ex.function) if args.file else None
    results = check(ex.number, fn)
    n_pass = print_results(results)
    print("" if args.file else f" (the library's solution, {ex.function})")
    return 0 if n_pass == len(results) else 1


_ACTIONS = {"list": _list, "show": _show, "check": _check}
