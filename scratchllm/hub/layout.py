"""One Hugging Face tensor as a view of library arrays: the Entry that every family's names()
gives (families/), and the three conversions they share.

An HF tensor is built from the library arrays `lib` (Params, or buffers) by
    1. taking slice [expert] of each (a stacked (E, ...) expert Param, when expert is set),
    2. concatenating them along the last axis (GPT-2's fused c_attn = [q | k | v]), or group
       by group when `groups` is set: each array's last axis is that many equal runs, and
       the tensor holds run g of every array before run g + 1 (Qwen3-Next's q_proj, query
       and gate head by head, and its in_proj_qkvz, q, k, v, z key-head group by group),
    3. transposing (torch's nn.Linear weight (out, in) against the library's W (in, out)),
    4. inserting an axis of size 1 at `unsqueeze` (nn.Conv1d's depthwise weight (d, 1, K)
       against the library's (d, K)), or reshaping to `reshape` (nn.Conv2d's patch weight
       (D, C, P, P) against the library's flattened-patch map (C*P*P, D), transposed).
Reading a checkpoint runs the steps backwards; every step is a copy or a view, so a load ->
save round trip is bit-identical.
"""
from typing import NamedTuple

import numpy as np


class Entry(NamedTuple):
    """One HF tensor: its name, the library arrays it holds (several = concatenated along the
    last axis), whether it is the transpose of the library's layout, the expert it is a slice
    of (None: the whole array), the size-1 axis HF adds (None: none), and whether the library
    name is a buffer (no gradient: DeepSeek-V3's e_score_correction_bias) rather than a Param,
    and the HF tensor's shape when it is the (transposed) array reshaped (None: no reshape),
    and the factor the library holds the tensor times (RWKV's output weights divided by
    2^(i // rescale_every) on load, as transformers' inference; its gradient is the
    library's times the factor), and the number of groups the concatenation interleaves
    (None: one after the other); copy: a second tensor of arrays another Entry names
    (DeepSeek-V3's MTP layers store the embedding and head again): written on saving, never
    read into the arrays."""
    hf: str
    lib: tuple
    transpose: bool
    expert: int = None
    unsqueeze: int = None
    buffer: bool = False
    reshape: tuple = None
    scale: float = 1.0
    groups: int = None
    copy: bool = False


def _pieces(e, arrays):
    """Views of the library arrays {name: array} that Entry e holds."""
    parts = [arrays[n] for n in e.lib]
    return parts if e.expert is None else [a[e.expert] for a in parts]


def hf_shape(e, arrays):
    """The shape the HF tensor of Entry e has for the library arrays {name: array}."""
    shapes = [a.shape for a in _pieces(e, arrays)]
    shape = shapes[0][:-1] + (sum(s[-1] for s in shapes),)
    shape = shape[::-1] if e.transpose else shape
    if e.reshape is not None:
        return e.reshape
    return shape if e.unsqueeze is None else shape[:e.unsqueeze] + (1,) + shape[e.unsqueeze:]


def to_hf(e, arrays, grad=False):
    """The HF tensor of Entry e from the library arrays (weights, or gradients with grad),
    contiguous."""
    parts = _pieces(e, arrays)
    if e.groups is not None:  # run g of every part, then run g + 1: (..., groups, sum) flat
        a = np.concatenate([p.reshape(p.shape[:-1] + (e.groups, -1)) for p in parts], axis=-1)
        a = a.reshape(a.shape[:-2] + (-1,))
    else:
        a = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)
    if e.scale != 1.0:  # the library holds w * scale: dL/dw = scale dL/d(w * scale)
        a = a * np.asarray(e.scale if grad else 1 / e.scale, a.dtype)
    a = a.T if e.transpose else a
    a = a if e.reshape is None else np.ascontiguousarray(a).reshape(e.reshape)
    return np.ascontiguousarray(a if e.unsqueeze is None else np.expand_dims(a, e.unsqueeze))


def from_hf(e, array, arrays):
    """Write the HF tensor `array` (of shape hf_shape(e, arrays)) into the library arrays in
    place, cast to their dtype."""
    array = array if e.unsqueeze is None else np.squeeze(array, axis=e.unsqueeze)
    parts = _pieces(e, arrays)
    if e.reshape is not None:  # the library's shape, transposed when the tensor is
        shape = parts[0].shape[:-1] + (sum(a.shape[-1] for a in parts),)
        array = array.reshape(shape[::-1] if e.transpose else shape)
    array = array.T if e.transpose else array
    array = array if e.scale == 1.0 else np.asarray(array, np.float64) * e.scale
    widths = [a.shape[-1] // (e.groups or 1) for a in parts]
    if e.groups is not None:  # (..., groups, sum of the runs)
        array = array.reshape(array.shape[:-1] + (e.groups, -1))
    for a, piece in zip(parts, np.split(array, np.cumsum(widths)[:-1], axis=-1)):
        a[...] = piece.reshape(a.shape)


def whole_target(e, arrays):
    """The one library array (or expert slice) that Entry e's HF tensor is, element for
    element in the same order (no concatenation, transpose, axis, reshape, scale or groups),
    so a loader may read the tensor straight into it; None when it must go through from_hf."""
    if len(e.lib) != 1 or e.transpose or e.unsqueeze is not None or e.reshape is not None \
            or e.scale != 1.0 or e.groups is not None:
        return None
    return _pieces(e, arrays)[0]
