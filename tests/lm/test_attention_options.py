"""The LM with its attention options (positions = rope | alibi | sinusoidal | nope,
attn_impl = sdpa | flash): whole-model gradients, decoding == full forward, flash == sdpa."""
import numpy as np
import pytest

from grads.cases import CASES, LM_TINY, lm_tiny
from scratchllm.lm import LM

V = LM_TINY["vocab_size"]


def test_whole_model_gradients():
    for report in CASES["lm_positions"](np.random.default_rng(7)):
        assert report.ok, f"\n{report}"


OPTIONS = [("dense", dict(positions="alibi")), ("swa", dict(positions="alibi")),
           ("dense", dict(positions="sinusoidal")), ("dense", dict(positions="nope")),
           ("dense", dict(attn_impl="flash")),
           ("swa", dict(positions="alibi", attn_impl="flash"))]


@pytest.mark.parametrize("name, kw", OPTIONS, ids=lambda o: str(o))
def test_decoding_equals_full_forward(name, kw):
    rng = np.random.default_rng(3)
    model = LM(lm_tiny(name, **kw), rng=rng, dtype=np.float64)
    T = 9  # beyond the swa window (3) + sinks (1)
    ids = rng.integers(0, V, (2, T))
    full, _ = model.forward(ids)  # (2, T, V)
    state = model.init_state(batch=2, max_len=T)
    for t in range(T):
        np.testing.assert_allclose(model.decode(ids[:, t], state, t), full[:, t], rtol=0,
                                   atol=1e-10, err_msg=f"position {t}")


@pytest.mark.parametrize("name", ["dense", "swa"])
def test_flash_model_equals_sdpa_model(name):
    rng = np.random.default_rng(4)
    ids = rng.integers(0, V, (2, 11))
    losses = []
    for impl in ("sdpa", "flash"):
        model = LM(lm_tiny(name, attn_impl=impl, positions="alibi"),
                   rng=np.random.default_rng(0), dtype=np.float64)
        loss, cache = model.loss(ids, ids)
        model.loss_backward(1.0, cache)
        losses.append((float(loss), [p.grad.copy() for p in model.parameters()]))
    assert losses[1][0] == pytest.approx(losses[0][0], rel=1e-13)
    for g1, g0 in zip(losses[1][1], losses[0][1]):
        np.testing.assert_allclose(g1, g0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("fields, message", [
    (dict(positions="relative"), "positions must be"),
    (dict(attn_impl="cuda"), "attn_impl must be"),
])
def test_config_rejects_unknown_options(fields, message):
    with pytest.raises(ValueError, match=message):
        lm_tiny("dense", **fields)


def test_mla_rejects_positions_it_does_not_implement():
    with pytest.raises(ValueError, match="attention='mla' supports positions='rope'"):
        lm_tiny("mla", positions="alibi")
