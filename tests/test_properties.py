"""Property-based checks of every public pair (hypothesis), from the valid inputs of its grads
case (test_dout_checks.record_cases):
- valid inputs, rescaled by a random positive factor, in float64 or all cast to float32: a
  finite output of that dtype and finite gradients;
- an input with a wrong shape, a wrong dtype, a list, or 0-d: a clear error (ValueError or
  TypeError whose message starts with the name of the function called, `name: ...`, never
  a helper's it calls) or a finite result;
- no call mutates its inputs or its dout;
- the backward refuses a wrong dout with a clear error.
Examples are few and derandomized, so the whole file runs in seconds. The cases run when a
test first needs them (test_dout_checks.recorded_call), not while the tests are collected, and
each test runs only its own pair's forward.
"""
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from test_contract import BACKWARDS
from test_dout_checks import in_case_order, recorded_call, wrong_douts

KEYS = in_case_order(BACKWARDS)  # the tests run the grads cases as they need them
# Pairs whose float32 call compiles Numba kernels of its own, seconds of CPU on a cold cache
# (GLA's lane kernel: ~3.5 s per dtype): their float32 examples run in the slow tier, their
# float64 ones here. The fast tier still checks them in float32 where their package tests the
# kernels (tests/linear_attention: float32 finite, of float32, close to float64), and
# test_contract gradient-checks every pair.
FLOAT32_SLOW = {("scratchllm.linear_attention.gla", "gla_attention_backward")}
IN_UNIT_INTERVAL = {"gamma"}  # decays in (0, 1]: rescaled as gamma ** factor, which stays there
FEW = settings(max_examples=12, deadline=None, derandomize=True,
               suppress_health_check=[HealthCheck.too_slow])
CLEAR = re.compile(r"^[A-Za-z_][\w.]*( \w+)?: ")


def called_names(forward):
    """The names an error of `forward` may start with: its own, or its op's (the name
    without _forward / _forward_ref and fused_, as `swiglu` for swiglu_forward), or the op's
    readable twin's (`fft_conv_ref`)."""
    name = forward.__name__
    op = name.removeprefix("fused_").removesuffix("_ref").removesuffix("_forward")
    return {name, op, op + "_ref"}


def leaves(tree):
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in leaves(item)]
    return [tree]


def all_finite(tree):
    return all(np.isfinite(a).all() for a in leaves(tree)
               if isinstance(a, np.ndarray) and np.issubdtype(a.dtype, np.floating))


def copies(kwargs):
    return {k: v.copy() for k, v in kwargs.items() if isinstance(v, np.ndarray)}


def unchanged(kwargs, before):
    return all(np.array_equal(kwargs[k], v, equal_nan=True) for k, v in before.items())


def random_dout(out, rng):
    """A gradient shaped like `out` (None for integer outputs such as indices)."""
    if isinstance(out, tuple):
        return type(out)(*(random_dout(o, rng) for o in out)) if hasattr(out, "_fields") \
            else tuple(random_dout(o, rng) for o in out)
    a = np.asarray(out)
    if not np.issubdtype(a.dtype, np.floating):
        return None
    return np.asarray(rng.standard_normal(a.shape), a.dtype)


def in_dtype(value, dtype):
    """value with its float64 arrays (also a NamedTuple's fields) cast to dtype."""
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(in_dtype(a, dtype) for a in value))
    if isinstance(value, np.ndarray) and value.dtype == np.float64:
        return value.astype(dtype)
    return value


def call_of(key):
    """The recorded Call of the backward `key` (module, name)."""
    call = recorded_call(BACKWARDS[key])
    assert call is not None, f"no grads case calls {key[1]}"
    return call


def float_inputs(call):
    return [k for k, v in call.kwargs.items()
            if isinstance(v, np.ndarray) and np.issubdtype(v.dtype, np.floating)]


def array_slots(kwargs):
    """The array inputs of a call with at least one axis: "x" for an array argument,
    "w.wq" for an array field of a NamedTuple argument (a layer's weights)."""
    slots = [k for k, v in kwargs.items() if isinstance(v, np.ndarray) and v.ndim]
    for k, v in kwargs.items():
        if isinstance(v, tuple) and hasattr(v, "_fields"):
            slots += [f"{k}.{f}" for f, a in zip(v._fields, v)
                      if isinstance(a, np.ndarray) and a.ndim]
    return slots


