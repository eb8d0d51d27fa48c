"""What every drill module uses: the registry decorator, a seeded rng, the gradient check of a
user's backward against the library's forward, assert_close and causal_check."""
import textwrap

import numpy as np

import grads
from scratchllm.teach.drills.core import Drill

REGISTERED = {}  # name -> Drill, in the order the modules were imported


def drill(name, minutes, source, template, checks):
    """Register the drill `name`; the decorated function is its solution. A solution is
    private (`_name`): `name` is the library's own function, defined once, in the library."""
    def register(solution):
        body = textwrap.dedent(template).strip("\n") + "\n    raise NotImplementedError\n"
        REGISTERED[name] = Drill(name, minutes, source, "import numpy as np\n\n\n" + body,
                             tuple(checks), solution)
        return solution
    return register


def seeded_rng(seed=0):
    return np.random.default_rng(seed)


def gradient_check(forward, grads_of, names, **inputs):
    """grads.check of the library forward against the user's backward; raises unless ok.

    grads_of(dout, inputs) -> tuple of gradients in the order of `names`."""
    def forward_keeping_inputs(**kw):
        return forward(**kw)[0], kw

    def backward(dout, kw):
        return dict(zip(names, _as_tuple(grads_of(dout, kw))))

    report = grads.check(forward_keeping_inputs, backward, rng=seeded_rng(1), wrt=names, **inputs)
    if not report.ok:
        raise AssertionError("\n" + str(report))
    return f"max rel err {max(r.max_rel_err for r in report.rows):.1e}"


def _as_tuple(value):
    return value if isinstance(value, tuple) else (value,)


def assert_close(got, want, tol=1e-10, what="result"):
    """Raise AssertionError unless got matches want (shapes and values, relative tol)."""
    got = np.asarray(got)
    if got.shape != np.shape(want):
        raise AssertionError(f"{what} has shape {got.shape}, expected {np.shape(want)}")
    err = grads.relative_error(got, want)
    if not err < tol:
        raise AssertionError(f"{what} differs from the reference: rel err {err:.2e}")
    return f"rel err {err:.1e}"


def causal_check(fn, inp, t):
    """fn(**inp) -> (B, T, ...): changing x at time t changes outputs t.. and none before."""
    y = fn(**inp)
    inp = dict(inp, x=inp["x"].copy())
    inp["x"][:, t] += 1.0
    y2 = fn(**inp)
    assert_close(y2[:, :t], y[:, :t], tol=1e-12, what=f"outputs before the changed x_{t}")
    if np.allclose(y2[:, t:], y[:, t:]):
        raise AssertionError(f"changing x_{t} did not change the outputs from {t} on")
    return "ok"
