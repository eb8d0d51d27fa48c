"""Decoding states are checked, never broadcast: every *_step (SSM, Mamba, per-head linear
attention, SSD, RWKV) refuses, on generated wrong shapes, a state without its batch axis, with
batch 1 for a larger batch, or of the wrong width (the error names the function and the
state)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from scratchllm.specs import MambaSpec
from scratchllm.ssm.lti import ssm_step
from scratchllm.ssm.mamba import Mamba, MambaState, mamba_step
from scratchllm.ssm.s4d import s4d_step
from scratchllm.ssm.scan import selective_scan_step


def wrong_shapes(shape):
    """Shapes a state of `shape` (B, ...) must not be accepted in: no batch axis, batch 1 (or
    B + 1 when B = 1), one axis one wider."""
    out = [shape[1:], (1 if shape[0] > 1 else 2,) + shape[1:]]
    out += [shape[:i] + (shape[i] + 1,) + shape[i + 1:] for i in range(1, len(shape))]
    return out


sizes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 3))  # B, D, N


@settings(max_examples=25, deadline=None)
@given(sizes, st.data())
def test_ssm_and_selective_scan_steps_refuse_a_state_of_another_shape(size, data):
    B, D, N = size
    r = np.random.default_rng(0)
    x_t = r.standard_normal((B, D))
    bad = np.zeros(data.draw(st.sampled_from(wrong_shapes((B, D, N))), "state shape"))
    A, Bb, C, Dv = (r.standard_normal((D, N)), r.standard_normal((D, N)),
                    r.standard_normal((D, N)), r.standard_normal(D))
    with pytest.raises(ValueError, match=r"^ssm_step: h has shape"):
        ssm_step(x_t, bad, A, Bb, C, Dv)
    with pytest.raises(ValueError, match=r"^selective_scan_step: h has shape"):
        selective_scan_step(x_t, np.ones((B, D)), -np.abs(A), r.standard_normal((B, N)),
                            r.standard_normal((B, N)), Dv, bad)
    with pytest.raises(ValueError, match=r"^s4d_step: state has shape"):
        s4d_step(x_t, bad, np.zeros((D, N)), Bb, C, np.full(D, -3.0), Dv)
    y, h = ssm_step(x_t, np.zeros((B, D, N)), A, Bb, C, Dv)  # the right shape passes
    assert y.shape == (B, D) and h.shape == (B, D, N)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.sampled_from(["conv", "ssm"]), st.data())
def test_mamba_step_refuses_conv_or_ssm_states_of_another_shape(B, part, data):
    spec = MambaSpec(d_state=3, d_conv=4, expand=2)
    layer = Mamba(4, spec, rng=np.random.default_rng(0), dtype=np.float64)
    state = layer.init_state(B)
    good = getattr(state, part)
    bad = np.zeros(data.draw(st.sampled_from(wrong_shapes(good.shape)), "shape"))
    with pytest.raises(ValueError, match=rf"^mamba_step: state.{part} has shape"):
        mamba_step(np.ones((B, 4)), state._replace(**{part: bad}), layer.weights(), spec=spec)
    out, new = mamba_step(np.ones((B, 4)), MambaState(*state), layer.weights(), spec=spec)
    assert out.shape == (B, 4) and new.ssm.shape == state.ssm.shape


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.sampled_from(["conv", "ssd"]), st.data())
def test_mamba2_step_refuses_conv_or_ssd_states_of_another_shape(B, part, data):
    from scratchllm.specs import Mamba2Spec
    from scratchllm.ssm.mamba2 import Mamba2, mamba2_step
    spec = Mamba2Spec(n_heads=2, d_state=3, expand=2, d_conv=4)
    layer = Mamba2(4, spec, rng=np.random.default_rng(0), dtype=np.float64)
    state = layer.init_state(B)
    bad = np.zeros(data.draw(st.sampled_from(wrong_shapes(getattr(state, part).shape)), "shape"))
    with pytest.raises(ValueError, match=rf"^mamba2_step: state.{part} has shape"):
        mamba2_step(np.ones((B, 4)), state._replace(**{part: bad}), layer.weights(), spec=spec)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 3), st.sampled_from(["linear", "retnet", "gla", "delta"]), st.data())
def test_recurrent_mixer_step_refuses_a_state_of_another_shape(B, kind, data):
    from scratchllm.linear_attention.layer import RecurrentMixer, recurrent_mixer_step
    from scratchllm.specs import RecurrentSpec
    spec = RecurrentSpec(kind, n_heads=2)
    layer = RecurrentMixer(8, spec, rng=np.random.default_rng(0), dtype=np.float64)
    good = layer.init_state(B)
    bad = np.zeros(data.draw(st.sampled_from(wrong_shapes(good.shape)), "shape"))
    with pytest.raises(ValueError, match=r"^recurrent_mixer_step: state has shape"):
        recurrent_mixer_step(np.ones((B, 8)), bad, layer.weights(), spec=spec)
    out, new = recurrent_mixer_step(np.ones((B, 8)), good, layer.weights(), spec=spec)
    assert new.shape == good.shape


head_sizes = st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 4),
                       st.integers(1, 4))  # B, H, Dk, Dv


def head_step_calls(B, H, Dk, Dv):
    """Each public per-head step as (name, call(state), the state's shape): q_t, k_t (B, H, Dk),
    v_t (B, H, Dv), random but valid gates."""
    from scratchllm.linear_attention.delta import delta_rule_step
    from scratchllm.linear_attention.gla import gla_attention_step
    from scratchllm.linear_attention.linear import linear_attention_step
    from scratchllm.linear_attention.retnet import retnet_attention_step
    from scratchllm.linear_attention.rwkv7 import rwkv7_step
    r = np.random.default_rng(0)
    q, k = r.standard_normal((2, B, H, Dk))
    v = r.standard_normal((B, H, Dv))
    gate = -np.abs(r.standard_normal((B, H, Dk)))
    beta = r.uniform(0, 1, (B, H))
    return [
        ("gla_attention_step", lambda s: gla_attention_step(q, k, v, gate, s), (B, H, Dk, Dv)),
        ("delta_rule_step", lambda s: delta_rule_step(q, k, v, beta, -beta, s), (B, H, Dk, Dv)),
        ("retnet_attention_step", lambda s: retnet_attention_step(q, k, v, np.full(H, 0.9), s),
         (B, H, Dk, Dv)),
        ("linear_attention_step", lambda s: linear_attention_step(q, k, v, s),
         (B, H, Dk, Dv + 1)),
        ("rwkv7_step", lambda s: rwkv7_step(q, np.exp(gate), k, v, k, beta[..., None] * k, s),
         (B, H, Dk, Dv)),
    ]


@settings(max_examples=25, deadline=None)
@given(head_sizes, st.data())
def test_every_per_head_step_refuses_a_state_of_another_shape(size, data):
    for name, call, shape in head_step_calls(*size):
        bad = np.zeros(data.draw(st.sampled_from(wrong_shapes(shape)), f"{name} state"))
        with pytest.raises(ValueError, match=rf"^{name}: state has shape"):
            call(bad)
        out, new = call(np.zeros(shape))  # the right shape passes, and None means zeros
        assert new.shape == shape and np.array_equal(call(None)[0], out)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 3), st.integers(1, 3), st.integers(1, 4), st.data())
def test_ssd_and_s4d_complex_steps_refuse_a_state_of_another_shape(B, groups, N, Dh, data):
    from scratchllm.ssm.s4d_complex import S4DComplex, s4d_complex_step
    from scratchllm.ssm.ssd import ssd_step
    r = np.random.default_rng(0)
    H = 2 * groups
    x_t, dt_t = r.standard_normal((B, H, Dh)), r.uniform(0.1, 1, (B, H))
    Bt, Ct = r.standard_normal((2, B, groups, N))
    A, D = -r.uniform(0.5, 1, H), r.standard_normal(H)
    bad = np.zeros(data.draw(st.sampled_from(wrong_shapes((B, H, N, Dh))), "ssd state"))
    with pytest.raises(ValueError, match=r"^ssd_step: state has shape"):
        ssd_step(x_t, dt_t, A, Bt, Ct, D, bad)
    layer = S4DComplex(Dh, N, rng=r, dtype=np.float64)
    bad = np.zeros(data.draw(st.sampled_from(wrong_shapes((B, Dh, N))), "s4d state"), complex)
    with pytest.raises(ValueError, match=r"^s4d_complex_step: state has shape"):
        s4d_complex_step(x_t[:, 0], bad, layer.weights())


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3), st.integers(1, 4), st.sampled_from(["a", "b", "p", "x"]), st.data())
def test_the_rwkv4_steps_refuse_a_state_of_another_shape(B, D, part, data):
    from scratchllm.linear_attention.rwkv import WKVState, rwkv4_wkv_step
    from scratchllm.linear_attention.rwkv_blocks import (ChannelMixWeights, RWKV4TimeMix,
                                                         rwkv4_channel_mix_step,
                                                         rwkv4_time_mix_step)
    from scratchllm.specs import RWKVSpec
    r = np.random.default_rng(0)
    x_t = r.standard_normal((B, D))
    good = WKVState(*np.zeros((3, B, D)))
    bad = np.zeros(data.draw(st.sampled_from(wrong_shapes((B, D))), "shape"))
    mix = RWKV4TimeMix(D, RWKVSpec(), rng=r, dtype=np.float64)
    if part == "x":
        with pytest.raises(ValueError, match=r"^rwkv4_time_mix_step: x_prev has shape"):
            rwkv4_time_mix_step(x_t, (bad, good), mix.weights())
        channel = ChannelMixWeights(np.ones(D), np.ones(D), np.ones((D, 3)), np.ones((D, D)),
                                    np.ones((3, D)))
        with pytest.raises(ValueError, match=r"^rwkv4_channel_mix_step: x_prev has shape"):
            rwkv4_channel_mix_step(x_t, bad, channel)
        return
    wrong = good._replace(**{part: bad})
    with pytest.raises(ValueError, match=rf"^rwkv4_wkv_step: state.{part} has shape"):
        rwkv4_wkv_step(np.ones(D), np.ones(D), x_t, x_t, wrong)
    with pytest.raises(ValueError, match=rf"^rwkv4_time_mix_step: state.wkv.{part} has shape"):
        rwkv4_time_mix_step(x_t, (x_t, wrong), mix.weights())
