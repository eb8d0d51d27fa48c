"""One Hugging Face tensor as a view of library Params: the Entry of the name tables (names.py,
names_ssm.py) and the three conversions every table shares.

An HF tensor is built from the library Params `lib` by
    1. taking slice [expert] of each (a stacked (E, ...) expert Param, when expert is set),
    2. concatenating them along the last axis (GPT-2's fused c_attn = [q | k | v]),
    3. transposing (torch's nn.Linear weight (out, in) against the library's W (in, out)),
    4. inserting an axis of size 1 at `unsqueeze` (nn.Conv1d's depthwise weight (d, 1, K)
       against the library's (d, K)).
Reading a checkpoint runs the steps backwards; every step is a copy or a view, so a load ->
save round trip is bit-identical.
"""
from typing import NamedTuple

import numpy as np


class Entry(NamedTuple):
    """One HF tensor: its name, the library Params it holds (several = concatenated along the
    last axis), whether it is the transpose of the library's layout, the expert it is a
    slice of (None: the whole Param) and the size-1 axis HF adds (None: none)."""
    hf: str
    lib: tuple
    transpose: bool
    expert: int = None
    unsqueeze: int = None


def _pieces(e, params, attr):
    arrays = [getattr(params[n], attr) for n in e.lib]
    return arrays if e.expert is None else [a[e.expert] for a in arrays]


def hf_shape(e, params):
    """The shape the HF tensor of Entry e has for the model's Params {name: Param}."""
    shapes = [a.shape for a in _pieces(e, params, "data")]
    shape = shapes[0][:-1] + (sum(s[-1] for s in shapes),)
    shape = shape[::-1] if e.transpose else shape
    return shape if e.unsqueeze is None else shape[:e.unsqueeze] + (1,) + shape[e.unsqueeze:]


def to_hf(e, params, attr="data"):
    """The HF tensor of Entry e from the Params' `attr` ("data" or "grad"), contiguous."""
    parts = _pieces(e, params, attr)
    a = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)
    a = a.T if e.transpose else a
    return np.ascontiguousarray(a if e.unsqueeze is None else np.expand_dims(a, e.unsqueeze))


def from_hf(e, array, params, dtype):
    """Write the HF tensor `array` (of shape hf_shape(e, params)) into the Params, as dtype."""
    array = array if e.unsqueeze is None else np.squeeze(array, axis=e.unsqueeze)
    array = array.T if e.transpose else array
    parts = [params[n] for n in e.lib]
    widths = [a.shape[-1] for a in _pieces(e, params, "data")]
    for p, piece in zip(parts, np.split(array, np.cumsum(widths)[:-1], axis=-1)):
        if e.expert is None:
            p.data = np.ascontiguousarray(piece, dtype=dtype)
        else:
            if p.data.dtype != dtype:
                p.data = p.data.astype(dtype)
            p.data[e.expert] = piece
