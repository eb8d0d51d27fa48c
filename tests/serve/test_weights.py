"""Weight quantisation: every Linear weight is its own group-wise round trip, the rest is
untouched, the original model is unchanged, and int4 costs more than int8."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM
from scratchllm.serve import quantize, quantize_weights


@pytest.mark.parametrize("name", ["dense", "moe"])
def test_linear_weights_are_their_round_trips(name):
    model = LM(lm_tiny(name), rng=np.random.default_rng(0), dtype=np.float64)
    before = {n: p.data.copy() for n, p in model.named_parameters()}
    q_model, report = quantize_weights(model, "int4", group_size=4)
    for (n, p), (_, q) in zip(model.named_parameters(), q_model.named_parameters()):
        np.testing.assert_array_equal(p.data, before[n])  # the original is unchanged
        if n.startswith("embed") or n.endswith(("g", "w_router")):
            assert q.data is p.data
            continue
        want = quantize(np.swapaxes(p.data, -1, -2).copy(), "int4", group_size=4).dequantize()
        np.testing.assert_array_equal(q.data, np.swapaxes(want, -1, -2))
    n = report["params"]
    assert report["quantized_bytes"] == n // 2 + n // 4 * 4  # 4-bit codes + a scale per 4


def test_int4_costs_more_than_int8():
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    ids = np.random.default_rng(1).integers(0, LM_TINY["vocab_size"], (4, 13))
    base = model.cross_entropy(ids[:, :-1], ids[:, 1:])
    delta = {f: abs(quantize_weights(model, f)[0].cross_entropy(ids[:, :-1], ids[:, 1:]) - base)
             for f in ("int8", "int4")}
    assert 0 < delta["int8"] < delta["int4"]
