"""The router losses at their edges, on generated sizes: no tokens (BT = 0, or T = 0 per
sequence) gives the empty sum's limit 0 with a zero-size gradient, never NaN; the aux-loss-free
bias update refuses a negative or non-finite gamma by name."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from scratchllm.moe import (balance_loss_backward, balance_loss_forward,
                            sequence_balance_loss_backward, sequence_balance_loss_forward,
                            update_selection_bias, z_loss_backward, z_loss_forward)

sizes = st.tuples(st.integers(1, 6), st.integers(1, 3), st.integers(0, 3))  # E, K, B


@settings(max_examples=20, deadline=None)
@given(sizes, st.sampled_from([np.float32, np.float64]))
def test_no_tokens_give_zero_losses_and_empty_gradients(size, dtype):
    E, K, B = size
    cases = [
        (balance_loss_forward, balance_loss_backward, "probs",
         (np.zeros((0, E), dtype), np.zeros((0, K), np.int64))),
        (z_loss_forward, z_loss_backward, "logits", (np.zeros((0, E), dtype),)),
        (sequence_balance_loss_forward, sequence_balance_loss_backward, "scores",
         (np.zeros((B, 0, E), dtype), np.zeros((B, 0, K), np.int64))),
    ]
    for forward, backward, name, args in cases:
        loss, cache = forward(*args)
        assert loss == 0 and loss.dtype == dtype, forward.__name__
        g = backward(np.asarray(1.0, dtype), cache)[name]
        assert g.shape == args[0].shape and g.dtype == dtype


@settings(max_examples=20, deadline=None)
@given(st.one_of(st.floats(max_value=-1e-12), st.sampled_from([np.inf, np.nan, -np.inf])))
def test_update_selection_bias_refuses_a_negative_or_non_finite_gamma(gamma):
    with pytest.raises(ValueError, match=r"^update_selection_bias: gamma"):
        update_selection_bias(np.zeros(4), np.arange(4), gamma)
    assert np.array_equal(update_selection_bias(np.zeros(2), np.array([1, 3]), 0.5),
                          [0.5, -0.5])  # the underloaded expert goes up
