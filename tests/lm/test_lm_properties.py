"""The whole model as a Module, on generated inputs (hypothesis), for every preset: ids of any
valid batch and length in float32 or float64 give finite logits of that dtype and finite
gradients in every parameter, and decoding equals the full forward's last row; wrong ids (out of
the vocabulary, negative, float, another rank, a list, another batch than the decoding state's)
are errors that name the method called (LM, LM.prefill, LM.decode)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from grads.cases import lm_tiny
from scratchllm.lm import LM
from scratchllm.specs import PRESETS

FEW = settings(max_examples=6, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])

pytestmark = pytest.mark.slow  # the exhaustive tier: `python -m pytest -q -m slow`
MODELS = {}


def model(name, dtype):
    if (name, dtype) not in MODELS:
        MODELS[name, dtype] = LM(lm_tiny(name), rng=np.random.default_rng(0), dtype=dtype)
    return MODELS[name, dtype]


@pytest.mark.parametrize("name", sorted(PRESETS))
@FEW
@given(B=st.integers(1, 3), T=st.integers(1, 9), dtype=st.sampled_from([np.float32, np.float64]),
       seed=st.integers(0, 999))
def test_valid_ids_give_finite_logits_and_gradients_and_decode_equals_forward(name, B, T, dtype,
                                                                              seed):
    m = model(name, dtype)
    r = np.random.default_rng(seed)
    ids = r.integers(0, m.cfg.vocab_size, (B, T))
    logits, cache = m.forward(ids)
    assert logits.shape == (B, T, m.cfg.vocab_size) and logits.dtype == dtype
    assert np.isfinite(logits).all()
    m.zero_grad()
    m.backward(r.standard_normal(logits.shape).astype(dtype), cache)
    assert all(np.isfinite(p.grad).all() for _, p in m.named_parameters())
    state = m.init_state(B, T)
    for t in range(T):
        last = m.decode(ids[:, t], state, t)
    tol = 1e-9 if dtype == np.float64 else 2e-3
    np.testing.assert_allclose(last, logits[:, -1], rtol=tol, atol=tol)


def wrong_ids(V, B, T):
    """(label, ids of the right rank, ids_t of the right rank) that must be refused."""
    r = np.random.default_rng(0)
    ok = r.integers(0, V, (B, T))
    return {
        "out of the vocabulary": (np.where(ok == ok.max(), V, ok), np.full(B, V)),
        "negative": (-1 - ok, np.full(B, -1)),
        "float": (ok.astype(np.float64), np.zeros(B)),
        "a list": (ok.tolist(), [0] * B),
        "another rank": (ok[..., None], ok[:, :1]),
    }


@pytest.mark.parametrize("name", ["dense", "hybrid", "rwkv", "mla"])
@FEW
@given(B=st.integers(1, 3), T=st.integers(1, 5), data=st.data())
def test_wrong_ids_are_errors_naming_the_method_called(name, B, T, data):
    m = model(name, np.float64)
    label = data.draw(st.sampled_from(sorted(wrong_ids(1, 1, 1))), "wrong ids")
    ids, ids_t = wrong_ids(m.cfg.vocab_size, B, T)[label]
    with pytest.raises((ValueError, TypeError), match=r"^LM: ids "):
        m.forward(ids)
    with pytest.raises((ValueError, TypeError), match=r"^LM.decode: ids_t "):
        m.decode(ids_t, m.init_state(B, 4), 0)
    with pytest.raises((ValueError, TypeError), match=r"^LM.prefill: ids "):
        m.prefill(ids, m.init_state(B, T + 1))
    with pytest.raises(ValueError, match=r"^LM.decode: ids_t has \d+ rows, but the state"):
        m.decode(np.zeros(B + 1, np.int64), m.init_state(B, 4), 0)
