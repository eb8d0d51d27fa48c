"""Input checks shared by every module: a bad shape or value raises an error that names the
function, the argument, what it got and what it expected. No silent broadcasting."""
import numpy as np


def expect_shape(fn, name, array, shape, hint=""):
    """Raise ValueError unless array.shape matches `shape` (an int or None per axis, None = any).

    >>> expect_shape("rmsnorm", "g", np.ones(3), (4,), "the last axis of x")
    Traceback (most recent call last):
    ValueError: rmsnorm: g has shape (3,), expected (4,) (the last axis of x)
    """
    got = np.shape(array)
    fits = len(got) == len(shape) and all(s is None or s == g for s, g in zip(shape, got))
    if not fits:
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape)
        want += ",)" if len(shape) == 1 else ")"
        raise ValueError(f"{fn}: {name} has shape {got}, expected {want}"
                         + (f" ({hint})" if hint else ""))


def expect_ndim(fn, name, array, ndim, layout):
    """Raise ValueError unless `array` has `ndim` axes; `layout` names them, e.g. "(B, T, D)"."""
    if np.ndim(array) != ndim:
        raise ValueError(f"{fn}: {name} must have {ndim} axes {layout}, "
                         f"got shape {np.shape(array)}")


def expect_float(fn, name, array):
    """Raise TypeError unless `array` is a floating-point ndarray."""
    if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.floating):
        got = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise TypeError(f"{fn}: {name} must be a float array, got {got}")


def expect_inexact(fn, name, array):
    """Raise TypeError unless `array` is a float or complex ndarray (complex SSM arrays)."""
    if not isinstance(array, np.ndarray) or not np.issubdtype(array.dtype, np.inexact):
        got = array.dtype if isinstance(array, np.ndarray) else type(array).__name__
        raise TypeError(f"{fn}: {name} must be a float or complex array, got {got}")


def expect_int(fn, name, array):
    """Raise TypeError unless `array` holds integers (token ids, positions, indices)."""
    if not np.issubdtype(np.asarray(array).dtype, np.integer):
        raise TypeError(f"{fn}: {name} must be an integer array, got {np.asarray(array).dtype}")


def expect_positive(fn, name, value):
    """Raise ValueError unless value > 0."""
    if not value > 0:
        raise ValueError(f"{fn}: {name} must be > 0, got {value!r}")
