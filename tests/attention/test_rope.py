"""RoPE: the relative-position property, the two pairing styles, the HF scalings' numbers."""
import math

import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import (Rope, get_mscale, make_rope, rope_backward, rope_forward,
                                  rope_frequencies)
from scratchllm.specs import RopeSpec

YARN_V3 = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096}
LLAMA31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def test_gradient_check():
    for report in CASES["rope"](np.random.default_rng(0)):
        assert report.ok, str(report)


@pytest.mark.parametrize("style", ["half", "interleaved"])
@pytest.mark.parametrize("scaling", [None, YARN_V3])
def test_relative_position_property(style, scaling):
    """q_m . k_n depends only on m - n (for any frequencies), and not only trivially."""
    rng = np.random.default_rng(1)
    inv_freq, af = rope_frequencies(16, scaling=scaling)
    q, k = rng.standard_normal((1, 16)), rng.standard_normal((1, 16))

    def score(m, n):
        qm = rope_forward(q, Rope(inv_freq, style, af, np.array([m])))[0]
        kn = rope_forward(k, Rope(inv_freq, style, af, np.array([n])))[0]
        return float((qm @ kn.T)[0, 0])

    for offset in (0, 3, 17):
        base = score(offset, 0)
        for shift in (1, 9, 1000):
            assert score(offset + shift, shift) == pytest.approx(base, rel=1e-9, abs=1e-9)
    assert abs(score(5, 0) - score(6, 0)) > 1e-3  # the score does change with m - n


def test_half_equals_interleaved_under_pair_permutation():
    """HF's convert script puts each head as [even rows; odd rows]: then rotate_half on the
    permuted vector equals the interleaved (Meta) rotation, permuted."""
    rng = np.random.default_rng(2)
    Dh = 10
    perm = np.concatenate([np.arange(0, Dh, 2), np.arange(1, Dh, 2)])
    x = rng.standard_normal((2, 3, 7, Dh))
    inv_freq, _ = rope_frequencies(Dh)
    pos = np.arange(7) + 11
    y_int, _ = rope_forward(x, Rope(inv_freq, "interleaved", 1.0, pos))
    y_half, _ = rope_forward(x[..., perm], Rope(inv_freq, "half", 1.0, pos))
    np.testing.assert_allclose(y_half, y_int[..., perm], rtol=0, atol=1e-12)
    assert not np.allclose(rope_forward(x, Rope(inv_freq, "half", 1.0, pos))[0], y_int)


def test_interleaved_matches_complex_multiplication():
    """Meta's apply_rotary_emb: view pairs (2i, 2i+1) as complex numbers, times e^{i p theta}."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((5, 8))
    inv_freq, _ = rope_frequencies(8, base=500.0)
    pos = np.array([0, 1, 4, 9, 30])
    z = (x[:, 0::2] + 1j * x[:, 1::2]) * np.exp(1j * np.outer(pos, inv_freq))
    want = np.stack([z.real, z.imag], axis=-1).reshape(5, 8)
    np.testing.assert_allclose(rope_forward(x, Rope(inv_freq, "interleaved", 1.0, pos))[0], want,
                               atol=1e-12)


def test_backward_is_rotation_by_minus_theta():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 6, 12))
    inv_freq, _ = rope_frequencies(12)
    for style in ("half", "interleaved"):
        y, cache = rope_forward(x, Rope(inv_freq, style, 1.0, np.arange(6)))
        np.testing.assert_allclose(rope_backward(y, cache)["x"], x, atol=1e-12)  # R^T R = I


def test_batched_positions_and_float32():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    inv_freq, _ = rope_frequencies(8)
    pos = np.array([[0, 1, 2, 3], [10, 20, 30, 40]])
    y, _ = rope_forward(x, Rope(inv_freq, "half", 1.0, pos))
    assert y.dtype == np.float32
    for b in range(2):
        np.testing.assert_allclose(y[b], rope_forward(x[b], Rope(inv_freq, "half", 1.0, pos[b]))[0],
                                   atol=1e-6)


def test_yarn_worked_example_deepseek_v3():
    """DeepSeek-V3 config.json YaRN (dim 64, base 1e4, L0 4096, s 40) through HF
    _compute_yarn_parameters' correction range: low 10, high 23."""
    default, _ = rope_frequencies(64)
    inv_freq, af = rope_frequencies(64, scaling=YARN_V3)
    ratio = default / inv_freq
    np.testing.assert_allclose(ratio[:11], 1.0, rtol=1e-12)  # pairs <= 10 unchanged
    np.testing.assert_allclose(ratio[23:], 40.0, rtol=1e-12)  # pairs >= 23 divided by s
    assert ratio[16] == pytest.approx(1.818, abs=1e-3)  # 1 / (6/13/40 + 7/13)
    assert af == pytest.approx(1.3689, abs=1e-4)
    assert af ** 2 == pytest.approx(1.8739, abs=1e-4)  # the logit multiplier 1/t


