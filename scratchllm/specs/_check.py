"""The checks every spec runs in __post_init__: plain Python, no numpy (teach reads specs)."""
import math


class SpecError(ValueError):
    """A value a spec refuses: "Spec: msg", with .spec (the class name) and .field (the field
    the message opens with, or None) for callers that know the field by another name."""

    def __init__(self, spec, field, msg):
        super().__init__(f"{spec}: {msg}")
        self.spec, self.field, self.msg = spec, field, msg


def fail(spec, msg, field=None):
    raise SpecError(type(spec).__name__, field, msg)


def positive_int(spec, name, low=1, none_ok=False):
    """getattr(spec, name) is an int >= low (bool is not an int here), or None if none_ok."""
    v = getattr(spec, name)
    if v is None and none_ok:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        fail(spec, f"{name} must be {'None or ' if none_ok else ''}an integer >= {low}, "
                   f"got {v!r}", name)


def real(spec, name, low=None, *, open_low=False, none_ok=False):
    """getattr(spec, name) is a finite real number (> low with open_low, >= low otherwise)."""
    v = getattr(spec, name)
    if v is None and none_ok:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        fail(spec, f"{name} must be a finite number, got {v!r}", name)
    if low is not None and (v <= low if open_low else v < low):
        fail(spec, f"{name} must be {'>' if open_low else '>='} {low}, got {v!r}", name)


def one_of(spec, name, allowed):
    v = getattr(spec, name)
    if v not in allowed:
        fail(spec, f"{name} must be one of {allowed}, got {v!r}", name)


def flag(spec, name):
    if not isinstance(getattr(spec, name), bool):
        fail(spec, f"{name} must be True or False, got {getattr(spec, name)!r}", name)


def instance(spec, name, types, none_ok=False):
    v = getattr(spec, name)
    if v is None and none_ok:
        return
    if not isinstance(v, types):
        names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        fail(spec, f"{name} must be a {names}{' or None' if none_ok else ''}, got {v!r}", name)
