"""The bad-input audit's cases at the extremes of floating point: overflow and underflow in
float16, float32 and float64, where the right answer is a finite value."""
import numpy as np

from audit_common import ERROR, rng


# ---------------------------------------------------------------------------- overflow and underflow
def rmsnorm_float32_1e20():
    from scratchllm.core import rmsnorm_forward
    y, _ = rmsnorm_forward(np.full((1, 4), 1e20, np.float32), np.ones(4, np.float32))
    return y  # right answer: ones


def rmsnorm_float16_300():
    from scratchllm.core import rmsnorm_forward
    y, _ = rmsnorm_forward(np.full((1, 4), 300, np.float16), np.ones(4, np.float16))
    return y  # right answer: ones


def softmax_float16_vocab():
    from scratchllm.core import softmax_forward
    y, _ = softmax_forward(np.zeros((1, 128_256), np.float16))
    return float(y.astype(np.float64).sum())  # right answer: 1


def ce_float16_65536():
    from scratchllm.core import cross_entropy_forward
    loss, _ = cross_entropy_forward(np.zeros((2, 65_536), np.float16), np.array([0, 1]))
    return float(loss)  # right answer: ln 65536 = 11.09


def zoh_huge_delta():
    from scratchllm.ssm import zoh_forward
    out, _ = zoh_forward(np.array([-2.0]), np.array([1.0]), np.array(1e308))
    return float(out.B_bar[0])  # right answer: -B/A = 0.5


def sigmoid_router_underflow():
    from scratchllm.moe import router_forward
    from scratchllm.specs import RouterSpec
    x = np.full((1, 2), -500.0)
    out, _ = router_forward(x, np.eye(2) * 2, spec=RouterSpec(2, 2, "sigmoid"))
    return out.gates  # right answer: finite gates summing to 1


def sample_tiny_temperature():
    from scratchllm.lm.sampling import sample_next
    return sample_next(np.array([0.0, 3.0, 1.0]), rng(), temperature=1e-310)  # right: 1


def eval_seq_len_too_long():
    from scratchllm.train import corpus
    return corpus.eval_batches(np.arange(50), 2, 128, 1000)


NUMERIC_CASES = [
    (rmsnorm_float32_1e20, np.ones((1, 4))), (rmsnorm_float16_300, np.ones((1, 4))),
    (softmax_float16_vocab, 1.0), (ce_float16_65536, float(np.log(65536))),
    (zoh_huge_delta, 0.5), (sigmoid_router_underflow, np.full((1, 2), 0.5)),
    (sample_tiny_temperature, 1), (eval_seq_len_too_long, ERROR),
]
