"""rope_scaling dicts are checked where they are built (RopeSpec) against the domains HF's rope
init functions assume, on generated dicts: a value outside its domain is refused naming the
key, a value inside gives finite frequencies."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from scratchllm.attention.rope import rope_frequencies
from scratchllm.specs import RopeSpec

L0 = 64
BASE = {"linear": dict(factor=2.0),
        "dynamic": dict(factor=2.0, original_max_position_embeddings=L0),
        "yarn": dict(factor=4.0, original_max_position_embeddings=L0, beta_fast=32.0,
                     beta_slow=1.0),
        "llama3": dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=L0)}
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6)


def assert_refused(scaling, key):
    with pytest.raises(ValueError, match=key):
        RopeSpec(scaling=scaling)
    with pytest.raises(ValueError, match=key):
        rope_frequencies(16, 10000.0, scaling, seq_len=10)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(BASE)), finite)
def test_a_factor_below_one_is_refused_and_above_gives_finite_frequencies(kind, factor):
    scaling = dict(BASE[kind], rope_type=kind, factor=factor)
    if factor < 1:
        assert_refused(scaling, "factor")
    else:
        inv_freq, attention_factor = rope_frequencies(16, 10000.0, scaling, seq_len=2 * L0)
        assert np.isfinite(inv_freq).all() and np.isfinite(attention_factor)


@settings(max_examples=60, deadline=None)
@given(finite, finite)
def test_yarn_needs_beta_fast_above_beta_slow_above_zero(fast, slow):
    scaling = dict(BASE["yarn"], rope_type="yarn", beta_fast=fast, beta_slow=slow)
    if min(fast, slow) <= 0:
        assert_refused(scaling, "beta_")
    elif fast <= slow:
        assert_refused(scaling, "beta_fast > beta_slow")
    else:
        assert RopeSpec(scaling=scaling).scaling == scaling


@settings(max_examples=60, deadline=None)
@given(finite, finite)
def test_llama3_needs_zero_below_low_below_high(low, high):
    scaling = dict(BASE["llama3"], rope_type="llama3", low_freq_factor=low,
                   high_freq_factor=high)
    if min(low, high) <= 0:
        assert_refused(scaling, "freq_factor")
    elif low >= high:
        assert_refused(scaling, "low_freq_factor < high_freq_factor")
    else:
        assert np.isfinite(rope_frequencies(16, 10000.0, scaling)[0]).all()


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["dynamic", "yarn", "llama3"]),
       st.one_of(st.text(max_size=5), st.floats(), st.integers(max_value=0), st.booleans()))
def test_original_max_position_embeddings_must_be_a_positive_integer(kind, bad):
    assert_refused(dict(BASE[kind], rope_type=kind, original_max_position_embeddings=bad),
             "original_max_position_embeddings must be an integer >= 1")


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(sorted(BASE)), st.sampled_from(sorted(BASE)))
def test_rope_type_and_type_must_agree(a, b):
    scaling = dict(BASE[a], rope_type=a, type=b)
    if a == b:
        assert RopeSpec(scaling=scaling).scaling == scaling
    else:
        assert_refused(scaling, "disagree")


@settings(max_examples=30, deadline=None)
@given(st.integers(max_value=-1))
def test_dynamic_refuses_a_negative_length(seq_len):
    with pytest.raises(ValueError, match="rope_frequencies: seq_len must be >= 0"):
        rope_frequencies(16, 10000.0, dict(BASE["dynamic"], rope_type="dynamic"),
                         seq_len=seq_len)
