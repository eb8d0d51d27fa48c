"""The library's one rule for mixed float dtypes, checked on every public pair from the inputs
of its grads case (test_dout_checks.record_cases): a pair computes in the common dtype of its
differentiable inputs (NumPy's result_type: float32 with float64 gives float64). Its outputs have
that dtype, its backward takes a dout of the outputs' dtype, and the gradients come back finite.
Constant tables (RoPE frequencies, masks, positions: inputs without a gradient) do not vote.
Generated: every differentiable float64 input of every pair with two or more is in turn made
float32.
"""
import numpy as np
import pytest

from test_contract import BACKWARDS
from test_dout_checks import record_cases
from test_properties import all_finite, array_slots, leaves, random_dout, with_slot

pytestmark = pytest.mark.slow  # the exhaustive tier: `python -m pytest -q -m slow`


def slot_value(kwargs, slot):
    name, _, field = slot.partition(".")
    return getattr(kwargs[name], field) if field else kwargs[name]


def differentiable_slots(call, backward):
    """The float64 array inputs the backward returns a gradient for ("x", "w.wq", ...)."""
    grads = backward(call.dout, call.cache)
    slots = []
    for slot in array_slots(call.kwargs):
        name, _, field = slot.partition(".")
        g = grads.get(name)
        if field and g is not None:
            g = getattr(g, field, None)
        if g is not None and slot_value(call.kwargs, slot).dtype == np.float64:
            slots.append(slot)
    return slots


def mixed_cases():
    """[(key, slot)]: every differentiable input of every pair with two or more."""
    calls = record_cases()
    keys = sorted(k for k in BACKWARDS if BACKWARDS[k] in calls)
    slots = {key: differentiable_slots(calls[BACKWARDS[key]], BACKWARDS[key]) for key in keys}
    return [(key, slot) for key in keys if len(slots[key]) > 1 for slot in slots[key]]


def selects_slow(config):
    """Whether the run's -m expression selects tests marked slow (this module's are all)."""
    from _pytest.mark.expression import Expression
    expression = config.getoption("markexpr")
    return not expression or Expression.compile(expression).evaluate(
        lambda name, **kwargs: name == "slow")


def pytest_generate_tests(metafunc):
    """The cases are run (every grads case, forward and backward) only when this slow module's
    tests are selected, not while the fast tier is collected."""
    cases = mixed_cases() if selects_slow(metafunc.config) else []
    metafunc.parametrize("key, slot", cases, ids=[f"{k[1]}-{s}" for k, s in cases])


def float_leaves(tree):
    return [a for a in leaves(tree)
            if isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating)]


def test_a_float32_input_among_float64_computes_in_float64(key, slot):
    call, backward = record_cases()[BACKWARDS[key]], BACKWARDS[key]
    kwargs = with_slot(call.kwargs, slot, lambda a: a.astype(np.float32))
    out, cache = call.forward(**kwargs)
    assert {a.dtype for a in float_leaves(out)} == {np.dtype(np.float64)}, \
        f"{call.forward.__name__} with {slot} float32: outputs {[a.dtype for a in float_leaves(out)]}"
    grads = backward(random_dout(out, np.random.default_rng(0)), cache)
    assert all_finite(list(grads.values()))