def test_yarn_attention_factor_and_options():
    for s, want in [(2, 1.0693), (4, 1.1386), (16, 1.2773), (32, 1.3466)]:
        assert get_mscale(s) == pytest.approx(want, abs=1e-4)
    # DeepSeek-V3: mscale = mscale_all_dim = 1 -> rope factor 1, temperature goes to the scale
    _, af = rope_frequencies(64, scaling={**YARN_V3, "mscale": 1.0, "mscale_all_dim": 1.0})
    assert af == 1.0
    _, af = rope_frequencies(64, scaling={**YARN_V3, "mscale": 0.707, "mscale_all_dim": 1.0})
    assert af == pytest.approx((0.0707 * math.log(40) + 1) / (0.1 * math.log(40) + 1))
    _, af = rope_frequencies(64, scaling={**YARN_V3, "attention_factor": 0.5})
    assert af == 0.5
    # truncate=False: the ramp starts at the exact correction dims 10.47 and 22.51
    inv_freq, _ = rope_frequencies(64, scaling={**YARN_V3, "truncate": False})
    fcd = [64 * math.log(4096 / (n * 2 * math.pi)) / (2 * math.log(1e4)) for n in (32, 1)]
    ramp = (16 - fcd[0]) / (fcd[1] - fcd[0])
    want = rope_frequencies(64)[0][16] * (ramp / 40 + 1 - ramp)
    assert inv_freq[16] == pytest.approx(want, rel=1e-12)
    assert inv_freq[16] != rope_frequencies(64, scaling=YARN_V3)[0][16]  # truncated ramp


