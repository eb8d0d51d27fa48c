"""LM.prefill: one forward over the prompt fills every decoding state (KVState, RollingKVState,
LatentKVState, MambaState) exactly as feeding the tokens one at a time does."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM

V = LM_TINY["vocab_size"]
CASES = [("dense", {}), ("moe", {}), ("mla", {}), ("swa", {}), ("hybrid", {}),
         ("swa", dict(positions="alibi", attn_impl="flash")),
         ("dense", dict(positions="sinusoidal"))]


def _arrays(state):
    """Every array a layer state holds, in a fixed order."""
    if isinstance(state, tuple):  # MambaState
        return list(state)
    return [v for _, v in sorted(vars(state).items()) if isinstance(v, np.ndarray)]


@pytest.mark.parametrize("name, kw", CASES, ids=lambda o: str(o))
def test_prefill_equals_token_by_token_decoding(name, kw):
    rng = np.random.default_rng(11)
    model = LM(lm_tiny(name, **kw), rng=rng, dtype=np.float64)
    P, extra = 7, 3  # prompt longer than the swa window (3) + sinks (1)
    ids = rng.integers(0, V, (2, P + extra))
    stepped = model.init_state(batch=2, max_len=P + extra)
    step_logits = [model.decode(ids[:, t], stepped, t) for t in range(P)]  # (2, V) each
    filled = model.init_state(batch=2, max_len=P + extra)
    logits = model.prefill(ids[:, :P], filled)  # (2, P, V)
    np.testing.assert_allclose(logits, np.stack(step_logits, axis=1), rtol=0, atol=1e-10)
    for a, b in zip(filled, stepped):
        for x, y in zip(_arrays(a), _arrays(b)):
            np.testing.assert_allclose(x, y, rtol=0, atol=1e-10)
    for t in range(P, P + extra):  # decoding continues from the prefilled state
        np.testing.assert_allclose(model.decode(ids[:, t], filled, t),
                                   model.decode(ids[:, t], stepped, t), rtol=0, atol=1e-10)


def test_prefill_into_a_used_state_is_an_error():
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    state = model.init_state(batch=1, max_len=8)
    model.decode(np.array([1]), state, 0)
    with pytest.raises(ValueError, match="Attention.prefill: the state already holds 1"):
        model.prefill(np.array([[1, 2]]), state)
