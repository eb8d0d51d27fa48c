"""The generic gradient checker: one function that tests any forward/backward pair by name.

    out, cache = forward(**inputs)
    dout       = random, same structure as out          (never all ones: that hides errors)
    L(inputs)  = sum_i sum(out_i * dout_i)              (a scalar whose gradient is backward's)
    analytic   = backward(dout, cache)[name]
    numeric    = (L(x + h e) - L(x - h e)) / 2h         (central differences)

Small inputs are checked element by element; an input with more than `max_full` elements is
checked along `n_directions` random unit directions u, comparing (L(x+hu) - L(x-hu)) / 2h with
<analytic, u>, so a 10^5-element weight costs a handful of forward calls.

    rel err = max|a - n| / max(max|a|, max|n|, 1e-12)        pass below 1e-7 (float64)

When an input fails, the checker looks again at step h/10 and at the one-sided differences.
If the estimates disagree with each other the function is not smooth inside the step (a ReLU
kink, a top-k tie, a capacity boundary): the status is `kink`, not `FAIL`.
It also fails the check when forward or backward mutated an input or `dout`.

An input that is a NamedTuple of arrays (one layer's weights, e.g. `w = AttentionWeights(wq,
wk, ...)`) is checked field by field, as inputs named "w.wq", "w.wk", ...: its backward returns
a NamedTuple of the same type for it, with None exactly where the input's field is None.
"""
from dataclasses import dataclass, field

import numpy as np

TOLERANCE = 1e-7


@dataclass
class Row:
    """One checked input: how many elements (or directions), the worst error, the verdict."""
    input: str
    checked: str
    max_rel_err: float
    status: str  # "ok" | "kink" | "FAIL"


@dataclass
class Report:
    """The rows of one check; prints as a table, `.ok` is True when every row is `ok`."""
    rows: list = field(default_factory=list)
    label: str = ""

    @property
    def ok(self):
        return bool(self.rows) and all(r.status == "ok" for r in self.rows)

    @property
    def failed(self):
        return any(r.status == "FAIL" for r in self.rows)

    def __str__(self):
        return format_table([("" if not self.label else self.label, r) for r in self.rows])


def format_table(labelled_rows):
    """Render (label, Row) pairs as an aligned text table."""
    header = ("component", "input", "checked", "max rel err", "status")
    lines = [(label, r.input, r.checked, _fmt_err(r.max_rel_err), r.status)
             for label, r in labelled_rows]
    if not any(label for label, _ in labelled_rows):
        header, lines = header[1:], [line[1:] for line in lines]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(fmt.format(*row) for row in [header, *lines])


def _fmt_err(err):
    return "-" if np.isnan(err) else f"{err:.2e}"


def relative_error(a, n):
    """max|a - n| / max(max|a|, max|n|, 1e-12)."""
    a, n = np.asarray(a, dtype=np.float64), np.asarray(n, dtype=np.float64)
    scale = max(np.max(np.abs(a), initial=0.0), np.max(np.abs(n), initial=0.0), 1e-12)
    return float(np.max(np.abs(a - n), initial=0.0) / scale)


def check(forward, backward, *, rng=None, wrt=None, label="", fd_step=1e-5, n_directions=4,
          max_full=2000, **inputs):
    """Check backward(dout, cache)[name] against central differences for every input in `wrt`.

    Inputs: forward, backward: the pair; **inputs: forward's keyword arguments (float64 arrays
            are differentiated, everything else is passed through unchanged);
            wrt: names to check (default: every float array input); rng: np.random.Generator
            for dout and the directions; fd_step: h; max_full: inputs larger than this are
            checked along n_directions random unit directions.
    Returns: Report (rows: input, elements checked, max rel err, status).
    Raises:  TypeError for a non-float64 input in wrt, or a backward that misses a key or
             returns a gradient of the wrong shape.
    """
    rng = np.random.default_rng(0) if rng is None else rng
    groups = {k: v for k, v in inputs.items() if _is_weights(v)}
    if groups:  # check the NamedTuples' fields as inputs of their own ("w.wq", ...)
        flat = _flat_inputs(inputs, groups)
        if wrt is not None:  # a NamedTuple's name stands for its array fields
            wrt = [f for n in wrt for f in ([f for f in flat if f.startswith(n + ".")]
                                            if n in groups else [n])]
        return check(_flat_forward(forward, groups), _flat_backward(backward, groups), rng=rng,
                     wrt=wrt, label=label, fd_step=fd_step, n_directions=n_directions,
                     max_full=max_full, **flat)
    names = _names_to_check(inputs, wrt)
    originals = {k: np.copy(v) for k, v in inputs.items() if isinstance(v, np.ndarray)}
    out, cache = forward(**inputs)
    dout = _random_like(out, rng)
    dout_copy = _copy_tree(dout)
    grads = backward(dout, cache)
    report = Report(label=label)
    report.rows += _purity_rows(inputs, originals, dout, dout_copy)
    for name in names:
        analytic = _gradient_for(grads, name, inputs[name])
        report.rows.append(_check_input(forward, inputs, name, analytic, dout, rng,
                                        fd_step, n_directions, max_full))
    return report


