"""The exercise registry: an Exercise is a statement, a hint, a worked proof and a checked
solution; `exercise(...)` registers one (the decorated function is its solution), `check` runs
its checks with the drills' runner (each returns a detail string or raises AssertionError).
"""
import ast
from dataclasses import dataclass
from typing import Callable

import numpy as np

from scratchllm.teach.drills.core import run_checks

EXERCISES = {}


@dataclass(frozen=True)
class Exercise:
    """`function` names what a learner writes (its signature and docstring: `template`);
    `checks` as in a Drill; `solution` the checked answer; `proof` the worked solution."""
    number: int
    title: str
    notebook: str
    statement: str
    hint: str
    proof: str
    function: str
    template: str
    checks: tuple
    solution: Callable


def exercise(number, title, notebook, statement, hint, proof, template, checks):
    """Register an exercise; the decorated function is its checked solution, private (the
    function the template defines may be a library name: that one is defined in the library)."""
    def register(solution):
        function = ast.parse(_text(template)).body[0].name
        EXERCISES[number] = Exercise(number, title, notebook, _text(statement), _text(hint),
                                     _text(proof), function, _text(template), tuple(checks),
                                     solution)
        return solution
    return register


def _text(s):
    lines = s.strip("\n").splitlines()
    indent = min(len(l) - len(l.lstrip()) for l in lines if l.strip())
    return "\n".join(l[indent:] for l in lines) + "\n"


def check(number, fn=None):
    """[Result] of exercise `number`'s checks on fn (default: its solution)."""
    ex = EXERCISES[number]
    return run_checks(ex, ex.solution if fn is None else fn)


def rng(seed):
    return np.random.default_rng(seed)
