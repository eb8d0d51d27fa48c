"""The pair contract, checked over the whole library:
- every public `<op>_backward` is exercised by a grads case, passes that case's first gradient
  check (finite differences, float64; `python -m grads` runs every case in full), returns a
  dict, and its keys are argument names of `<op>_forward`;
- every public `<name>_ref` twin has its fast twin `<name>` beside it, with the same signature.
"""
import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import grads.cases
import scratchllm
from grads.check import Report, _random_like, check as real_check

SLOW_CASES = ("lm_",)  # whole-model cases check loss_pair, not a library pair


def library_functions():
    """{(module, name): function} of every public function defined in scratchllm's modules."""
    found = {}
    for info in pkgutil.walk_packages(scratchllm.__path__, "scratchllm."):
        if info.name.startswith(("scratchllm.cli", "scratchllm.teach", "scratchllm.__main__")):
            continue  # commands, and drill solutions (they take plain inputs by design)
        module = importlib.import_module(info.name)
        for name, fn in vars(module).items():
            if inspect.isfunction(fn) and fn.__module__ == info.name and not name.startswith("_"):
                found[info.name, name] = fn
    return found


FUNCTIONS = library_functions()
BACKWARDS = {key: fn for key, fn in FUNCTIONS.items() if key[1].endswith(("_backward",
                                                                           "_backward_ref"))}


def forward_of(module, name):
    """The forward twin of a backward: x_backward -> x_forward, x_backward_ref -> x_forward_ref."""
    return FUNCTIONS.get((module, name.replace("_backward", "_forward")))


CHECK_OPTIONS = ("rng", "wrt", "label", "fd_step", "n_directions", "max_full")
LIBRARY_CASES = [name for name in grads.cases.CASES if not name.startswith(SLOW_CASES)]
SEEN = {}    # {backward: [the gradient dicts it returned]}, filled by the cases run so far
FAILED = {}  # {case name: the first gradient checks of that case that failed}


def recording_check(failed):
    """A checker for grads.check's place: a backward's first call in this process is a full
    gradient check (its failures appended to `failed`); its later calls (other shapes and
    options, other cases) run forward and backward once, for the keys: `python -m grads`
    differences them all. Every returned dict is recorded in SEEN."""
    def checker(forward, backward, **kwargs):
        def recorded(dout, cache):
            grads_ = backward(dout, cache)
            SEEN.setdefault(backward, []).append(grads_)
            return grads_
        if backward not in SEEN:
            report = real_check(forward, recorded, **kwargs)
            if report.failed:
                failed.append(f"{backward.__module__}.{backward.__name__}:\n{report}")
            return report
        out, cache = forward(**{k: v for k, v in kwargs.items() if k not in CHECK_OPTIONS})
        recorded(_random_like(out, np.random.default_rng(0)), cache)
        return Report()
    return checker


def run_case(name):
    """Run the grads case `name` once per process with the recording checker; returns the
    first gradient checks it failed."""
    if name not in FAILED:
        failed = []
        run_cases_with(recording_check(failed), [name])
        FAILED[name] = failed
    return FAILED[name]


def run_cases_with(checker, names=LIBRARY_CASES):
    """Run the library grads cases `names` (default: every one but the whole-model ones), each
    on a fresh rng seeded 0, with `checker` in place of grads.check (in every case module of
    the grads.cases package)."""
    for module in grads.cases.MODULES:
        module.check = checker
    try:
        for name in names:
            grads.cases.CASES[name](np.random.default_rng(0))
    finally:
        for module in grads.cases.MODULES:
            module.check = real_check


@pytest.mark.parametrize("name", LIBRARY_CASES)
def test_every_public_pair_passes_its_first_gradient_check(name):
    """One test per case, in the cases' order, so each pays only its own compilations: the
    first call of every public backward is a full gradient check (finite differences)."""
    assert run_case(name) == []


@pytest.fixture(scope="module")
def returned_keys():
    """{backward: [key sets it returned]} over every library case (the ones the tests above
    ran are not run again)."""
    for name in LIBRARY_CASES:
        run_case(name)
    return SEEN


def test_the_library_has_backwards_to_check():
    assert len(BACKWARDS) >= 30


def breaches(forward, results):
    """What breaks the contract in the results a backward returned for `forward`."""
    params = set(inspect.signature(forward).parameters)
    out = []
    for grads_ in results:
        if not isinstance(grads_, dict) or not grads_:
            out.append(f"returned {type(grads_).__name__} {grads_!r:.40}, not a dict")
        elif not set(grads_) <= params:
            out.append(f"keys {sorted(set(grads_) - params)} are not arguments of "
                       f"{forward.__name__}{sorted(params)}")
    return out


@pytest.mark.parametrize("key", sorted(BACKWARDS), ids=lambda k: k[1])
def test_backward_returns_a_dict_keyed_by_forward_arguments(key, returned_keys):
    module, name = key
    backward, forward = BACKWARDS[key], forward_of(module, name)
    assert forward is not None, f"{module}.{name} has no forward twin beside it"
    assert backward in returned_keys, f"no grads case checks {module}.{name}"
    assert breaches(forward, returned_keys[backward]) == []


REFS = {key: fn for key, fn in FUNCTIONS.items() if key[1].endswith("_ref")}


@pytest.mark.parametrize("key", sorted(REFS), ids=lambda k: k[1])
def test_ref_twin_has_the_signature_of_its_fast_twin(key):
    module, name = key
    fast = FUNCTIONS.get((module, name[:-len("_ref")]))
    assert fast is not None, f"{module}.{name} has no fast twin {name[:-4]} beside it"
    assert inspect.signature(REFS[key]) == inspect.signature(fast)


def test_breaches_catches_a_tuple_an_empty_dict_and_a_stray_key():
    def forward(x, W, *, eps=1e-5):
        return x, None

    assert breaches(forward, [{"x": 1.0, "W": 2.0}]) == []
    assert len(breaches(forward, [(1.0, 2.0), {}, {"x": 1.0, "b": 2.0}])) == 3
