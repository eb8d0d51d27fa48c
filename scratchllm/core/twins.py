"""A pair with two twins: a fused Numba kernel and the readable NumPy pair it equals.

The choice is made once, in the forward, and travels with the cache:

    SWIGLU = Twin((fused_swiglu_forward, fused_swiglu_backward),
                  (ops.swiglu_forward, ops.swiglu_backward))
    y, cache = SWIGLU.forward(x, W1, W3, W2)   # the fused twin unless SCRATCHLLM_READABLE=1
    grads = SWIGLU.backward(dy, cache)          # cache.backward: the twin that made it

so no caller asks use_fused() and no backward inspects a cache's type to find its twin.
"""
import os
from typing import Callable, NamedTuple

from scratchllm.core.fp8 import fp8_active


def use_fused():
    """The fused twins, unless the environment sets SCRATCHLLM_READABLE=1 (to step through
    the readable pairs) or FP8 matmuls are on (core.fp8.fp8_matmuls: the readable pairs'
    matmuls are the ones it quantises); read per call, so a test can switch it."""
    return os.environ.get("SCRATCHLLM_READABLE", "0") in ("", "0") and fp8_active() is None


class TwinCache(NamedTuple):
    backward: Callable  # the backward of the twin whose forward made `cache`
    cache: tuple


class Twin(NamedTuple):
    """(forward, backward) of the fused twin and of the readable twin."""
    fused: tuple
    readable: tuple

    def forward(self, *args, **kwargs):
        """The chosen twin's forward -> (out, TwinCache(its backward, its cache))."""
        forward, backward = self.fused if use_fused() else self.readable
        out, cache = forward(*args, **kwargs)
        return out, TwinCache(backward, cache)

    def backward(self, dout, cache):
        """The backward that belongs to the cache's forward."""
        return cache.backward(dout, cache.cache)
