"""Frozen weights: inside `with frozen_weights(arrays):` the linear pair's backward skips the
weight gradient x^T dy of those arrays (it gives zeros: nothing trains them) and still gives
dx, which the layers below need. LoRA fine-tuning (train/lora.py) freezes every projection
but its targets this way: the model's own backward then costs what it must.

The arrays are matched by identity (the Param's .data a Module hands its pair); a weight
reached through a copy (a cast to another dtype) is not matched and gets its gradient as
usual, so the context can only save work, never change a gradient that is used.
"""
from contextlib import contextmanager
from contextvars import ContextVar

_FROZEN = ContextVar("scratchllm_frozen_weights", default=frozenset())


@contextmanager
def frozen_weights(arrays):
    """Inside the block, linear_backward gives zeros for the weight gradient of these arrays
    (matched by identity) instead of computing x^T dy."""
    token = _FROZEN.set(frozenset(id(a) for a in arrays))
    try:
        yield
    finally:
        _FROZEN.reset(token)


def is_frozen(W):
    """Whether W is one of the arrays of the innermost frozen_weights block."""
    frozen = _FROZEN.get()
    return bool(frozen) and id(W) in frozen
