"""T5's relative position bias: the buckets equal transformers' (offsets -700..700 for several
bucket geometries: tests/fixtures/hf/t5_buckets, tools/make_hf_fixtures_encoders.py), a
decoding query at offset t gets row t of the full table, and the table's gradient (the
grads case relative_bias, also through unscaled attention)."""
from pathlib import Path

import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import relative_bias_forward, relative_position_buckets
from scratchllm.specs import RelativeBiasSpec

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "t5_buckets" / "expected.npz"


def test_buckets_equal_transformers():
    ref = dict(np.load(FIXTURE))
    assert len(ref) == 5
    for key, want in ref.items():
        nb, md, bi = (int(v) for v in key.split("_"))
        spec = RelativeBiasSpec(nb, md, bool(bi))
        got = relative_position_buckets(1, 1401, spec=spec, offset=700)  # offsets -700..700
        assert np.array_equal(got, want), key


def test_a_decoding_query_gets_its_row_of_the_full_bias():
    spec = RelativeBiasSpec(8, 12, bidirectional=False)
    table = np.random.default_rng(0).standard_normal((8, 3))
    full, _ = relative_bias_forward(table, spec=spec, Tq=9, Tk=9)  # (1, 3, 9, 9)
    for t in range(9):
        row, _ = relative_bias_forward(table, spec=spec, Tq=1, Tk=t + 1, offset=t)
        assert np.array_equal(row[0, :, 0], full[0, :, t, :t + 1])


def test_spec_refuses_a_max_distance_inside_the_exact_buckets():
    with pytest.raises(ValueError, match="max_distance"):
        RelativeBiasSpec(32, 8)


def test_table_gradient():
    for report in CASES["relative_bias"](np.random.default_rng(0)):
        assert report.ok, f"\n{report}"
