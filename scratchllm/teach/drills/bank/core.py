"""The drills of scratchllm.core: the RMSNorm backward, the InfoNCE backward."""
import numpy as np

from scratchllm.core import contrastive, ops
from scratchllm.teach.drills.bank._common import assert_close, drill, gradient_check, seeded_rng


# ---------------------------------------------------------------------------- rmsnorm
def _rmsnorm_inputs():
    r = seeded_rng(2)
    return dict(x=r.standard_normal((3, 7)), g=r.standard_normal(7), eps=1e-5)


@drill("rmsnorm_backward", 5, "scratchllm/core/ops.py", '''
    def rmsnorm_backward(dy, x, g, eps=1e-5):
        """Backward of y = x * r * g with r = (mean(x^2) + eps)^-1/2 over the last axis.

        dy, x (N, D); g (D,).  Return (dx (N, D), dg (D,)).
        Reach: xhat = x r;  dg = sum_rows(dy * xhat);
               dx = r * (dy g - xhat * mean(dy g * xhat))
        """
''', [
    ("gradient check (float64, < 1e-7)", lambda fn: gradient_check(
        ops.rmsnorm_forward, lambda d, kw: fn(d, **kw), ["x", "g"], **_rmsnorm_inputs())),
    ("equals scratchllm.core.ops.rmsnorm_backward", lambda fn: _rmsnorm_vs_library(fn)),
])
def _rmsnorm_backward(dy, x, g, eps=1e-5):
    grads_ = ops.rmsnorm_backward(dy, ops.rmsnorm_forward(x, g, eps)[1])
    return grads_["x"], grads_["g"]


def _rmsnorm_vs_library(fn):
    inp = _rmsnorm_inputs()
    dy = seeded_rng(3).standard_normal(inp["x"].shape)
    dx, dg = fn(dy, **inp)
    want = ops.rmsnorm_backward(dy, ops.rmsnorm_forward(**inp)[1])
    assert_close(dg, want["g"], what="dg")
    return assert_close(dx, want["x"], what="dx")


# ---------------------------------------------------------------------------- info_nce
def _nce_inputs():
    r = seeded_rng(4)
    return dict(q=r.standard_normal((5, 6)), k=r.standard_normal((5, 6)), temperature=0.5)


@drill("info_nce_backward", 10, "scratchllm/core/contrastive.py", '''
    def info_nce_backward(dloss, q, k, temperature):
        """Backward of InfoNCE with in-batch negatives: S = q k^T / temperature (B, B),
        L = mean_i cross_entropy(S_i, target i) (row i of k is the positive of row i of q).

        dloss a number; q, k (B, D).  Return (dq (B, D), dk (B, D)).
        Reach: dS = dloss (softmax(S) - I) / B;  dq = dS k / temperature;
               dk = dS^T q / temperature
        """
''', [
    ("gradient check (float64, < 1e-7)", lambda fn: gradient_check(
        contrastive.info_nce_forward, lambda d, kw: fn(d, **kw), ["q", "k"], **_nce_inputs())),
    ("a shift of every key leaves L unchanged: sum_j dk_j = 0", lambda fn: _nce_shift(fn)),
])
def _info_nce_backward(dloss, q, k, temperature):
    g = contrastive.info_nce_backward(np.float64(dloss), contrastive.info_nce_forward(
        q, k, temperature=temperature)[1])
    return g["q"], g["k"]


def _nce_shift(fn):
    """Adding one vector c to every row of k shifts each row of S by q_i c / tau: the loss
    does not change, so <dk summed over rows, c> = 0 for every c, i.e. sum_j dk_j = 0."""
    dq, dk = fn(1.0, **_nce_inputs())
    total = np.abs(np.asarray(dk).sum(axis=0)).max()
    if not total < 1e-12 * max(np.abs(dk).max(), 1e-300):
        raise AssertionError(f"sum_j dk_j should be 0 (rows of dS sum to 0), got max {total:.2e}")
    return f"|sum_j dk_j| {total:.1e}"
