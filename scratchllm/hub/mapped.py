"""A safetensors file read without a second copy of its tensors.

The format (huggingface/safetensors, README "Format"): 8 bytes, a little-endian u64 N; N
bytes of UTF-8 JSON, {tensor name: {"dtype": "F32", "shape": [...], "data_offsets": [begin,
end]}, optionally "__metadata__": {str: str}}; then the byte buffer, the offsets counted from
its start, each tensor C-ordered little-endian.

`MappedSafetensors` memory-maps the file: `view(name)` is a read-only array over the mapped
bytes (nothing is read before it is touched), `read_into(name, out)` reads a tensor straight
into an array of its dtype and shape (the model's own weight: no buffer between), and
`release(name)` drops the tensor's mapped pages from this process's memory once it has been
copied (they stay in the OS's page cache). Loading a checkpoint this way holds the model's
weights plus the tensor in flight, not a second model: safetensors' own `get_tensor` returns
a fresh array per tensor, and the freed arrays stay in the process's heap.
"""
import json
import mmap
import os

import ml_dtypes
import numpy as np

__all__ = ["MappedSafetensors", "SAFETENSORS_DTYPES"]

SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
                      "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32,
                      "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


class MappedSafetensors:
    """One safetensors file, memory-mapped; a context manager (the map closes on exit)."""

    def __init__(self, path):
        self.path = str(path)
        self._file = open(self.path, "rb")
        try:
            self._header, self._start = self._read_header()
            size = os.fstat(self._file.fileno()).st_size
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size \
                else None
        except BaseException:
            self._file.close()
            raise

    def _bad(self, what):
        return ValueError(f"MappedSafetensors: {self.path}: {what}")

    def _read_header(self):
        head = self._file.read(8)
        size = os.fstat(self._file.fileno()).st_size
        if len(head) < 8:
            raise self._bad(f"{size} bytes, fewer than the 8 of the header's length")
        n = int.from_bytes(head, "little")
        if n > size - 8:
            raise self._bad(f"the header claims {n:,} bytes, the file has {size - 8:,} after "
                            f"its length")
        try:
            header = json.loads(self._file.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise self._bad(f"the header is not JSON ({e})") from None
        if not isinstance(header, dict):
            raise self._bad(f"the header is a JSON {type(header).__name__}, expected an object")
        header.pop("__metadata__", None)
        start = 8 + n
        for name, info in header.items():
            self._check(name, info, size - start)
        return header, start

    def _check(self, name, info, n_bytes):
        """A tensor entry: a known dtype, a shape of ints >= 0, offsets inside the buffer that
        hold exactly shape's elements."""
        if not isinstance(info, dict) or info.get("dtype") not in SAFETENSORS_DTYPES:
            got = info.get("dtype") if isinstance(info, dict) else info
            raise self._bad(f"tensor {name!r}: dtype {got!r} is not one of "
                            f"{sorted(SAFETENSORS_DTYPES)}")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not isinstance(shape, list) or any(type(d) is not int or d < 0 for d in shape):
            raise self._bad(f"tensor {name!r}: shape {shape!r} is not a list of ints >= 0")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(
                type(o) is int for o in offsets) and 0 <= offsets[0] <= offsets[1] <= n_bytes):
            raise self._bad(f"tensor {name!r}: data_offsets {offsets!r} are not [begin, end] "
                            f"inside the {n_bytes:,}-byte buffer")
        itemsize = np.dtype(SAFETENSORS_DTYPES[info["dtype"]]).itemsize
        want = int(np.prod(shape, dtype=np.int64)) * itemsize
        if offsets[1] - offsets[0] != want:
            raise self._bad(f"tensor {name!r}: {offsets[1] - offsets[0]:,} bytes for shape "
                            f"{tuple(shape)} of {info['dtype']}, expected {want:,}")

    def keys(self):
        return list(self._header)

    def _info(self, name):
        try:
            info = self._header[name]
        except KeyError:
            raise KeyError(f"MappedSafetensors: {self.path} has no tensor {name!r}") from None
        return (np.dtype(SAFETENSORS_DTYPES[info["dtype"]]), tuple(info["shape"]),
                self._start + info["data_offsets"][0], self._start + info["data_offsets"][1])

    def dtype_shape(self, name):
        """(dtype, shape) of a tensor, from the header (nothing read)."""
        return self._info(name)[:2]

    def view(self, name):
        """The tensor as a read-only array over the map (pages read when touched)."""
        dtype, shape, begin, end = self._info(name)
        if begin == end:
            return np.zeros(shape, dtype)
        return np.frombuffer(self._map, dtype=dtype, count=(end - begin) // dtype.itemsize,
                             offset=begin).reshape(shape)

    def read_into(self, name, out):
        """Read a tensor straight into `out` (a C-contiguous array of its dtype and shape)."""
        dtype, shape, begin, end = self._info(name)
        if out.dtype != dtype or out.shape != shape or not out.flags.c_contiguous:
            raise ValueError(f"MappedSafetensors.read_into: {name!r} is {dtype} {shape}; out "
                             f"must be a C-contiguous {dtype} array of that shape, got "
                             f"{out.dtype} {out.shape}")
        buf, done = memoryview(out.reshape(-1).view(np.uint8)), 0
        while done < end - begin:
            got = os.preadv(self._file.fileno(), [buf[done:]], begin + done)
            if got <= 0:
                raise self._bad(f"tensor {name!r}: the file ended {end - begin - done:,} bytes "
                                f"early")
            done += got

    def release(self, name):
        """Drop the tensor's mapped pages from this process's resident memory."""
        _, _, begin, end = self._info(name)
        page = mmap.PAGESIZE
        lo, hi = begin // page * page, -(-end // page) * page
        if self._map is not None and hi > lo and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, lo, min(hi, len(self._map)) - lo)

    def close(self):
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # a view is still alive: the map closes when it dies
                pass
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
