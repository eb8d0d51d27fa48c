"""The checker itself: it must catch wrong backwards, flag kinks, and police purity."""
from typing import NamedTuple

import numpy as np
import pytest

import grads
from scratchllm.core import ops


def _rng():
    return np.random.default_rng(7)


def test_correct_backward_passes_with_tiny_error():
    rng = _rng()
    report = grads.check(ops.rmsnorm_forward, ops.rmsnorm_backward, rng=rng,
                         x=rng.standard_normal((3, 9)), g=rng.standard_normal(9))
    assert report.ok, report
    assert [r.input for r in report.rows] == ["x", "g"]
    assert all(r.max_rel_err < 1e-8 for r in report.rows), report


def test_rmsnorm_without_mean_term_fails():
    def wrong_backward(dy, cache):
        x, g, rstd = cache
        return {"x": dy * g * rstd, "g": ops.rmsnorm_backward(dy, cache)["g"]}

    rng = _rng()
    report = grads.check(ops.rmsnorm_forward, wrong_backward, rng=rng,
                         x=rng.standard_normal((3, 9)), g=rng.standard_normal(9))
    status = {r.input: r.status for r in report.rows}
    assert status == {"x": "FAIL", "g": "ok"}, report
    assert not report.ok and report.failed


def test_softmax_backward_returning_zeros_fails():
    def zero_backward(dy, cache):
        return {"x": np.zeros_like(cache[0])}

    rng = _rng()
    report = grads.check(ops.softmax_forward, zero_backward, rng=rng,
                         x=rng.standard_normal((4, 7)))
    assert report.rows[0].status == "FAIL", report
    assert report.rows[0].max_rel_err == pytest.approx(1.0)


def _abs_forward(x):
    return np.abs(x), (x,)


def _abs_backward(dy, cache):
    (x,) = cache
    return {"x": dy * np.where(x >= 0, 1.0, -1.0)}


@pytest.mark.parametrize("at_zero", [0.0, 3e-6])
def test_abs_at_zero_is_a_kink(at_zero):
    x = np.array([0.5, -1.5, at_zero, 2.0])
    report = grads.check(_abs_forward, _abs_backward, rng=_rng(), x=x)
    assert report.rows[0].status == "kink", report
    assert not report.ok and not report.failed


def test_abs_away_from_zero_is_ok():
    report = grads.check(_abs_forward, _abs_backward, rng=_rng(), x=np.array([0.5, -1.5, 2.0]))
    assert report.ok, report


def test_backward_that_mutates_dout_fails():
    def mutating_backward(dy, cache):
        grads_ = ops.silu_backward(dy, cache)  # correct gradient ...
        dy *= 2.0  # ... but the caller's dout is changed
        return grads_

    report = grads.check(ops.silu_forward, mutating_backward, rng=_rng(), x=np.linspace(-2, 2, 7))
    assert any(r.input == "dout (mutated)" and r.status == "FAIL" for r in report.rows), report
    assert report.failed


def test_forward_that_mutates_input_fails():
    def mutating_forward(x):
        y, cache = ops.silu_forward(x.copy())
        x[0] += 1.0
        return y, cache

    report = grads.check(mutating_forward, ops.silu_backward, rng=_rng(), x=np.linspace(-2, 2, 7))
    assert any(r.input == "x (mutated)" for r in report.rows), report
    assert report.failed


def test_large_input_is_checked_along_directions():
    rng = _rng()
    W = rng.standard_normal((61, 53))  # 3,233 elements > 2,000
    report = grads.check(ops.linear_forward, ops.linear_backward, rng=rng,
                         x=rng.standard_normal((3, 61)), W=W)
    rows = {r.input: r for r in report.rows}
    assert rows["W"].checked == "4 dirs" and rows["x"].checked == "183", report
    assert report.ok, report


def test_large_input_wrong_gradient_fails_along_directions():
    def wrong_W(dy, cache):
        g = ops.linear_backward(dy, cache)
        return {"x": g["x"], "W": g["W"] * 1.01}

    rng = _rng()
    report = grads.check(ops.linear_forward, wrong_W, rng=rng,
                         x=rng.standard_normal((3, 61)), W=rng.standard_normal((61, 53)))
    assert {r.input: r.status for r in report.rows} == {"x": "ok", "W": "FAIL"}, report


def test_dout_is_random_not_ones():
    seen = []

    def spy_backward(dy, cache):
        seen.append(dy.copy())
        return ops.softmax_backward(dy, cache)

    grads.check(ops.softmax_forward, spy_backward, rng=_rng(), x=np.ones((2, 5)))
    assert np.std(seen[0]) > 0.1