def with_slot(kwargs, slot, change):
    """kwargs with the array at `slot` (array_slots) replaced by change(array)."""
    name, _, field = slot.partition(".")
    out = dict(kwargs)
    if field:
        out[name] = out[name]._replace(**{field: change(getattr(out[name], field))})
    else:
        out[name] = change(out[name])
    return out


def mutate(value, kind, axis):
    """A wrong version of one array input."""
    if kind == "extra axis":
        return value[None]
    if kind == "cut an axis":
        ax = axis % value.ndim
        return np.take(value, range(max(value.shape[ax] - 1, 0)), axis=ax)
    if kind == "int64":
        return np.nan_to_num(value, posinf=0, neginf=0).astype(np.int64)
    if kind == "float32":
        return value.astype(np.float32)
    if kind == "list":
        return value.tolist()
    return np.asarray(value.reshape(-1)[0])  # "0-d"


def dtype_params(keys):
    """(key, the dtypes its examples may take): both, or for FLOAT32_SLOW float64 here and
    float32 in the slow tier."""
    for key in keys:
        if key in FLOAT32_SLOW:
            yield pytest.param(key, (np.float64,), id=key[1])
            yield pytest.param(key, (np.float32,), id=f"{key[1]}-float32",
                               marks=pytest.mark.slow)
        else:
            yield pytest.param(key, (np.float64, np.float32), id=key[1])


@pytest.mark.parametrize("key,dtypes", dtype_params(KEYS))
@FEW
@given(factor=st.floats(0.25, 4.0), seed=st.integers(0, 2 ** 16),
       dtype=st.sampled_from([np.float64, np.float32]))
def test_valid_inputs_give_finite_outputs_and_gradients_without_mutation(key, dtypes, factor,
                                                                          seed, dtype):
    assume(dtype in dtypes)  # (the others draw as before)
    call = call_of(key)
    kwargs = dict(call.kwargs)
    for k in float_inputs(call):
        kwargs[k] = kwargs[k] ** factor if k in IN_UNIT_INTERVAL else kwargs[k] * factor
    kwargs = {k: in_dtype(v, dtype) for k, v in kwargs.items()}
    before = copies(kwargs)
    out, cache = call.forward(**kwargs)
    assert all_finite(out), f"non-finite output at factor {factor}"
    if dtype == np.float32:
        assert all(a.dtype == np.float32 for a in leaves(out) if isinstance(a, np.ndarray)
                   and np.issubdtype(a.dtype, np.floating)), "a float32 call left float32"
    dout = random_dout(out, np.random.default_rng(seed))
    dout_before = [None if d is None else d.copy() for d in leaves(dout)]
    grads = BACKWARDS[key](dout, cache)
    assert all_finite(list(grads.values()))
    assert unchanged(kwargs, before), "an input was mutated"
    assert all(d is None or np.array_equal(d, b) for d, b in zip(leaves(dout), dout_before))


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k[1])
@FEW
@given(data=st.data())
def test_wrong_inputs_give_a_clear_error_or_a_finite_result(key, data):
    call = call_of(key)
    name = data.draw(st.sampled_from(array_slots(call.kwargs)), "input")
    kind = data.draw(st.sampled_from(["extra axis", "cut an axis", "int64", "float32", "list",
                                      "0-d"]), "mutation")
    kwargs = with_slot(call.kwargs, name, lambda v: mutate(v, kind, data.draw(
        st.integers(0, 3), "axis")))
    before = copies(kwargs)
    try:
        out, _ = call.forward(**kwargs)
    except (ValueError, TypeError) as e:
        assert CLEAR.match(str(e)), f"{name} {kind}: unclear error {type(e).__name__}: {e}"
        library = call.forward.__module__.startswith("scratchllm")  # not a case's own wrapper
        assert not library or str(e).split(":")[0] in called_names(call.forward), \
            f"{name} {kind}: the error names another function than {call.forward.__name__}: {e}"
    else:
        assert all_finite(out), f"{name} {kind}: accepted, but the output is not finite"
    assert unchanged(kwargs, before), "an input was mutated"


@pytest.mark.parametrize("key", KEYS, ids=lambda k: k[1])
@FEW
@given(data=st.data())
def test_the_backward_refuses_a_wrong_dout(key, data):
    backward = BACKWARDS[key]
    call = call_of(key)
    label, bad = data.draw(st.sampled_from(wrong_douts(call.dout)), "wrong dout")
    with pytest.raises((ValueError, TypeError), match=rf"^{backward.__name__}: "):
        backward(bad, call.cache)
