"""FP8 matmuls (core/fp8.py): the quantisers equal ml_dtypes casts on their tiles' scales and
stay within each format's rounding bound; the FP8 linear's straight-through check can fail;
fp8_matmuls switches linear_forward and the fused twins."""
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from grads.straight_through import check_fp8_linear
from scratchllm.core import (FP8Linear, FP8Spec, fp8_active, fp8_dequantize, fp8_linear_forward,
                             fp8_matmuls, fp8_quantize, fp8_round, use_fused)
from scratchllm.core.fp8 import FP8LinearCache
from scratchllm.core.ops import LinearCache, linear_backward, linear_forward

RNG = np.random.default_rng(0)


@pytest.mark.parametrize("fmt, dtype, fmax", [("e4m3", ml_dtypes.float8_e4m3fn, 448.0),
                                              ("e5m2", ml_dtypes.float8_e5m2, 57344.0)])
def test_codes_are_ml_dtypes_casts_on_each_tiles_scale(fmt, dtype, fmax):
    x = RNG.standard_normal((7, 10)) * np.logspace(-3, 3, 10)
    q = fp8_quantize(x, fmt, (3, 4))
    assert q.codes.dtype == dtype and q.scales.shape == (3, 3)  # ceil(7/3), ceil(10/4)
    for i in range(7):
        for j in range(10):
            amax = np.abs(x[i // 3 * 3:i // 3 * 3 + 3, j // 4 * 4:j // 4 * 4 + 4]).max()
            s = np.float32(amax) / np.float32(fmax)  # float32 scales
            assert q.scales[i // 3, j // 4] == s
            want = np.asarray(x[i, j] / np.float64(s)).astype(dtype)
            assert q.codes[i, j] == want


@pytest.mark.parametrize("fmt, mant, tiny", [("e4m3", 3, 2.0 ** -9), ("e5m2", 2, 2.0 ** -16)])
@pytest.mark.parametrize("tile", [None, (1, 4), (4, 4)])
def test_round_trip_within_half_a_step(fmt, mant, tile, tiny):
    """|x - x^| <= max(|x| 2^-(m+1), s * tiny / 2): half a step of the normal numbers, or of
    the subnormals' spacing (e4m3: 2^-9, e5m2: 2^-16) times the tile's scale."""
    x = RNG.standard_normal((6, 12)) * np.exp(2 * RNG.standard_normal((6, 12)))
    q = fp8_quantize(x, fmt, tile)
    x_hat = fp8_dequantize(q)
    r, c = q.tile
    s = np.repeat(np.repeat(q.scales, r, 0), c, 1)[:6, :12]
    bound = np.maximum(np.abs(x) * 2.0 ** -(mant + 1), s * tiny / 2) * (1 + 1e-6)
    assert np.all(np.abs(x - x_hat) <= bound)
    assert np.allclose(fp8_round(x_hat, fmt, tile), x_hat, rtol=1e-6, atol=0)  # idempotent


def test_quantiser_rejects_bad_arguments():
    with pytest.raises(ValueError, match="fmt"):
        fp8_quantize(np.ones(3), "e3m4")
    with pytest.raises(ValueError, match="tile"):
        fp8_quantize(np.ones((2, 3)), "e4m3", (0, 2))
    with pytest.raises(ValueError, match="grad_fmt"):
        FP8Spec(grad_fmt="int8")


def _skip_dy_quantisation(dy, cache):
    """A wrong backward: the float linear's at the quantised operands, dy unquantised."""
    return linear_backward(dy, LinearCache(cache.x, cache.W, cache.has_bias))


def _wgrad_tiles_along_channels(dy, cache):
    from scratchllm.core.fp8 import fp8_linear_backward
    g = fp8_linear_backward(dy, cache)
    x2, dy2 = cache.x.reshape(-1, cache.W.shape[0]), dy.reshape(-1, cache.W.shape[1])
    g["W"] = fp8_round(x2, "e4m3", (1, 4)).T @ fp8_round(dy2, cache.spec.grad_fmt, (1, 4))
    return g


def test_the_straight_through_check_passes_and_fails_a_wrong_backward():
    x, W, b = RNG.standard_normal((2, 3, 10)), RNG.standard_normal((10, 6)), RNG.standard_normal(6)
    spec = FP8Spec(act_tile=4, weight_block=4)
    assert check_fp8_linear(x, W, b, spec=spec, rng=np.random.default_rng(1)).ok
    for wrong in (_skip_dy_quantisation, _wgrad_tiles_along_channels):
        assert check_fp8_linear(x, W, b, spec=spec, rng=np.random.default_rng(1),
                                backward=wrong).failed


def test_finite_differences_through_the_rounding_are_meaningless():
    """Why the check is custom: central differences of sum(dout * y) in x see the steps."""
    x, W = RNG.standard_normal((1, 8)), RNG.standard_normal((8, 3))
    spec = FP8Spec(act_tile=None, weight_block=None)
    dout = RNG.standard_normal((1, 3))
    h = 1e-6
    e = np.zeros_like(x)
    e[0, 3] = h
    fd = (np.sum(dout * fp8_linear_forward(x + e, W, spec=spec)[0])
          - np.sum(dout * fp8_linear_forward(x - e, W, spec=spec)[0])) / (2 * h)
    assert fd == 0.0  # inside one step: the rounding's derivative, not the gradient


def test_the_switch_routes_linear_forward_and_sets_the_fused_twins_aside():
    x, W = RNG.standard_normal((4, 9)).astype(np.float32), RNG.standard_normal((9, 5))
    W = W.astype(np.float32)
    assert fp8_active() is None
    with fp8_matmuls(FP8Spec(act_tile=4, weight_block=4)) as spec:
        y, cache = linear_forward(x, W)
        assert isinstance(cache, FP8LinearCache) and cache.spec is spec and not use_fused()
    assert fp8_active() is None and isinstance(linear_forward(x, W)[1], LinearCache)
    np.testing.assert_array_equal(y, fp8_linear_forward(x, W, spec=spec)[0])
    g = linear_backward(np.ones_like(y), cache)  # outside the block: the cache decides
    assert g["W"].shape == W.shape
    with pytest.raises(TypeError, match="FP8Spec"):
        with fp8_matmuls("e4m3"):
            pass


def test_fp8_linear_module_keeps_float_master_weights():
    lin = FP8Linear(9, 5, bias=True, rng=np.random.default_rng(0))
    x = RNG.standard_normal((2, 9)).astype(np.float32)
    y, cache = lin.forward(x)
    assert lin.W.data.dtype == np.float32 and not np.array_equal(y, x @ lin.W.data + lin.b.data)
    assert np.allclose(y, x @ lin.W.data + lin.b.data, rtol=0.1, atol=0.1)
    lin.backward(np.ones_like(y), cache)
    assert lin.W.grad.shape == (9, 5) and np.allclose(lin.b.grad, 2.0)


def test_the_training_command_does_not_import_ml_dtypes():
    """ml_dtypes comes in with the first FP8 cast, not with the package (its import is about
    0.6 s of every first run's startup)."""
    code = ("import sys, scratchllm.cli.train, scratchllm.core; "
            "print('ml_dtypes' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