def _meta_apply_scaling(freqs, factor=8, low=1, high=4, old_len=8192):
    """Meta llama-models apply_scaling, scalar loop (an independent reference)."""
    out = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < old_len / high:
            out.append(f)
        elif wavelen > old_len / low:
            out.append(f / factor)
        else:
            smooth = (old_len / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def test_llama31_numbers():
    default, _ = rope_frequencies(128, base=500000.0)
    inv_freq, af = rope_frequencies(128, base=500000.0, scaling=LLAMA31)
    assert af == 1.0
    np.testing.assert_allclose(inv_freq, _meta_apply_scaling(default), rtol=1e-13)
    ratio = default / inv_freq
    np.testing.assert_allclose(ratio[:29], 1.0)  # wavelength < 2048: kept
    np.testing.assert_allclose(ratio[35:], 8.0)  # wavelength > 8192: divided by 8
    np.testing.assert_allclose(ratio[29:35], [1.2075, 1.5534, 2.0263, 2.6945, 3.6843, 5.2573],
                               atol=1e-4)  # smoothed band


def test_linear_pi_divides_by_factor():
    default, _ = rope_frequencies(16)
    inv_freq, af = rope_frequencies(16, scaling={"rope_type": "linear", "factor": 4.0})
    np.testing.assert_allclose(inv_freq, default / 4, rtol=1e-15)
    assert af == 1.0
    x = np.random.default_rng(6).standard_normal((5, 16))
    pos = np.array([0, 4, 8, 40, 400])  # PI: position p rotates like p / 4 did before
    np.testing.assert_allclose(rope_forward(x, Rope(inv_freq, "half", 1.0, pos))[0],
                               rope_forward(x, Rope(default, "half", 1.0, pos // 4))[0],
                               atol=1e-12)


def test_dynamic_ntk():
    scaling = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}
    default, _ = rope_frequencies(16, base=100.0)
    for seq_len in (1, 30, 64):  # at or below the original length: the default frequencies
        np.testing.assert_array_equal(rope_frequencies(16, 100.0, scaling, seq_len)[0], default)
    inv_freq, _ = rope_frequencies(16, 100.0, scaling, seq_len=128)
    base = 100.0 * (2.0 * 128 / 64 - 1) ** (16 / 14)  # 100 * 3^(8/7)
    np.testing.assert_allclose(inv_freq, base ** (-np.arange(0, 16, 2) / 16), rtol=1e-13)
    assert inv_freq[0] == 1.0 and inv_freq[-1] < default[-1]


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"unknown key.*'factr'.*valid keys.*'factor'"):
        rope_frequencies(8, scaling={"rope_type": "linear", "factr": 2.0})
    with pytest.raises(ValueError, match=r"'ntk-by-parts'.*'dynamic'.*'llama3'.*'yarn'"):
        rope_frequencies(8, scaling={"rope_type": "ntk-by-parts", "factor": 2.0})
    with pytest.raises(ValueError, match=r"needs key.*original_max_position_embeddings"):
        rope_frequencies(8, scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="needs seq_len"):
        rope_frequencies(8, scaling={"rope_type": "dynamic", "factor": 2.0,
                                     "original_max_position_embeddings": 16})
    with pytest.raises(ValueError, match="even"):
        rope_frequencies(7)
    inv_freq, _ = rope_frequencies(8)
    with pytest.raises(ValueError, match="style"):
        rope_forward(np.zeros((3, 8)), Rope(inv_freq, "neox", 1.0, np.arange(3)))
    with pytest.raises(ValueError, match="positions"):
        rope_forward(np.zeros((3, 8)), Rope(inv_freq, "half", 1.0, np.arange(4)))
    with pytest.raises(ValueError, match="inv_freq"):
        rope_forward(np.zeros((3, 6)), Rope(inv_freq, "half", 1.0, np.arange(3)))
    with pytest.raises(TypeError, match="positions"):
        rope_forward(np.zeros((3, 8)), Rope(inv_freq, "half", 1.0, np.arange(3.0)))
    with pytest.raises(TypeError, match=r"^rope: rope must be a Rope \(make_rope\), got tuple"):
        rope_forward(np.zeros((3, 8)), (inv_freq, "half", 1.0, np.arange(3)))


def test_make_rope_from_a_spec():
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    rope = make_rope(RopeSpec(500.0, yarn, "interleaved"), 6, np.arange(3, 8))
    inv_freq, af = rope_frequencies(6, 500.0, yarn)
    np.testing.assert_array_equal(rope.inv_freq, inv_freq)
    assert (rope.style, rope.attention_factor, rope.positions.tolist()) == (
        "interleaved", af, [3, 4, 5, 6, 7])
    dynamic = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}
    for positions, seq_len in ((np.arange(3), None), (np.array([[0, 9], [2, 3]]), None),
                               (np.arange(3), 12)):  # seq_len: default max(positions) + 1
        want = rope_frequencies(8, 100.0, dynamic, seq_len or int(positions.max()) + 1)[0]
        np.testing.assert_array_equal(
            make_rope(RopeSpec(100.0, dynamic), 8, positions, seq_len).inv_freq, want)


def test_rope_angles_of_positions_asked_again_are_the_same_numbers():
    """(T,) positions' tables are kept by value: asked again (the next layer, the other
    shard) the same arrays come back, equal to a fresh computation; other positions, other
    frequencies, another attention factor or dtype get their own."""
    from scratchllm.attention.rope import Rope, rope_angles
    inv = 1.0 / 10000.0 ** (np.arange(0, 8, 2) / 8)  # (4,)
    first = rope_angles(Rope(inv, "half", 1.0, np.arange(6)), 4, np.float32)
    again = rope_angles(Rope(inv.copy(), "half", 1.0, np.arange(6)), 4, np.float32)
    assert again[0] is first[0] and again[1] is first[1]
    ang = np.arange(6)[:, None] * inv  # (T, P)
    np.testing.assert_array_equal(first[0], np.cos(ang).astype(np.float32))
    np.testing.assert_array_equal(first[1], np.sin(ang).astype(np.float32))
    for rope, dtype in ((Rope(inv, "half", 1.0, np.arange(1, 7)), np.float32),
                        (Rope(inv * 0.5, "half", 1.0, np.arange(6)), np.float32),
                        (Rope(inv, "half", 0.5, np.arange(6)), np.float32),
                        (Rope(inv, "half", 1.0, np.arange(6)), np.float64)):
        cos, sin = rope_angles(rope, 4, dtype)
        ang = rope.positions[:, None] * rope.inv_freq
        assert cos.dtype == dtype
        np.testing.assert_array_equal(cos, (np.cos(ang) * rope.attention_factor).astype(dtype))
        np.testing.assert_array_equal(sin, (np.sin(ang) * rope.attention_factor).astype(dtype))
