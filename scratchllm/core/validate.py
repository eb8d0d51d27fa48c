"""Input checks shared by every module: a bad shape or value raises an error that names the
function, the argument, what it got and what it expected. No silent broadcasting."""
import numpy as np


def expect_shape(fn, name, array, shape, hint=""):
    """Raise ValueError unless array.shape matches `shape` (an int or None per axis, None = any).

    >>> expect_shape("rmsnorm", "g", np.ones(3), (4,), "the last axis of x")
    Traceback (most recent call last):
    ValueError: rmsnorm: g has shape (3,), expected (4,) (the last axis of x)
    """
    _expect_array(fn, name, array)
    got = array.shape
    fits = got == shape or (len(got) == len(shape) and  # equal: no per-axis walk
                            all(s is None or s == g for s, g in zip(shape, got)))
    if not fits:
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape)
        want += ",)" if len(shape) == 1 else ")"
        raise ValueError(f"{fn}: {name} has shape {got}, expected {want}"
                         + (f" ({hint})" if hint else ""))


def expect_ndim(fn, name, array, ndim, layout):
    """Raise ValueError unless `array` has `ndim` axes; `layout` names them, e.g. "(B, T, D)"."""
    _expect_array(fn, name, array)
    if array.ndim != ndim:
        raise ValueError(f"{fn}: {name} must have {ndim} axes {layout}, "
                         f"got shape {np.shape(array)}")


def _expect_array(fn, name, array):
    """TypeError unless `array` is an ndarray (a list or a number has no shape to check)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{fn}: {name} must be an ndarray, got {type(array).__name__}")


def expect_float(fn, name, array, min_ndim=0):
    """Raise TypeError unless `array` is a floating-point ndarray (ValueError unless it has at
    least `min_ndim` axes: a 0-d array has no feature axis to index)."""
    if not isinstance(array, np.ndarray) or array.dtype.kind != "f":  # np.floating's kind
        got = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise TypeError(f"{fn}: {name} must be a float array, got {got}")
    if array.ndim < min_ndim:
        raise ValueError(f"{fn}: {name} must have at least {min_ndim} axes, got shape "
                         f"{array.shape}")


def expect_inexact(fn, name, array):
    """Raise TypeError unless `array` is a float or complex ndarray (complex SSM arrays)."""
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "fc":  # np.inexact
        got = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise TypeError(f"{fn}: {name} must be a float or complex array, got {got}")


def expect_int(fn, name, array):
    """Raise TypeError unless `array` is an ndarray of integers (ids, positions, indices)."""
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iu":  # np.integer
        got = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise TypeError(f"{fn}: {name} must be an integer array, got {got}")


def expect_bool(fn, name, array):
    """Raise TypeError unless `array` is a bool ndarray (a mask: True = keep)."""
    if not isinstance(array, np.ndarray) or array.dtype != np.bool_:
        got = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise TypeError(f"{fn}: {name} must be a bool array (a mask), got {got}")


def expect_positive(fn, name, value):
    """Raise ValueError unless value > 0."""
    if not value > 0:
        raise ValueError(f"{fn}: {name} must be > 0, got {value!r}")


def expect_linear(fn, d_in, W, b=None, names=("W", "b"), d_out=None):
    """A linear map's weights under the caller's name `fn` and its argument names: W
    (d_in, Dout) (Dout = d_out when given), b (Dout,) or None. A composite checks each of its
    linears with this before computing, so an error names the function the user called.

    >>> expect_linear("relu_mlp", 4, np.ones((3, 2)), names=("W1", "b1"))
    Traceback (most recent call last):
    ValueError: relu_mlp: W1 has shape (3, 2), expected (4, *) ((Din, Dout) with Din = 4)
    """
    expect_shape(fn, names[0], W, (d_in, d_out), f"(Din, Dout) with Din = {d_in}")
    if b is not None:
        expect_shape(fn, names[1], b, (W.shape[1],), "(Dout,)")


# ---------------------------------------------------------------------------- dout, numbers
def expect_dout(fn, dout, shape, dtype, name="dout"):
    """Raise unless `dout`, the upstream gradient a backward `fn` got, has exactly the shape
    and dtype of the forward output it stands for (no broadcasting, no reshaping, no silent
    casts). A 0-d output (a loss) also takes a Python number.

    >>> expect_dout("rmsnorm_backward", np.ones((1, 4)), (3, 4), np.float64)
    Traceback (most recent call last):
    ValueError: rmsnorm_backward: dout has shape (1, 4), expected (3, 4) (the forward output's)
    """
    shape, dtype = tuple(shape), np.dtype(dtype)
    if shape == () and np.ndim(dout) == 0 and isinstance(dout, (int, float, np.number)) \
            and not isinstance(dout, bool):
        return
    if not isinstance(dout, np.ndarray):
        raise TypeError(f"{fn}: {name} must be an ndarray of shape {shape} and dtype {dtype} "
                        f"(the forward output's), got {type(dout).__name__}")
    if dout.shape != shape:
        raise ValueError(f"{fn}: {name} has shape {dout.shape}, expected {shape} (the forward "
                         f"output's)")
    if dout.dtype != dtype and not (shape == () and np.issubdtype(dout.dtype, np.floating)):
        raise TypeError(f"{fn}: {name} has dtype {dout.dtype}, expected {dtype} (the forward "
                        f"output's)")


def expect_douts(fn, dout, specs):
    """The dout of a backward whose forward returns a NamedTuple: a tuple with one entry per
    output, in order. specs = {output name: (shape, dtype), or None for an output that takes
    no gradient (indices)}; an entry may be None (no gradient) and is otherwise checked by
    expect_dout as `dout.<name>`."""
    if not isinstance(dout, tuple) or len(dout) != len(specs):
        raise TypeError(f"{fn}: dout must be a tuple ({', '.join(specs)}) like the forward's "
                        f"output, got {type(dout).__name__} of length {_len(dout)}")
    for (name, spec), d in zip(specs.items(), dout):
        if d is None:
            continue
        if spec is None:
            raise TypeError(f"{fn}: dout.{name} must be None ({name} takes no gradient), got "
                            f"{type(d).__name__}")
        expect_dout(fn, d, *spec, name=f"dout.{name}")


def _len(x):
    return len(x) if hasattr(x, "__len__") else "-"


def expect_integer(fn, name, value, low=None, high=None):
    """Raise unless `value` is an integer (not a bool, not a float) in [low, high] (None: no
    bound); returns it as an int. For counts, sizes, steps, seeds and indices."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{fn}: {name} must be an integer, got {type(value).__name__} "
                        f"{value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        want = (f">= {low}" if high is None else f"<= {high}" if low is None
                else f"in [{low}, {high}]")
        raise ValueError(f"{fn}: {name} must be {want}, got {value}")
    return int(value)


