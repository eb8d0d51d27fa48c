"""Rotary position embeddings (RoPE, Su et al. 2021, arXiv 2104.09864) and the context-extension
scalings of HF transformers' `modeling_rope_utils`: linear (position interpolation, Chen et al.
2023), dynamic NTK, YaRN (Peng et al. 2023, arXiv 2309.00071) and Llama 3.1.

Math: pair i of a head vector is rotated by the angle p * inv_freq[i] at position p,
    inv_freq[i] = base^(-2i/Dh),   (y1, y2) = af * (x1 cos - x2 sin, x2 cos + x1 sin)
with af the attention factor (YaRN's sqrt(1/t); 1 otherwise). Because q and k are both
rotated, q_m . k_n depends on m - n only, and the logits are scaled by af^2.
Pairing styles: "half" pairs (i, i + Dh/2) (HF rotate_half, GPT-NeoX);
"interleaved" pairs (2i, 2i + 1) (RoFormer, Meta's Llama, DeepSeek's reference code).
Backward: a rotation is orthogonal, so dx is dy rotated by -theta (times af).
At run time RoPE is a Rope (inv_freq, style, attention_factor, positions): make_rope builds it
from a model's RopeSpec (scratchllm.specs) for the positions of one call, and rope_forward(x,
rope) applies it.

Glossary: B batch, T time, Dh head (rotary) dim, P = Dh/2 pairs, s scaling factor,
L0 original (pre-training) context length.
"""
import math
from typing import NamedTuple

import numpy as np

from scratchllm.core.validate import (expect_dout, expect_finite, expect_float, expect_int,
                                      expect_integer)
from scratchllm.specs.attention import rope_scaling_params


# ---------------------------------------------------------------------------- frequencies
def _default_inv_freq(dim, base):
    """inv_freq[i] = base^(-2i/dim), i = 0..dim/2-1, float64."""
    return 1.0 / base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)  # (P,)


def _check_scaling(scaling):
    """Return (rope_type, params) after checking the type, the keys and the required ones
    (the keys of each rope_type: specs.attention.ROPE_SCALINGS)."""
    if not isinstance(scaling, dict):
        raise TypeError(f"rope_frequencies: scaling must be a dict or None, got "
                        f"{type(scaling).__name__}")
    try:
        return rope_scaling_params(scaling)
    except ValueError as e:
        raise ValueError(f"rope_frequencies: {e}") from None


