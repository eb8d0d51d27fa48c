"""The decorator every case module registers its cases with. grads/cases/__init__.py orders
them by topic into CASES."""
REGISTERED = {}  # name -> case function, in the order the modules were imported


def case(fn):
    """Register fn under its name."""
    if fn.__name__ in REGISTERED:
        raise ValueError(f"grads case {fn.__name__!r} is registered twice")
    REGISTERED[fn.__name__] = fn
    return fn
