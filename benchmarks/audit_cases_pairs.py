"""The bad-input audit's cases of the pairs and kernels: douts of another shape or dtype than
the output, kernel offsets past the data, empty and mistyped inputs."""
import numpy as np

from audit_common import ERROR, rng


# ---------------------------------------------------------------------------- douts and kernel offsets
def scan_short_dy():
    from scratchllm.ssm import selective_scan_backward, selective_scan_forward
    r, (b, T, d, N) = rng(), (1, 100_000, 4, 2)
    _, c = selective_scan_forward(r.standard_normal((b, T, d)), r.random((b, T, d)),
                                  -r.random((d, N)), r.standard_normal((b, T, N)),
                                  r.standard_normal((b, T, N)), np.ones(d))
    return selective_scan_backward(np.ones((b, 1, d)), c)


def scan_gpt2_bad_offsets():
    from scratchllm.tokenizer import fast
    data = np.frombuffer(b"hello world", np.uint8)
    return fast.scan_gpt2(data, fast.char_classes(), np.array([10 ** 9], np.int64))


def scan_gpt2_truncated_utf8():
    from scratchllm.tokenizer import fast
    data = np.frombuffer(b"ab\xf0", np.uint8)
    return fast.scan_gpt2(data, fast.char_classes(), np.array([3], np.int64))


def merge_loop_bad_words():
    from scratchllm.tokenizer.fast_train import merge_loop_numba
    sym = np.array([1, 2, 1, 2], np.int64)
    return list(merge_loop_numba(sym, np.array([10 ** 8]), np.array([4]), np.array([1]), 5))


def _pair_dy(op, dy_of):
    from scratchllm.core import ops
    x = rng().standard_normal((3, 4))
    fwd, bwd = getattr(ops, f"{op}_forward"), getattr(ops, f"{op}_backward")
    out, c = fwd(x, np.ones(4)) if op == "rmsnorm" else fwd(x)
    return bwd(dy_of(out), c)


def rmsnorm_row_dy():
    return _pair_dy("rmsnorm", lambda y: np.ones((1, 4)))


def softmax_row_dy():
    return _pair_dy("softmax", lambda y: np.ones((1, 4)))


def silu_row_dy():
    return _pair_dy("silu", lambda y: np.ones((1, 4)))


def linear_float32_dy():
    from scratchllm.core import linear_backward, linear_forward
    y, c = linear_forward(np.ones((2, 3)), np.ones((3, 5)))
    return linear_backward(y.T.copy().astype(np.float32).T, c)


def moe_transposed_dy():
    from scratchllm.moe import MoEOut, MoEWeights, moe_backward, moe_forward
    from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec
    r, (D, E, F) = rng(), (4, 3, 5)
    x = r.standard_normal((6, D))
    w = MoEWeights(r.standard_normal((D, E)), None, r.standard_normal((E, D, F)),
                   r.standard_normal((E, D, F)), r.standard_normal((E, F, D)))
    out, c = moe_forward(x, w, spec=MoESpec(RouterSpec(E, 2), ExpertsSpec(d_ff=F)))
    return moe_backward(MoEOut(np.ones((D, 6)), None, None), c)


# ---------------------------------------------------------------------------- empty and mistyped inputs
def sdpa_t0():
    from scratchllm.attention import sdpa_forward
    return sdpa_forward(np.ones((1, 1, 2, 4)), np.ones((1, 1, 0, 4)), np.ones((1, 1, 0, 4)))


def lm_t0():
    from grads.cases import lm_tiny
    from scratchllm.lm import LM
    model = LM(lm_tiny("dense"), rng=rng())
    return model.loss(np.zeros((1, 0), np.int64), np.zeros((1, 0), np.int64))


def rmsnorm_list():
    from scratchllm.core import rmsnorm_forward
    return rmsnorm_forward([[1.0, 2.0]], np.ones(2))


def rmsnorm_0d():
    from scratchllm.core import rmsnorm_forward
    return rmsnorm_forward(np.array(3.0), np.ones(1))


def embedding_list():
    from scratchllm.core import embedding_forward
    return embedding_forward([1, 2], np.ones((4, 3)))


PAIR_CASES = [
    (scan_short_dy, ERROR), (scan_gpt2_bad_offsets, ERROR), (scan_gpt2_truncated_utf8, ERROR),
    (merge_loop_bad_words, ERROR), (rmsnorm_row_dy, ERROR), (softmax_row_dy, ERROR),
    (silu_row_dy, ERROR), (linear_float32_dy, ERROR), (moe_transposed_dy, ERROR),
    (sdpa_t0, ERROR), (lm_t0, ERROR), (rmsnorm_list, ERROR), (rmsnorm_0d, ERROR),
    (embedding_list, ERROR),
]