def get_mscale(s, m=1.0):
    """YaRN's sqrt(1/t) = 0.1 m ln(s) + 1 for s > 1 (else 1). s = 40 -> 1.3689."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


def _yarn(dim, base, p):
    """HF `_compute_yarn_parameters`: blend interpolated (theta/s) and original (theta)
    frequencies by a linear ramp over the pair index between the correction dims."""
    s, L0 = p["factor"], p["original_max_position_embeddings"]
    af, m, m_all = p.get("attention_factor"), p.get("mscale"), p.get("mscale_all_dim")
    if af is None:
        af = get_mscale(s, m) / get_mscale(s, m_all) if (m and m_all) else get_mscale(s)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def correction_dim(n_rot):  # pair index whose wavelength turns n_rot times over L0
        return dim * math.log(L0 / (n_rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)  # HF clamps with dim - 1, not dim/2 - 1
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)  # (P,) 0 = keep, 1 = /s
    theta = _default_inv_freq(dim, base)  # (P,)
    return theta / s * ramp + theta * (1 - ramp), float(af)  # (P,)


def _llama3(dim, base, p):
    """HF `_compute_llama3_parameters`: wavelengths > L0/low_freq_factor are divided by s,
    < L0/high_freq_factor kept, in between blended smoothly."""
    s, lo, hi = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    L0 = p["original_max_position_embeddings"]
    theta = _default_inv_freq(dim, base)  # (P,)
    wavelen = 2 * math.pi / theta  # (P,)
    smooth = (L0 / wavelen - lo) / (hi - lo)  # (P,)
    blended = (1 - smooth) * theta / s + smooth * theta  # (P,)
    out = np.where(wavelen > L0 / lo, theta / s, theta)  # (P,)
    medium = (wavelen >= L0 / hi) & (wavelen <= L0 / lo)
    return np.where(medium, blended, out), 1.0  # (P,)


def rope_frequencies(head_dim, base=10000.0, scaling=None, seq_len=None):
    """The rotary frequencies and attention factor, as HF's ROPE_INIT_FUNCTIONS compute them.

    Inputs:  head_dim (even int), base (rope_theta), scaling: None or a config.json
             `rope_scaling` dict {"rope_type": "linear"|"dynamic"|"yarn"|"llama3", "factor":
             ...}. Since there is no config here, `original_max_position_embeddings` is
             required for dynamic/yarn/llama3 (for dynamic it plays HF's
             config.max_position_embeddings). seq_len: current length (dynamic only).
    Returns: (inv_freq (head_dim/2,) float64, attention_factor float).
    """
    if not isinstance(head_dim, (int, np.integer)) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope_frequencies: head_dim must be a positive even int, got "
                         f"{head_dim!r}")
    expect_finite("rope_frequencies", "base", base, 0, open_low=True)
    if scaling is None:
        return _default_inv_freq(head_dim, base), 1.0
    rope_type, p = _check_scaling(scaling)
    if rope_type == "default":
        return _default_inv_freq(head_dim, base), 1.0
    expect_finite("rope_frequencies", "scaling['factor']", p["factor"], 0, open_low=True)
    if rope_type == "linear":
        return _default_inv_freq(head_dim, base) / p["factor"], 1.0
    if rope_type == "dynamic":
        if seq_len is None:
            raise ValueError("rope_frequencies: rope_type 'dynamic' needs seq_len")
        expect_integer("rope_frequencies", "seq_len", seq_len, 0)
        L0, s = p["original_max_position_embeddings"], p["factor"]
        L = max(seq_len, L0)
        base = base * (s * L / L0 - (s - 1)) ** (head_dim / (head_dim - 2))
        return _default_inv_freq(head_dim, base), 1.0
    if rope_type == "yarn":
        return _yarn(head_dim, base, p)
    return _llama3(head_dim, base, p)


# ---------------------------------------------------------------------------- run time
class Rope(NamedTuple):
    """What rotating one call's heads takes: a RopeSpec made concrete for its positions."""
    inv_freq: np.ndarray  # (Dh/2,) float64, from rope_frequencies
    style: str  # "half" | "interleaved"
    attention_factor: float  # af (YaRN's sqrt(1/t); 1 otherwise)
    positions: np.ndarray  # (T,) or (B, T) ints; M-RoPE: (3, T) or (3, B, T)
    rotary: int = None  # the rotated width Dr = 2 len(inv_freq) < Dh (partial RoPE), None: Dh
    sections: tuple = None  # M-RoPE: pairs per position section (RopeSpec.mrope_section)


def make_rope(spec, head_dim, positions, seq_len=None):
    """The Rope of a RopeSpec (base, scaling, style) for heads of head_dim at `positions`.

    Inputs:  spec a RopeSpec; head_dim the head dim (Dh, or MLA's dr); positions (T,) or
             (B, T) ints; seq_len the length dynamic NTK scales for (default max(positions)
             + 1, the length seen so far).
    Returns: Rope(inv_freq (Dr/2,), spec.style, attention_factor, positions, rotary,
             spec.mrope_section) with Dr = rotary_dim(spec, head_dim): the first Dr numbers of
             a head turn (HF's partial_rotary_factor, spec.partial), rotary None when Dr =
             head_dim. M-RoPE positions are (3, T) or (3, B, T); (T,) ones become three equal
             rows (text only), (B, T) ones must be given as (3, B, T). spec.axial: each
             section's pairs have the frequencies of a head of twice its size (the same
             ramp for the height and the width rows of a 2-D grid).
    """
    positions = np.asarray(positions)
    if spec.mrope_section is not None and positions.ndim == 1:  # text only: 3 equal rows
        positions = np.broadcast_to(positions, (3,) + positions.shape)  # (3, T)
    if seq_len is None and positions.size:
        seq_len = int(positions.max()) + 1
    Dr = rotary_dim(spec, head_dim)
    inv_freq, af = rope_frequencies(Dr, spec.base, spec.scaling, seq_len)  # (Dr/2,)
    if spec.axial:  # each section n restarts: base^(-2j / 2n), j < n (Qwen2-VL's tower)
        inv_freq = np.concatenate([_default_inv_freq(2 * n, spec.base)
                                   for n in spec.mrope_section])  # (sum n,)
    return Rope(inv_freq, spec.style, af, positions, None if Dr == head_dim else Dr,
                spec.mrope_section)


def rotary_dim(spec, head_dim):
    """Dr = int(head_dim * spec.partial), the rotated numbers of a head (transformers'
    int(head_dim * partial_rotary_factor)); ValueError unless it is even and >= 2."""
    Dr = int(head_dim * spec.partial)
    if Dr < 2 or Dr % 2:
        raise ValueError(f"rope: partial={spec.partial} of head_dim={head_dim} rotates "
                         f"{Dr} numbers; RoPE turns pairs: it must be even and >= 2")
    return Dr


