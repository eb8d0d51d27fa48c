"""The drill of scratchllm.core: the RMSNorm backward."""
from scratchllm.core import ops
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