def test_float32_input_is_a_type_error():
    with pytest.raises(TypeError, match="input 'x' must be a float64"):
        grads.check(ops.silu_forward, ops.silu_backward, x=np.ones(3, np.float32))


def test_missing_key_is_a_type_error_naming_the_input():
    with pytest.raises(TypeError, match="no gradient for input 'g'"):
        grads.check(ops.rmsnorm_forward, lambda dy, c: {"x": dy}, x=np.ones((2, 3)),
                    g=np.ones(3))


def test_wrong_shape_is_a_type_error_naming_the_input():
    with pytest.raises(TypeError, match=r"gradient for input 'x' has shape \(3,\), expected \(2, 3\)"):
        grads.check(ops.silu_forward, lambda dy, c: {"x": np.zeros(3)}, x=np.ones((2, 3)))


def test_wrt_restricts_the_checked_inputs():
    rng = _rng()
    report = grads.check(ops.rmsnorm_forward, lambda dy, c: {"g": ops.rmsnorm_backward(dy, c)["g"]},
                         rng=rng, wrt=["g"], x=rng.standard_normal((2, 5)), g=rng.standard_normal(5))
    assert [r.input for r in report.rows] == ["g"] and report.ok, report


def test_report_prints_a_table():
    rng = _rng()
    text = str(grads.check(ops.silu_forward, ops.silu_backward, rng=rng, x=rng.standard_normal(5)))
    header, row = text.splitlines()
    assert header.split() == ["input", "checked", "max", "rel", "err", "status"]
    assert row.split()[0] == "x" and row.split()[1] == "5" and row.split()[-1] == "ok"


def test_tuple_outputs_get_a_tuple_dout():
    def two_outputs(x):
        return (x * 2.0, x ** 2), (x,)

    def two_backward(dout, cache):
        (x,) = cache
        return {"x": 2.0 * dout[0] + 2.0 * x * dout[1]}

    rng = _rng()
    assert grads.check(two_outputs, two_backward, rng=rng, x=rng.standard_normal(4)).ok


# ---------------------------------------------------------------- NamedTuple inputs (weights)
class _W(NamedTuple):
    a: np.ndarray
    b: np.ndarray = None
    c: np.ndarray = None


def _affine(x, w):
    y = x @ w.a  # (N, M)
    return (y if w.b is None else y + w.b), (x, w)


def _affine_backward(dy, cache, scale=1.0):
    x, w = cache
    return {"x": dy @ w.a.T, "w": _W(scale * x.T @ dy, None if w.b is None else dy.sum(0))}


def _weights(rng, bias=True):
    return _W(rng.standard_normal((4, 5)), rng.standard_normal(5) if bias else None)


def test_namedtuple_fields_are_checked_as_inputs_of_their_own():
    rng = _rng()
    report = grads.check(_affine, _affine_backward, rng=rng, x=rng.standard_normal((3, 4)),
                         w=_weights(rng))
    assert report.ok, report
    assert [r.input for r in report.rows] == ["x", "w.a", "w.b"]  # w.c is None: not checked


def test_a_wrong_field_gradient_fails_that_field_only():
    rng = _rng()
    wrong = lambda dy, cache: _affine_backward(dy, cache, scale=1.01)  # noqa: E731
    report = grads.check(_affine, wrong, rng=rng, x=rng.standard_normal((3, 4)),
                         w=_weights(rng))
    assert {r.input: r.status for r in report.rows} == {"x": "ok", "w.a": "FAIL", "w.b": "ok"}


def test_wrt_names_a_namedtuple_for_all_its_fields():
    rng = _rng()
    report = grads.check(_affine, _affine_backward, rng=rng, wrt=["w"],
                         x=rng.standard_normal((3, 4)), w=_weights(rng))
    assert [r.input for r in report.rows] == ["w.a", "w.b"]


def test_namedtuple_gradient_must_match_the_input_type_and_its_none_fields():
    rng = _rng()
    as_dict = lambda dy, cache: {**_affine_backward(dy, cache), "w": {"a": 0}}  # noqa: E731
    with pytest.raises(TypeError, match="gradient for input 'w' must be a _W"):
        grads.check(_affine, as_dict, rng=rng, x=rng.standard_normal((3, 4)), w=_weights(rng))
    extra = lambda dy, cache: {**_affine_backward(dy, cache),  # noqa: E731
                               "w": _W(cache[0].T @ dy, dy.sum(0))}
    with pytest.raises(TypeError, match="'w.b' is an array, but the input's field is None"):
        grads.check(_affine, extra, rng=rng, x=rng.standard_normal((3, 4)),
                    w=_weights(rng, bias=False))