def expect_finite(fn, name, value, low=None, high=None, *, open_low=False):
    """Raise unless the hyperparameter `value` is a finite real number in [low, high] (or
    (low, high] with open_low); returns it as a float. inf and NaN are always refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(value).__name__} "
                        f"{value!r}")
    v = float(value)
    below = low is not None and (v <= low if open_low else v < low)
    if not np.isfinite(v) or below or (high is not None and v > high):
        raise ValueError(f"{fn}: {name} must be a finite number{_bounds(low, high, open_low)}, "
                         f"got {value!r}")
    return v


def _bounds(low, high, open_low):
    """' > 0', ' >= 0', ' <= 1', ' in [0, 1]', ' in (0, 1]' or '' for the error message."""
    if low is None:
        return "" if high is None else f" <= {high}"
    if high is None:
        return f" {'>' if open_low else '>='} {low}"
    return f" in {'(' if open_low else '['}{low}, {high}]"


def expect_all_finite(fn, name, array):
    """Raise ValueError unless every entry of `array` is finite (no NaN, no inf)."""
    bad = ~np.isfinite(array)
    if bad.any():
        raise ValueError(f"{fn}: {name} has {int(bad.sum())} non-finite entries (NaN or inf) "
                         f"of {np.size(array)}, first at index "
                         f"{tuple(int(i) for i in np.argwhere(bad)[0])}")


def expect_gated_ffn(fn, x, W1, W3, W2):
    """The shapes of a gated FFN (SwiGLU, GeGLU): x float (..., D), W1 and W3 (D, F),
    W2 (F, D); ValueError/TypeError naming `fn` and the argument."""
    expect_float(fn, "x", x, 1)
    D = x.shape[-1]
    expect_shape(fn, "W1", W1, (D, None), "(D, F)")
    expect_shape(fn, "W3", W3, W1.shape, "(D, F), like W1")
    expect_shape(fn, "W2", W2, (W1.shape[1], D), "(F, D)")


def expect_instance(fn, name, value, kind):
    """Raise TypeError unless `value` is a `kind` (a spec, a layer's weights NamedTuple).

    >>> expect_instance("moe", "spec", "softmax", tuple)
    Traceback (most recent call last):
    TypeError: moe: spec must be a tuple, got str
    """
    if not isinstance(value, kind):
        raise TypeError(f"{fn}: {name} must be a {kind.__name__}, got {type(value).__name__}")


def common_float(*items):
    """The library's one rule for mixed float dtypes: a pair computes in the common dtype of
    its differentiable inputs, NumPy's result_type (float32 with float64 gives float64). Returns
    `items` (arrays, None, or NamedTuples of arrays such as a layer's weights) with every float
    array cast to that dtype (unchanged, not copied, where it has it already). Anything else
    (ints, bools, lists) passes through for the checks that follow to name.

    >>> x, w = common_float(np.ones(2, np.float32), np.ones(2))
    >>> x.dtype, w.dtype
    (dtype('float64'), dtype('float64'))
    """
    floats = [a for item in items for a in _leaves(item)
              if isinstance(a, np.ndarray) and a.dtype.kind == "f"]
    if not floats:
        return items
    dtype = np.result_type(*floats)
    return tuple(_cast(item, dtype) for item in items)


def _leaves(item):
    return item if isinstance(item, tuple) and hasattr(item, "_fields") else (item,)


def _cast(item, dtype):
    if isinstance(item, tuple) and hasattr(item, "_fields"):
        return type(item)(*(_cast(a, dtype) for a in item))
    if isinstance(item, np.ndarray) and item.dtype.kind == "f":
        return item.astype(dtype, copy=False)
    return item
