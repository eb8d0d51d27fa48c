"""quantize: round trips within each format's bound, fp8 codes equal ml_dtypes' casts, int4
codes packed two per byte exactly."""
import ml_dtypes
import numpy as np
import pytest

from scratchllm.serve import error_bound, quantize
from scratchllm.serve.quantize import e4m3_to_float16


def _x(shape=(3, 4, 5, 64), seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape) * np.exp(rng.standard_normal(shape[:-1] + (1,)))


@pytest.mark.parametrize("fmt, group", [("int8", None), ("int8", 16), ("fp8", None),
                                        ("fp8", 8), ("int4", None), ("int4", 4)])
def test_round_trip_within_the_bound(fmt, group):
    x = _x()
    q = quantize(x, fmt, group_size=group)
    y = q.dequantize()
    assert y.dtype == x.dtype and y.shape == x.shape
    assert np.all(np.abs(x - y) <= error_bound(x, q) * (1 + 1e-6) + 1e-12)
    s = np.repeat(q.scales, q.group_size, axis=-1)
    half = {"int8": 1 / 254, "fp8": 1 / 32, "int4": 1 / 14}[fmt]  # bound / group max
    assert np.abs(x - y).max() <= half * np.abs(x).max()
    assert np.abs(x - y).max() > 0 and s.shape == x.shape


def test_a_wrong_rounding_breaks_the_bound():
    x = _x(seed=1)
    q = quantize(x, "int8")
    shifted = q._replace(codes=np.clip(q.codes.astype(np.int16) + 1, -127, 127).astype(np.int8))
    assert not np.all(np.abs(x - shifted.dequantize()) <= error_bound(x, q) + 1e-12)


def test_fp8_codes_equal_ml_dtypes_casts():
    x = _x((6, 32), seed=2).astype(np.float32)
    q = quantize(x, "fp8")
    assert q.codes.dtype == ml_dtypes.float8_e4m3fn
    want = (x / q.scales).astype(ml_dtypes.float8_e4m3fn)
    np.testing.assert_array_equal(q.codes.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(np.abs(q.codes.astype(np.float32)).max(axis=-1), 448.0)
    np.testing.assert_array_equal(q.dequantize(),
                                  q.codes.astype(np.float32) * q.scales)


def test_int4_packs_two_codes_per_byte_exactly():
    x = np.array([[-3.5, 3.5, 0, -0.5, 1.5, -2, 2.5, 0.5]])  # max |x| = 3.5 = 7 s: s = 0.5
    q = quantize(x, "int4", group_size=8)
    assert q.codes.dtype == np.uint8 and q.codes.shape == (1, 4) and q.scales[0, 0] == 0.5
    codes = np.array([-7, 7, 0, -1, 3, -4, 5, 1]) + 8
    np.testing.assert_array_equal(q.codes[0], codes[0::2] | (codes[1::2] << 4))
    np.testing.assert_array_equal(q.dequantize(), (codes - 8)[None] * 0.5)
    assert q.nbytes == 4 + 4


def test_zero_groups_and_bad_arguments():
    q = quantize(np.zeros((2, 8)), "int8")
    np.testing.assert_array_equal(q.dequantize(), 0.0)
    with pytest.raises(ValueError, match="fmt must be one of"):
        quantize(np.ones((2, 8)), "int2")
    with pytest.raises(ValueError, match="even"):
        quantize(np.ones((2, 9)), "int4", group_size=3)
    with pytest.raises(ValueError, match="divide"):
        quantize(np.ones((2, 8)), "int8", group_size=3)


def test_the_fp8_bit_move_reads_every_finite_code_exactly():
    b = np.arange(256, dtype=np.uint8)
    want = b.view(ml_dtypes.float8_e4m3fn).astype(np.float64)  # (256,)
    got = e4m3_to_float16(b).astype(np.float64) * 256
    finite = ~np.isnan(want)
    assert finite.sum() == 254
    np.testing.assert_array_equal(got[finite], want[finite])
