"""Token eviction under a KV budget: a budget above the length changes nothing; streaming
equals the sliding-window-with-sinks mask exactly; every policy keeps at most the budget."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM
from scratchllm.serve import POLICIES, EvictingKV, kv_budget_cross_entropy


@pytest.fixture(scope="module")
def setup():
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    windows = np.random.default_rng(1).integers(0, LM_TINY["vocab_size"], (2, 15))
    return model, windows


@pytest.mark.parametrize("policy", POLICIES)
def test_a_budget_above_the_length_changes_nothing(setup, policy):
    model, w = setup
    full = model.cross_entropy(w[:, :-1], w[:, 1:])
    assert abs(kv_budget_cross_entropy(model, w, policy, 14) - full) < 1e-12
    assert abs(kv_budget_cross_entropy(model, w, policy, 5, n_sink=2) - full) > 1e-6


def test_streaming_is_the_sliding_window_with_sinks(setup):
    model, w = setup
    swa = LM(lm_tiny("dense", window=5, n_sink=2), rng=np.random.default_rng(0),
             dtype=np.float64)
    for p, q in zip(model.parameters(), swa.parameters()):
        q.data = p.data
    want = swa.cross_entropy(w[:, :-1], w[:, 1:])  # attention_sink_mask(T, 5, 2)
    assert abs(kv_budget_cross_entropy(model, w, "streaming", 6, n_sink=2) - want) < 1e-12


@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_keeps_the_budget_and_the_recent_tokens(policy):
    rng = np.random.default_rng(2)
    st = EvictingKV(policy, 6, n_sink=2, window=3)
    for t in range(12):
        st.append(rng.standard_normal((1, 2, 1, 4)), rng.standard_normal((1, 2, 1, 4)), t)
        st.observe(rng.random((1, 2, 2, len(st.pos))))
        st.evict()
        assert len(st.pos) == min(t + 1, 6) and st.k.shape[2] == st.score.shape[2]
        assert list(st.pos[-3:]) == list(range(max(0, t - 2), t + 1))  # the newest stay
    if policy == "streaming":
        assert list(st.pos[:2]) == [0, 1]
    if policy == "window":
        assert list(st.pos) == list(range(6, 12))


def test_cache_positions_without_eviction_are_the_own_positions(setup):
    model, w = setup
    full = model.cross_entropy(w[:, :-1], w[:, 1:])
    got = kv_budget_cross_entropy(model, w, "streaming", 14, n_sink=2, cache_positions=True)
    assert abs(got - full) < 1e-12
    evicted = kv_budget_cross_entropy(model, w, "streaming", 6, n_sink=2, cache_positions=True)
    assert abs(evicted - kv_budget_cross_entropy(model, w, "streaming", 6, n_sink=2)) > 1e-6
