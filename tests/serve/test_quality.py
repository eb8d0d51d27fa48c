"""What a quantised KV cache costs: the float cache reproduces the model's own cross-entropy,
and the attention-output error grows int8 < fp8 < int4."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM
from scratchllm.serve import kv_attention_error, kv_cross_entropy


@pytest.fixture(scope="module")
def setup():
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    windows = np.random.default_rng(1).integers(0, LM_TINY["vocab_size"], (3, 13))
    return model, windows


def test_the_float_cache_gives_the_forward_cross_entropy(setup):
    model, w = setup
    want = model.cross_entropy(w[:, :-1], w[:, 1:])
    assert abs(kv_cross_entropy(model, w, "float32", block_size=4) - want) < 1e-12
    assert abs(kv_cross_entropy(model, w, "int4", block_size=4) - want) > 1e-6


def test_attention_error_grows_as_the_format_shrinks(setup):
    model, w = setup
    assert kv_attention_error(model, w, "float32") == [0.0, 0.0]
    e = {f: max(kv_attention_error(model, w, f)) for f in ("int8", "fp8", "int4")}
    assert 0 < e["int8"] < e["fp8"] < e["int4"] < 0.2
