"""The optimizer step's fused Numba kernels, each with its readable twin: the clip's sum of
squares and AdamW's update of one parameter (core/optim.py runs them; SCRATCHLLM_READABLE=1
runs the twins).

    sum_squares:  sum(a^2) accumulated in float64 registers (core/fused_sums.py's lanes)
    adamw:        torch.optim.AdamW's single-tensor update, every scalar rounded to the dtype
        p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);  v = v b2 + (1 - b2) g g
        p += -lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

tests/core/test_fused.py checks each against its twin and AdamW against torch's float32 steps
(tests/fixtures/adamw_torch_float32.npz). The kernels release the GIL (nogil): AdamW updates
whole Params on several threads at once.
"""
import math
from typing import NamedTuple

import numpy as np
from numba import njit

from scratchllm.core.fused_sums import dot64_exact


@njit(cache=True, nogil=True)
def _sum_squares_flat(a):
    return dot64_exact(a, a)  # float64 squares, summed in lanes (fused_sums)


def sum_squares(a):
    """sum(a^2) accumulated in float64 in one pass, without a float64 copy of a."""
    return float(_sum_squares_flat(np.ascontiguousarray(a).reshape(-1)))


def sum_squares_ref(a):
    """sum(a^2) in float64, readable: a float64 copy, squared, summed (pairwise)."""
    return float(np.sum(a.astype(np.float64) ** 2))


@njit(cache=True, nogil=True, error_model="numpy")
def _adamw_flat(p, g, m, v, decay, w1, b2, w2, neg_step, bc2_sqrt, eps):
    for i in range(p.size):
        m[i] = np.float64(w1) * (g[i] - m[i]) + m[i]  # fma(w1, g - m, m): torch's lerp
        vb = v[i] * b2
        v[i] = np.float64(w2 * g[i]) * g[i] + vb  # fma(w2 g, g, v b2): torch's addcmul
        p[i] = p[i] * decay + neg_step * m[i] / (np.sqrt(v[i]) / bc2_sqrt + eps)


class AdamWStep(NamedTuple):
    """The numbers of one AdamW step: lr, (beta1, beta2), eps, weight decay, step t >= 1."""
    lr: float
    betas: tuple
    eps: float
    weight_decay: float
    step: int


def adamw_scalars(dtype, hp):
    """The update's scalars, each rounded to dtype as torch does with Python numbers."""
    lr, (b1, b2), eps, weight_decay, step = hp
    values = (1 - lr * weight_decay, 1 - b1, b2, 1 - b2, -lr / (1 - b1 ** step),
              math.sqrt(1 - b2 ** step), eps)
    return tuple(dtype.type(s) for s in values)


def adamw_update(p, grad, m, v, hp):
    """One AdamW step of one parameter, in place, in one pass: p, m, v (any shape,
    C-contiguous, one dtype) from grad, with the step's numbers hp (an AdamWStep)."""
    for name, a in (("p", p), ("grad", grad), ("m", m), ("v", v)):
        if not a.flags.c_contiguous or a.dtype != p.dtype or a.shape != p.shape:
            raise ValueError(f"adamw_update: {name} must be C-contiguous {p.dtype} of shape "
                             f"{p.shape} (updated in place), got {a.dtype} {a.shape}, "
                             f"contiguous={a.flags.c_contiguous}")
    decay, w1, b2, w2, neg_step, bc2_sqrt, e = adamw_scalars(p.dtype, hp)
    _adamw_flat(p.reshape(-1), grad.reshape(-1), m.reshape(-1), v.reshape(-1), decay, w1, b2,
                w2, neg_step, bc2_sqrt, e)


def adamw_params(flat, which, group, scalars, scale=None):
    """adamw_update of the Params `which` (indices into flat: per Param its flat C-contiguous
    (p, grad, m, v) of one dtype, checked by the caller), Param j with the adamw_scalars
    scalars[group[j]]; scale (in that dtype), or None: each grad multiplied by it first, in
    place."""
    for j in which:
        p, g, m, v = flat[j]
        if scale is not None:
            g *= scale  # in g's dtype, as `p.grad *= s` rounds a Python float s to it
        _adamw_flat(p, g, m, v, *scalars[group[j]])


def adamw_update_ref(p, grad, m, v, hp):
    """adamw_update as torch.optim.AdamW's single-tensor update writes it:
        p *= 1 - lr wd;  m = lerp(m, g, 1 - b1);  v = v b2 + (1 - b2) g g
        p += -lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
    torch's CPU kernels fuse two of these into multiply-adds (lerp = fma(w, g - m, m),
    addcmul = fma(w g, g, v)); a float32 product is exact in float64, so the float64 lines
    below round like an fma. (torch's vectorised float32 sqrt is not IEEE-rounded: it is
    1 ulp off on some entries, so p can differ from torch's by an ulp; m and v match.)
    Reference: pytorch/pytorch torch/optim/adam.py; Loshchilov & Hutter 2019
    (arXiv 1711.05101)."""
    decay, w1, b2, w2, neg_step, bc2_sqrt, e = adamw_scalars(p.dtype, hp)
    p *= decay
    m[...] = np.float64(w1) * (grad - m) + m  # lerp(m, g, w1) for w1 < 0.5, as an fma
    v *= b2
    v[...] = (w2 * grad).astype(np.float64) * grad + v  # addcmul, as an fma
    p += neg_step * m / (np.sqrt(v) / bc2_sqrt + e)
