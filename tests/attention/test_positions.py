"""Sinusoidal positions and ALiBi: values against the papers' formulas and the official slope
rule, the bias against explicit loops, and its gradient through sdpa."""
import math

import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import alibi_bias, alibi_slopes, sinusoidal_positions


def test_sinusoidal_matches_the_formula_elementwise():
    T, D, base = 7, 10, 100.0
    pe = sinusoidal_positions(T, D, base)
    for t in range(T):
        for i in range(D // 2):
            assert pe[t, 2 * i] == pytest.approx(math.sin(t / base ** (2 * i / D)), abs=1e-15)
            assert pe[t, 2 * i + 1] == pytest.approx(math.cos(t / base ** (2 * i / D)), abs=1e-15)
    assert pe[0].tolist() == [0.0, 1.0] * 5


def test_sinusoidal_dot_product_depends_only_on_the_offset():
    pe = sinusoidal_positions(40, 16)
    dots = [pe[t] @ pe[t + 5] for t in range(30)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-12)
    assert not np.isclose(pe[0] @ pe[5], pe[0] @ pe[6])


def test_sinusoidal_rejects_odd_width():
    with pytest.raises(ValueError, match="sinusoidal_positions: D must be an even integer"):
        sinusoidal_positions(4, 7)


@pytest.mark.parametrize("H, expected", [
    (1, [2 ** -8]),
    (8, [2.0 ** -i for i in range(1, 9)]),
    (4, [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8]),
    # non-powers of two: the slopes of 4 (or 8), then every other slope of 8 (or 16)
    (6, [2.0 ** -2, 2.0 ** -4, 2.0 ** -6, 2.0 ** -8, 2.0 ** -1, 2.0 ** -3]),
    (12, [2.0 ** -i for i in range(1, 9)] + [2.0 ** -0.5, 2.0 ** -1.5, 2.0 ** -2.5,
                                             2.0 ** -3.5]),
])
def test_alibi_slopes_follow_the_paper(H, expected):
    np.testing.assert_allclose(alibi_slopes(H), expected, rtol=1e-15)


def test_alibi_slopes_reject_zero_heads():
    with pytest.raises(ValueError, match="alibi_slopes: H must be a positive integer"):
        alibi_slopes(0)


def test_alibi_bias_is_minus_slope_times_distance():
    slopes = np.array([0.5, 0.25])
    bias = alibi_bias(slopes, 3, 5)  # queries at positions 2, 3, 4
    for h, i, j in np.ndindex(2, 3, 5):
        assert bias[h, i, j] == -slopes[h] * abs(i + 2 - j)
    # in a causal row the bias differs from the official code's slope * j by a constant
    row = bias[0, 2, :5]
    np.testing.assert_allclose(row - 0.5 * np.arange(5), row[0])


@pytest.mark.parametrize("name", ["sdpa_bias"])
def test_gradient_checks(name):
    for report in CASES[name](np.random.default_rng(0)):
        assert report.ok, str(report)