def _is_weights(value):
    """A NamedTuple of arrays (the weights of one layer): every field an array or None, one
    at least a float array. (A NamedTuple of sizes or options passes through unchanged.)"""
    return (isinstance(value, tuple) and hasattr(value, "_fields")
            and all(a is None or isinstance(a, np.ndarray) for a in value)
            and any(isinstance(a, np.ndarray) and _is_float(a) for a in value))


def _flat_inputs(inputs, groups):
    """inputs with each NamedTuple w replaced by its array fields "w.<field>"."""
    flat = {k: v for k, v in inputs.items() if k not in groups}
    for k, w in groups.items():
        flat.update({f"{k}.{f}": a for f, a in zip(w._fields, w) if a is not None})
    return flat


def _flat_forward(forward, groups):
    """forward over the flat inputs: each NamedTuple rebuilt from its fields."""
    def flat_forward(**flat):
        args = {k: v for k, v in flat.items() if "." not in k}
        for k, w in groups.items():
            args[k] = w._replace(**{f: flat[f"{k}.{f}"] for f in w._fields
                                    if f"{k}.{f}" in flat})
        return forward(**args)
    return flat_forward


def _flat_backward(backward, groups):
    """backward with each NamedTuple gradient spread into "w.<field>" entries; a gradient of
    another type, or one whose None fields differ from the input's, is a TypeError."""
    def flat_backward(dout, cache):
        grads = backward(dout, cache)
        flat = {k: v for k, v in grads.items() if k not in groups}
        for k, w in groups.items():
            g = grads.get(k)
            if type(g) is not type(w):
                raise TypeError(f"grads.check: the gradient for input '{k}' must be a "
                                f"{type(w).__name__} like the input, got {type(g).__name__}")
            for f, a, da in zip(w._fields, w, g):
                if (a is None) != (da is None):
                    raise TypeError(f"grads.check: gradient field '{k}.{f}' is "
                                    f"{'None' if da is None else 'an array'}, but the input's "
                                    f"field is {'None' if a is None else 'an array'}")
                if da is not None:
                    flat[f"{k}.{f}"] = da
        return flat
    return flat_backward


def _names_to_check(inputs, wrt):
    floats = [k for k, v in inputs.items()
              if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating)]
    names = floats if wrt is None else list(wrt)
    for name in names:
        value = inputs.get(name)
        if not isinstance(value, np.ndarray) or value.dtype != np.float64:
            got = type(value).__name__ if not isinstance(value, np.ndarray) else value.dtype
            raise TypeError(f"grads.check: input '{name}' must be a float64 array to be "
                            f"checked, got {got}")
    return names


def _gradient_for(grads, name, value):
    if not isinstance(grads, dict) or name not in grads:
        keys = sorted(grads) if isinstance(grads, dict) else type(grads).__name__
        raise TypeError(f"grads.check: backward returned no gradient for input '{name}' "
                        f"(it returned {keys})")
    g = np.asarray(grads[name])
    if g.shape != value.shape:
        raise TypeError(f"grads.check: gradient for input '{name}' has shape {g.shape}, "
                        f"expected {value.shape} (the shape of '{name}')")
    return g


