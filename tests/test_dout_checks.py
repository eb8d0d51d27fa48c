"""Every public backward checks its upstream gradient against its cache (core/validate.py
expect_dout): a dout of another shape (broadcastable, transposed, an extra axis), another
dtype, or not an array raises an error that names the backward and its dout argument, and a
dout of the right shape and dtype still works. Driven by the grads cases: each case's first
(dout, cache) is recorded and then fed wrong douts.
"""
import copy
import inspect
import re
from typing import NamedTuple

import numpy as np
import pytest

import grads.cases
from grads.check import Report, _random_like
from test_contract import BACKWARDS, LIBRARY_CASES, run_cases_with


class Call(NamedTuple):
    """One recorded call of a pair by a grads case."""
    forward: object
    kwargs: dict  # the forward's valid inputs
    dout: object  # a valid upstream gradient
    cache: tuple


CALLS = {}    # {backward: Call}: its first call by the library grads cases, forward run
PENDING = {}  # {backward: (forward, inputs)}: first calls seen whose forward has not run yet
RAN = []      # the cases run so far: the first len(RAN) of LIBRARY_CASES


def _record(forward, backward, *, rng=None, **kwargs):
    """Instead of checking: keep (a copy of) the inputs of the first call of each backward.
    Its forward runs only when a test asks for that Call (recorded_call), so walking the cases
    up to one pair compiles no other pair's kernels."""
    if backward not in CALLS and backward not in PENDING:
        inputs = {k: v for k, v in kwargs.items()
                  if k not in ("wrt", "label", "fd_step", "n_directions", "max_full")}
        PENDING[backward] = (forward, copy.deepcopy(inputs))  # the case may reuse its arrays
    return Report()


def _call(backward):
    """The Call of a recorded backward: one forward, a random dout like grads.check draws."""
    if backward in PENDING:
        forward, inputs = PENDING.pop(backward)
        out, cache = forward(**inputs)
        dout = _random_like(out, np.random.default_rng(0))
        CALLS[backward] = Call(forward, inputs, dout, cache)
    return CALLS.get(backward)


def recorded_call(backward):
    """The Call of `backward` by the first library grads case that calls it (the whole-model
    cases excepted: they check loss_pair, not a library pair), running the cases in their
    order only as far as needed; None when no case calls it."""
    while backward not in CALLS and backward not in PENDING and len(RAN) < len(LIBRARY_CASES):
        name = LIBRARY_CASES[len(RAN)]
        run_cases_with(_record, [name])
        RAN.append(name)
    return _call(backward)


def record_cases():
    """{backward: Call} from the first call of every library grads case."""
    recorded_call(None)  # no case calls None: runs them all
    for backward in list(PENDING):
        _call(backward)
    return CALLS


def in_case_order(keys):
    """The (module, name) keys of backwards ordered as the grads cases' topics (core,
    attention, ...; then the rest), so that tests asking recorded_call in this order run the
    cases a few at a time."""
    topics = [module.__name__.rsplit(".", 1)[-1] for module in grads.cases.MODULES]

    def topic(key):
        package = key[0].split(".")[1]
        return topics.index(package) if package in topics else len(topics)
    return sorted(keys, key=lambda key: (topic(key), key))


def wrong_versions(d):
    """Wrong douts for a valid array dout d: (label, wrong dout). A 0-d dout (a loss) may
    also be any real number, so its wrong versions are the non-scalar ones."""
    if d.ndim == 0:
        return [("extra axis", d[None]), ("(1, 1)", d.reshape(1, 1)), ("a string", "1.0")]
    out = [("list", d.tolist()), ("extra axis", d[None]),
           ("other dtype", d.astype(np.float32 if d.dtype == np.float64 else np.float64))]
    if d.ndim:
        out.append(("broadcastable (1, ...)", d[:1] if d.shape[0] > 1 else np.repeat(d, 2, 0)))
        out.append(("last axis cut", d[..., :-1] if d.shape[-1] > 1 else d[..., :0]))
    if d.ndim >= 2 and d.shape != d.shape[::-1]:
        out.append(("transposed", np.ascontiguousarray(d.T)))
    return out


def wrong_douts(dout):
    """Wrong versions of a whole dout: its arrays, or each array entry of a tuple dout."""
    if not isinstance(dout, tuple):
        return wrong_versions(np.asarray(dout))
    out = [("tuple too short", dout[:-1])]
    for i, d in enumerate(dout):
        if d is not None:
            out += [(f"entry {i}: {label}", dout[:i] + (w,) + dout[i + 1:])
                    for label, w in wrong_versions(np.asarray(d))]
    return out


@pytest.mark.parametrize("key", in_case_order(BACKWARDS), ids=lambda k: k[1])
def test_backward_rejects_a_wrong_dout_by_name(key):
    backward = BACKWARDS[key]
    call = recorded_call(backward)
    assert call is not None, f"no grads case calls {key[1]}"
    dout, cache = call.dout, call.cache
    arg = next(iter(inspect.signature(backward).parameters))
    backward(dout, cache)  # the recorded dout is fine
    cases = wrong_douts(dout)
    assert len(cases) >= 3
    for label, bad in cases:
        with pytest.raises((ValueError, TypeError)) as err:
            backward(bad, cache)
        assert re.match(rf"{backward.__name__}: {arg}\b", str(err.value)), (label, err.value)


def test_the_issue_reproductions():
    """rmsnorm, softmax, silu broadcast a (1, D) dy; moe took a transposed dy of the same
    size; selective_scan_backward read out of bounds with a (B, 1, d) dy."""
    from scratchllm.core.ops import (rmsnorm_backward, rmsnorm_forward, silu_backward,
                                     silu_forward, softmax_backward, softmax_forward)
    from scratchllm.moe import MoEOut, MoEWeights, moe_backward, moe_forward
    from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec
    from scratchllm.ssm import selective_scan_backward, selective_scan_forward
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4))
    for fwd, bwd, args in ((rmsnorm_forward, rmsnorm_backward, (x, np.ones(4))),
                           (softmax_forward, softmax_backward, (x,)),
                           (silu_forward, silu_backward, (x,))):
        _, cache = fwd(*args)
        with pytest.raises(ValueError, match=rf"{bwd.__name__}: dy has shape \(1, 4\), "
                                             rf"expected \(3, 4\)"):
            bwd(np.ones((1, 4)), cache)
    D, E, F = 4, 3, 5
    xm = rng.standard_normal((6, D))
    w = MoEWeights(rng.standard_normal((D, E)), None, rng.standard_normal((E, D, F)),
                   rng.standard_normal((E, D, F)), rng.standard_normal((E, F, D)))
    out, cache = moe_forward(xm, w, spec=MoESpec(RouterSpec(E, 2), ExpertsSpec(d_ff=F)))
    with pytest.raises(ValueError, match=r"moe_backward: dout.y has shape \(4, 6\)"):
        moe_backward(MoEOut(np.ones((D, 6)), None, None), cache)
    batch, T, d, N = 1, 2000, 3, 2
    y, cache = selective_scan_forward(
        rng.standard_normal((batch, T, d)), rng.random((batch, T, d)), -rng.random((d, N)),
        rng.standard_normal((batch, T, N)), rng.standard_normal((batch, T, N)), np.ones(d))
    with pytest.raises(ValueError, match=r"selective_scan_backward: dy has shape \(1, 1, 3\)"):
        selective_scan_backward(np.ones((batch, 1, d)), cache)
