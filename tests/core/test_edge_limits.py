"""The exact limits at the edges, on generated rows, for the readable pairs and their fused
twins alike: a row with one +inf logit is softmax's one-hot, log_softmax's [0, -inf, ...] and a
cross-entropy of 0 (target there, zero gradient) or inf; several +inf have no limit where they
are (NaN; the finite entries still go to probability 0); a row
holding inf normalises to NaN in rmsnorm (the documented choice); an empty axis and D = 0 are
errors that say so."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from scratchllm.core import fused, ops

rows = st.integers(min_value=2, max_value=9).flatmap(lambda v: st.tuples(
    st.lists(st.floats(-30, 30), min_size=v, max_size=v), st.integers(0, v - 1)))


@settings(max_examples=60, deadline=None)
@given(rows, st.sampled_from([np.float32, np.float64]))
def test_one_inf_logit_is_the_exact_limit(row, dtype):
    values, i = row
    z = np.array([values, values], dtype)  # (2, V): the target at the inf logit, or not
    z[:, i] = np.inf
    onehot = np.eye(len(values), dtype=dtype)[i]
    assert np.array_equal(ops.softmax_forward(z)[0][0], onehot)
    logp = ops.log_softmax_forward(z)[0][0]
    assert logp[i] == 0 and np.all(np.delete(logp, i) == -np.inf)
    other = (i + 1) % len(values)
    for forward, backward in ((ops.cross_entropy_forward, ops.cross_entropy_backward),
                              (fused.fused_cross_entropy_forward,
                               fused.fused_cross_entropy_backward)):
        loss, cache = forward(z[:1], np.array([i]))
        assert loss == 0
        assert not backward(np.asarray(1.0, dtype), cache)["logits"].any()  # the flat limit
        assert forward(z[1:], np.array([other]))[0] == np.inf


@settings(max_examples=40, deadline=None)
@given(rows, st.integers(2, 3))
def test_several_inf_logits_have_no_limit(row, n_inf):
    values, _ = row
    z = np.array([values + [np.inf] * n_inf])
    p = ops.softmax_forward(z)[0][0]
    assert np.all(p[:len(values)] == 0) and np.isnan(p[len(values):]).all()  # finite: 0
    for forward in (ops.cross_entropy_forward, fused.fused_cross_entropy_forward):
        assert np.isnan(forward(z, np.array([len(values)]))[0])


@settings(max_examples=40, deadline=None)
@given(rows, st.sampled_from([np.inf, -np.inf]))
def test_rmsnorm_of_a_row_holding_inf_is_nan_in_both_twins(row, inf):
    values, i = row
    x = np.array([values, values])
    x[0, i] = inf
    g = np.ones(len(values))
    for forward in (ops.rmsnorm_forward, fused.fused_rmsnorm_forward):
        y = forward(x, g)[0]
        assert np.isnan(y[0]).all() and np.isfinite(y[1]).all()


@pytest.mark.parametrize("forward", [ops.softmax_forward, ops.log_softmax_forward])
def test_an_empty_axis_is_an_error_naming_it(forward):
    with pytest.raises(ValueError, match=r"axis -1 is empty"):
        forward(np.zeros((2, 0)))


@pytest.mark.parametrize("forward", [ops.rmsnorm_forward, fused.fused_rmsnorm_forward])
def test_rmsnorm_of_zero_features_is_an_error(forward):
    with pytest.raises(ValueError, match=r"rmsnorm: x has shape \(2, 0\): D = 0 features"):
        forward(np.zeros((2, 0)), np.ones(0))
