"""Derivation drills: retype a function by hand, then check it the way the library's own is.

    python -m scratchllm drill list                      # names, target times
    python -m scratchllm drill start rmsnorm_backward    # writes drills/rmsnorm_backward.py
    python -m scratchllm drill check rmsnorm_backward    # runs its checks, elapsed vs target

`start` writes the signature and the docstring (shapes, the formula to reach) with an empty body
and records the start time in drills/.started.json; `check` imports your function and runs the
drill's checks (gradient checks for backwards, equivalence and property tests for forwards).
The drills themselves live in scratchllm/drill_bank.py.
"""
import argparse
import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple


class Result(NamedTuple):
    """One check of a drill: its name, whether it passed, and what it saw."""
    name: str
    passed: bool
    detail: str


@dataclass(frozen=True)
class Drill:
    """A function to retype: `template` is the file `start` writes (signature, docstring, empty
    body); `checks` maps (name, fn(user_function) -> detail str or raises AssertionError);
    `solution` is the library's own implementation in the drill's signature."""
    name: str
    minutes: int
    source: str
    template: str
    checks: tuple
    solution: Callable


def run_checks(drill, fn):
    """Run every check of `drill` on `fn`; an exception (an empty body too) fails that check."""
    results = []
    for name, check in drill.checks:
        try:
            results.append(Result(name, True, check(fn) or ""))
        except Exception as e:  # a user's body may raise anything: report it, keep going
            results.append(Result(name, False, f"{type(e).__name__}: {e}"[:300]))
    return results


def load_user_function(path, name):
    """Import `name` from the file at `path` (the user's drill file)."""
    if not path.exists():
        raise FileNotFoundError(f"drill file {path} not found: run `python -m scratchllm drill "
                                f"start {name}` first")
    spec = importlib.util.spec_from_file_location(f"drill_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, name):
        raise AttributeError(f"{path} defines no function named {name!r}")
    return getattr(module, name)


def _clock(seconds):
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def _started(folder):
    path = folder / ".started.json"
    return json.loads(path.read_text()) if path.exists() else {}


def cmd_list(drills):
    for d in drills.values():
        print(f"{d.name:<26} {d.minutes:>3} min   {d.source}")
    return 0


def cmd_start(drill, folder, force):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{drill.name}.py"
    if path.exists() and not force:
        print(f"{path} exists: check it, or pass --force to start over", file=sys.stderr)
        return 1
    path.write_text(drill.template)
    started = _started(folder)
    started[drill.name] = time.time()
    (folder / ".started.json").write_text(json.dumps(started, indent=1))
    print(f"wrote {path}; target {drill.minutes} min. When done: "
          f"python -m scratchllm drill check {drill.name}")
    return 0


def cmd_check(drill, folder):
    fn = load_user_function(folder / f"{drill.name}.py", drill.name)
    results = run_checks(drill, fn)
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'}  {r.name}" + (f"  ({r.detail})" if r.detail else ""))
    n_pass = sum(r.passed for r in results)
    print(f"\n{n_pass}/{len(results)} checks pass", end="")
    start = _started(folder).get(drill.name)
    if start is not None:
        elapsed = time.time() - start
        verdict = "within" if elapsed <= drill.minutes * 60 else "over"
        print(f"; {_clock(elapsed)} elapsed, target {drill.minutes}:00 ({verdict} target)", end="")
    print()
    return 0 if n_pass == len(results) else 1


def main(argv=None):
    from scratchllm.drill_bank import DRILLS
    parser = argparse.ArgumentParser(prog="python -m scratchllm drill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["list", "start", "check"])
    parser.add_argument("name", nargs="?", help="the drill (see `list`)")
    parser.add_argument("--dir", default="drills", help="folder of drill files (default: drills)")
    parser.add_argument("--force", action="store_true", help="start: overwrite an existing file")
    args = parser.parse_args(argv)
    if args.action == "list":
        return cmd_list(DRILLS)
    if args.name not in DRILLS:
        parser.error(f"{args.action} needs a drill name, one of: {', '.join(DRILLS)}; "
                     f"got {args.name!r}")
    drill, folder = DRILLS[args.name], Path(args.dir)
    return cmd_start(drill, folder, args.force) if args.action == "start" else cmd_check(drill, folder)