def row_rope(fn, spec, head_dim, position):
    """The Rope of one decoding step at `position`: an int ([position]), or (B,) ints, one per
    row ((B, 1) positions). Dynamic NTK scales by the length seen, so rows of different
    lengths under "dynamic" scaling are refused (each would need its own frequencies)."""
    if np.ndim(position) == 0:
        return make_rope(spec, head_dim, np.array([position]), position + 1)
    pos = np.asarray(position)
    dynamic = spec.scaling is not None and rope_scaling_params(spec.scaling)[0] == "dynamic"
    if dynamic and (pos != pos[0]).any():
        raise ValueError(f"{fn}: dynamic RoPE scaling depends on each sequence's length; rows "
                         f"at different positions {pos.tolist()} cannot share one step")
    return make_rope(spec, head_dim, pos[:, None], int(pos.max()) + 1)


# ---------------------------------------------------------------------------- rotation
class RopeCache(NamedTuple):
    cos: np.ndarray
    sin: np.ndarray
    style: str
    shape: tuple  # x's (and y's) shape


def _rotate(x, cos, sin, style):
    """Rotate each pair of x by the angles whose (af-scaled) cos, sin are given."""
    y = np.empty(x.shape, dtype=x.dtype)  # (..., T, Dh)
    if style == "half":
        P = x.shape[-1] // 2
        x1, x2, y1, y2 = x[..., :P], x[..., P:], y[..., :P], y[..., P:]  # (..., T, P) views
    else:
        x1, x2, y1, y2 = x[..., 0::2], x[..., 1::2], y[..., 0::2], y[..., 1::2]  # (.., T, P)
    np.subtract(x1 * cos, x2 * sin, out=y1)
    np.add(x2 * cos, x1 * sin, out=y2)
    return y


def rope_angles(rope, x_ndim, dtype):
    """cos and sin (times af) of rope.positions * rope.inv_freq, shaped to broadcast against x.

    positions (T,) -> (T, P); positions (B, T) -> (B, 1, ..., 1, T, P) for x of x_ndim axes.
    (T,) positions' tables are kept by value (_ANGLES): a training step's layers, q and k, and
    both data-parallel shards ask the same ones (80 us each at T = 128), and share them.
    M-RoPE (rope.sections): positions (3, T) or (3, B, T); pair i of section s takes the
    angle of position row s mod 3 (Qwen2VLRotaryEmbedding.recomposition_frequencies).
    """
    expect_int("rope", "positions", rope.positions)
    pos = np.asarray(rope.positions)
    af = expect_finite("rope", "attention_factor", rope.attention_factor, 0, open_low=True)
    key = None
    if pos.ndim == 1 and pos.size <= 8192 and rope.sections is None:  # a step's every layer
        key = (pos.tobytes(), pos.dtype.str, np.asarray(rope.inv_freq).tobytes(),  # asks
               np.asarray(rope.inv_freq).dtype.str, af, np.dtype(dtype).str)  # the same
        if key in _ANGLES:
            return _ANGLES[key]
    ang = pos[..., None].astype(np.float64) * rope.inv_freq  # (T, P) or (B, T, P)
    if rope.sections is not None:  # ang (3, [B,] T, P): one angle table per position row
        row = np.repeat(np.arange(len(rope.sections)) % 3, rope.sections)  # (P,)
        ang = ang[row, ..., np.arange(len(row))]  # (P, [B,] T)
        ang = np.moveaxis(ang, 0, -1)  # ([B,] T, P)
        pos = pos[0]
    if pos.ndim == 2:
        ang = ang.reshape(ang.shape[:1] + (1,) * (x_ndim - 3) + ang.shape[1:])  # (B,1..,T,P)
    cos = (np.cos(ang) * af).astype(dtype)  # (..., T, P)
    sin = (np.sin(ang) * af).astype(dtype)  # (..., T, P)
    if key is not None:
        if len(_ANGLES) >= 64:  # decoding asks new positions every step: keep a few
            _ANGLES.clear()
        _ANGLES[key] = cos, sin
    return cos, sin


_ANGLES = {}  # rope_angles of (T,) positions, by their numbers: (cos, sin), read, never
#               written by the rotations (the Numba kernels take them writable: one compile)


