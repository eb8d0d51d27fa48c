"""Partial RoPE (RopeSpec.partial, transformers' partial_rotary_factor): the first
int(Dh partial) numbers of each head turn as a RoPE of that width, the rest pass unchanged,
forward and backward; decoding equals the forward; a width RoPE cannot turn is refused."""
import numpy as np
import pytest

from scratchllm.attention import Attention, make_rope, rope_backward, rope_forward
from scratchllm.specs import AttentionSpec, MLASpec, RopeSpec


def test_partial_rope_turns_the_first_numbers_only():
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((2, 3, 5, 8)), rng.standard_normal((2, 3, 5, 8))
    y, cache = rope_forward(x, make_rope(RopeSpec(partial=0.5), 8, np.arange(5)))
    whole = rope_forward(x[..., :4], make_rope(RopeSpec(), 4, np.arange(5)))[0]
    np.testing.assert_array_equal(y[..., :4], whole)
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
    dx = rope_backward(dy, cache)["x"]
    assert np.isclose(np.sum(dx * x), np.sum(dy * y))  # a linear map and its adjoint
    with pytest.raises(ValueError, match="must be even and >= 2"):
        make_rope(RopeSpec(partial=0.4), 8, np.arange(5))  # 3 numbers
    with pytest.raises(ValueError, match="partial"):
        RopeSpec(partial=1.5)
    with pytest.raises(ValueError, match="rope.partial"):
        MLASpec(rope=RopeSpec(partial=0.5))


def test_partial_rope_decodes_as_the_forward():
    spec = AttentionSpec(4, 2, rope=RopeSpec(partial=0.25), head_dim=8)
    layer = Attention(12, spec, rng=np.random.default_rng(1), dtype=np.float64)
    x = np.random.default_rng(2).standard_normal((2, 6, 12))
    y, _ = layer.forward(x)
    state = layer.init_state(2, 6)
    steps = np.stack([layer.decode(x[:, t], state, t) for t in range(6)], 1)
    np.testing.assert_allclose(steps, y, rtol=0, atol=1e-12)