def _check_input(forward, inputs, name, analytic, dout, rng, h, n_directions, max_full):
    """Compare analytic with numeric derivatives of L along unit vectors or random directions."""
    x = inputs[name]
    if x.size <= max_full:
        directions = _unit_vectors(x.shape)
        checked = str(x.size)
    else:
        directions = _random_directions(x.shape, n_directions, rng)
        checked = f"{n_directions} dirs"
    a = np.array([np.vdot(analytic, u) for u in directions])
    n_h = _numeric(forward, inputs, name, dout, directions, h)
    err = relative_error(a, n_h)
    if err < TOLERANCE:
        return Row(name, checked, err, "ok")
    smooth = _looks_smooth(forward, inputs, name, dout, directions, h, n_h)
    return Row(name, checked, err, "FAIL" if smooth else "kink")


def _looks_smooth(forward, inputs, name, dout, directions, h, n_h):
    """Estimates at h and h/10 agree, and the left/right slopes close linearly with the step."""
    n_h10 = _numeric(forward, inputs, name, dout, directions, h / 10)
    if relative_error(n_h, n_h10) > TOLERANCE:
        return False
    f0 = _loss(forward, inputs, dout)
    jumps = [_one_sided_gap(forward, inputs, name, dout, u, step, f0)
             for u in directions for step in (h, h / 10)]
    gap_h, gap_h10 = np.abs(jumps[0::2]), np.abs(jumps[1::2])
    scale = max(np.max(np.abs(n_h)), 1e-12)
    kinked = (gap_h10 > 0.5 * gap_h) & (gap_h10 > 1e-3 * scale)
    return not kinked.any()


def _one_sided_gap(forward, inputs, name, dout, u, step, f0):
    """(right slope) - (left slope) at this step: ~ step * f'' when smooth, the jump at a kink."""
    plus = _loss(forward, _shifted(inputs, name, u, step), dout)
    minus = _loss(forward, _shifted(inputs, name, u, -step), dout)
    return (plus - 2.0 * f0 + minus) / step


def _numeric(forward, inputs, name, dout, directions, h):
    return np.array([(_loss(forward, _shifted(inputs, name, u, h), dout)
                      - _loss(forward, _shifted(inputs, name, u, -h), dout)) / (2 * h)
                     for u in directions])


def _shifted(inputs, name, u, step):
    moved = dict(inputs)
    moved[name] = inputs[name] + step * u
    return moved


def _loss(forward, inputs, dout):
    out, _ = forward(**inputs)
    return sum(float(np.sum(o * d)) for o, d in zip(_leaves(out), _leaves(dout))
               if d is not None)


def _unit_vectors(shape):
    size = int(np.prod(shape))
    return list(np.eye(size).reshape(size, *shape))


def _random_directions(shape, n, rng):
    dirs = []
    for _ in range(n):
        u = rng.standard_normal(shape)
        dirs.append(u / np.linalg.norm(u))
    return dirs


def _leaves(tree):
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _leaves(item)]
    return [tree]


def _random_like(out, rng):
    """A random upstream gradient with the structure of out; None for non-float outputs."""
    if isinstance(out, (tuple, list)):
        return tuple(_random_like(o, rng) for o in out)
    arr = np.asarray(out) if out is not None else None
    if arr is None or not np.issubdtype(arr.dtype, np.floating):
        return None
    return np.asarray(rng.standard_normal(arr.shape), dtype=arr.dtype)


def _copy_tree(tree):
    if isinstance(tree, tuple):
        return tuple(_copy_tree(t) for t in tree)
    return None if tree is None else np.copy(tree)


def _purity_rows(inputs, originals, dout, dout_copy):
    rows = []
    for name, before in originals.items():
        if not np.array_equal(inputs[name], before, equal_nan=_is_float(before)):
            rows.append(Row(f"{name} (mutated)", "-", float("nan"), "FAIL"))
    for d, before in zip(_leaves(dout), _leaves(dout_copy)):
        if d is not None and not np.array_equal(d, before, equal_nan=True):
            rows.append(Row("dout (mutated)", "-", float("nan"), "FAIL"))
            break
    return rows


def _is_float(a):
    return np.issubdtype(a.dtype, np.floating)
