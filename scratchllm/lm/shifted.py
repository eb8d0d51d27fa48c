"""A recurrent mixer on a padded batch (lm/padding.py), as transformers' masked Mamba mixers
run one: apply_mask_to_padding_states (transformers/models/mamba/modeling_mamba.py,
mamba2, jamba) zeroes the padding's inputs before the input projection and after the
convolution, so the state stays 0 until a row's first real token and each real token's
output is the row alone's. Here each row's real tokens move to the front, the mixer runs on
the rows (a causal recurrence never reads a later token: the padding behind them changes
nothing), and the outputs move back; the backward is the inverse gathers around the mixer's
own backward. Block._packed_mixer calls it for a Packing with `keep` (a padded batch).

Glossary: B batch, T padded length, D model width.
"""
from typing import NamedTuple

import numpy as np


class ShiftedCache(NamedTuple):
    """A recurrent mixer's cache on a padded batch run with each row's real tokens moved to
    the front (mix_shifted): the gather that moved them, and the mixer's own cache."""
    src: np.ndarray    # (B, T) the column of the padded row each shifted column came from
    inner: tuple


def mix_shifted(mixer, a, keep):
    """A recurrent mixer (Mamba, Mamba-2) on a padded batch, as transformers' masked mixers
    (apply_mask_to_padding_states: zeros in at the padding, before the input projection and
    after the convolution, so the state stays 0 until the row's first real token): each
    row's real tokens moved to the front, the mixer run on the rows (a causal recurrence
    never reads a later token), the outputs moved back. a (B, T, D), keep (B, T) bool with
    one run of real tokens per row -> (m (B, T, D), ShiftedCache); a real token's output is
    the row alone's; a padding token's is the output at its shifted place (padding reads the
    real tokens before it, never the other way)."""
    T, first = keep.shape[1], np.argmax(keep, axis=1)  # first: (B,) each row's first real
    src = (first[:, None] + np.arange(T)) % T  # (B, T) real tokens first, then the rest
    m, inner = mixer.forward(np.take_along_axis(a, src[..., None], axis=1))  # (B, T, D)
    back = np.argsort(src, axis=1)  # (B, T) the inverse gather
    return np.take_along_axis(m, back[..., None], axis=1), ShiftedCache(src, inner)


def mix_shifted_back(mixer, dm, cache):
    """The backward of mix_shifted: dm (B, T, D) -> da (B, T, D) (the gathers are
    permutations of each row: their backward is the inverse gather)."""
    src, inner = cache
    d_shift = np.take_along_axis(dm, src[..., None], axis=1)  # fwd: m = m_s[back]
    da_s = mixer.backward(d_shift, inner)  # fwd: m_s = mixer(a[src])
    return np.take_along_axis(da_s, np.argsort(src, axis=1)[..., None], axis=1)
