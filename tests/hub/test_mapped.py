"""MappedSafetensors reads what safetensors wrote (every dtype the library loads), straight
into an array or as a view over the map, and refuses a damaged file naming what is wrong."""
import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from scratchllm.hub.mapped import MappedSafetensors

TENSORS = {"a": np.arange(12, dtype=np.float32).reshape(3, 4),
           "b": np.linspace(-2, 2, 5).astype(ml_dtypes.bfloat16),
           "c": np.ones((2, 0), np.float16), "d": np.arange(3, dtype=np.int64)}


def test_views_and_reads_equal_what_was_saved(tmp_path):
    save_file(TENSORS, str(tmp_path / "m.safetensors"), metadata={"format": "np"})
    with MappedSafetensors(tmp_path / "m.safetensors") as f:
        assert sorted(f.keys()) == sorted(TENSORS)
        for name, want in TENSORS.items():
            assert f.dtype_shape(name) == (want.dtype, want.shape)
            got = f.view(name)
            assert got.dtype == want.dtype and np.array_equal(got, want)
            out = np.empty_like(want)
            f.read_into(name, out)
            assert np.array_equal(out, want)
            del got
            f.release(name)
        with pytest.raises(ValueError, match="must be a C-contiguous float32"):
            f.read_into("a", np.empty((4, 3), np.float32))
        with pytest.raises(KeyError, match="no tensor 'z'"):
            f.view("z")


def _write(path, header, payload=b""):
    blob = json.dumps(header).encode()
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + payload)


@pytest.mark.parametrize("header, payload, match", [
    ({"a": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}}, b"0000", "dtype 'F99'"),
    ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"0000", "shape"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"0000", "data_offsets"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"0000", "expected 8"),
    ([1, 2], b"", "JSON list"),
])
def test_a_damaged_file_is_refused_by_name(tmp_path, header, payload, match):
    _write(tmp_path / "bad.safetensors", header, payload)
    with pytest.raises(ValueError, match=match):
        MappedSafetensors(tmp_path / "bad.safetensors")


def test_a_truncated_header_is_refused(tmp_path):
    (tmp_path / "t.safetensors").write_bytes((1000).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValueError, match="header claims 1,000 bytes"):
        MappedSafetensors(tmp_path / "t.safetensors")
