"""Derivation drills: retype a function by hand, then check it the way the library's own is.

    python -m scratchllm drill list                      # names, target times
    python -m scratchllm drill start rmsnorm_backward    # writes drills/rmsnorm_backward.py
    python -m scratchllm drill check rmsnorm_backward    # runs its checks, elapsed vs target

`start` writes the signature and the docstring (shapes, the formula to reach) with an empty body
and records the start time in drills/.started.json; `check` imports your function and runs the
drill's checks (gradient checks for backwards, equivalence and property tests for forwards).
The drills themselves live in bank/; the command is scratchllm/cli/drill.py.
"""
import importlib.util
import json
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
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ValueError(f"{path} line {e.lineno}: syntax error: {e.msg}") from None
    except Exception as e:  # the user's module-level code may raise anything
        raise ValueError(f"{path}: importing it raised {type(e).__name__}: {e}") from None
    if not hasattr(module, name):
        raise AttributeError(f"{path} defines no function named {name!r}")
    return getattr(module, name)


def started_at(folder, name):
    """The time `start` recorded for drill `name` in `folder`, or None."""
    path = Path(folder) / ".started.json"
    return json.loads(path.read_text()).get(name) if path.exists() else None


def start(drill, folder, force=False):
    """Write the drill's template to folder/NAME.py and record the start time; returns the
    path. FileExistsError when the file exists (unless force)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{drill.name}.py"
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists: check it, or pass --force to start over")
    path.write_text(drill.template)
    times_path = folder / ".started.json"
    started = json.loads(times_path.read_text()) if times_path.exists() else {}
    started[drill.name] = time.time()
    times_path.write_text(json.dumps(started, indent=1))
    return path