def check_rope(fn, rope, Dh):
    """rope is a Rope whose style is known and whose inv_freq has Dh/2 entries, Dh even (or,
    for partial RoPE, rope.rotary/2 entries with rope.rotary < Dh)."""
    if not isinstance(rope, Rope):
        raise TypeError(f"{fn}: rope must be a Rope (make_rope), got {type(rope).__name__}")
    if rope.style not in ("half", "interleaved"):
        raise ValueError(f"{fn}: rope.style must be 'half' or 'interleaved', got "
                         f"{rope.style!r}")
    expect_float(fn, "rope.inv_freq", rope.inv_freq)
    expect_int(fn, "rope.positions", rope.positions)
    P = rope.inv_freq.shape[0] if rope.inv_freq.ndim == 1 else None
    if rope.sections is not None and sum(rope.sections) != P:
        raise ValueError(f"{fn}: rope.sections {rope.sections} (mrope_section) sum to "
                         f"{sum(rope.sections)}, expected {P} pairs (len(rope.inv_freq))")
    if rope.rotary is not None:  # partial RoPE: the first rope.rotary numbers turn
        if rope.inv_freq.shape != (rope.rotary // 2,) or rope.rotary % 2 or rope.rotary >= Dh:
            raise ValueError(f"{fn}: rope.rotary={rope.rotary} must be even and < Dh = {Dh}, "
                             f"with rope.inv_freq of shape ({rope.rotary // 2},), got "
                             f"{rope.inv_freq.shape}")
        return
    if rope.inv_freq.shape != (Dh // 2,) or Dh % 2:
        raise ValueError(f"{fn}: rope.inv_freq has shape {rope.inv_freq.shape}, expected "
                         f"({Dh // 2},) for an even head dim Dh = {Dh}")


def rope_forward(x, rope):
    """Rotate the pairs of x by position * inv_freq, scaled by the attention factor.

    Inputs:  x (..., T, Dh) float; rope a Rope: inv_freq (Dh/2,) from rope_frequencies,
             style "half" | "interleaved", attention_factor, positions (T,) or (B, T) ints
             (then x is (B, ..., T, Dh)); with rope.rotary = Dr < Dh only the first Dr
             numbers of each head turn (partial RoPE), the rest pass unchanged.
    Returns: y (..., T, Dh), x's dtype.  Cache: (cos, sin, style), af folded into cos, sin.
    """
    expect_float("rope", "x", x, 2)
    T, Dh = x.shape[-2:]
    check_rope("rope", rope, Dh)
    pos = np.asarray(rope.positions)
    if rope.sections is not None:
        if pos.ndim not in (2, 3) or pos.shape[0] != 3:
            raise ValueError(f"rope: M-RoPE positions have shape {pos.shape}, expected (3, {T}) "
                             f"or (3, B, {T}) (temporal, height, width rows)")
        pos = pos[0]
    if pos.ndim not in (1, 2) or pos.shape[-1] != T or (pos.ndim == 2 and (
            x.ndim < 3 or pos.shape[0] != x.shape[0])):
        raise ValueError(f"rope: rope.positions has shape {pos.shape}, expected ({T},) or "
                         f"(B, {T}) with B = x.shape[0] (x has shape {x.shape})")
    cos, sin = rope_angles(rope, x.ndim, x.dtype)  # (..., T, P)
    cache = RopeCache(cos, sin, rope.style, x.shape)
    if rope.rotary is not None:  # partial: turn the first Dr numbers, pass the rest
        Dr = rope.rotary
        return np.concatenate([_rotate(x[..., :Dr], cos, sin, rope.style), x[..., Dr:]],
                              axis=-1), cache  # (..., T, Dh)
    return _rotate(x, cos, sin, rope.style), cache


def rope_backward(dout, cache):
    """Math: y = af R(theta) x with R orthogonal -> dx = af R(theta)^T dy = af R(-theta) dy,
    i.e. the same rotation with sin negated (for "half": dy*cos - rotate_half(dy*sin)).
    Reference: Su et al. 2021 (arXiv 2104.09864) §3.4; huggingface/transformers
    src/transformers/models/llama/modeling_llama.py apply_rotary_pos_emb.
    """
    cos, sin, style, shape = cache
    expect_dout("rope_backward", dout, shape, cos.dtype)
    Dr = 2 * cos.shape[-1]
    if Dr < shape[-1]:  # partial RoPE: the passed numbers' gradient passes too
        return {"x": np.concatenate([_rotate(dout[..., :Dr], cos, -sin, style),
                                     dout[..., Dr:]], axis=-1)}  # (..., T, Dh)
    return {"x": _rotate(dout, cos, -sin, style)}  # (..., T, Dh)
