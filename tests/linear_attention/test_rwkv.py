"""RWKV-4: the WKV operator's stabilised recurrence (vectorised and upstream's scalar loop) ==
its parallel softmax form == the formula with explicit sums; the recurrent backward (Numba and
NumPy) == the parallel backward; gradients of w, u, k, v and of the time-mix and channel-mix
blocks; decoding == the full forward; float32 with huge k (the exponents that overflow
without the running max), forward and backward."""
import numpy as np
import pytest

from grads.check import check
from scratchllm.linear_attention import (
    ChannelMixWeights, TimeMixWeights, rwkv4_channel_mix_backward, rwkv4_channel_mix_forward,
    rwkv4_channel_mix_step, rwkv4_time_mix_backward, rwkv4_time_mix_forward,
    rwkv4_time_mix_step, rwkv4_wkv_backward, rwkv4_wkv_forward, rwkv4_wkv_recurrent,
    rwkv4_wkv_recurrent_ref)
from scratchllm.linear_attention.rwkv_scan import (rwkv4_wkv_scan_backward,
                                                   rwkv4_wkv_scan_backward_ref,
                                                   rwkv4_wkv_scan_forward,
                                                   rwkv4_wkv_scan_forward_ref)


def rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def wkv_inputs(rng, batch=2, T=11, D=5):
    return dict(w=rng.uniform(0.1, 2.0, D), u=rng.standard_normal(D),
                k=rng.standard_normal((batch, T, D)), v=rng.standard_normal((batch, T, D)))


def direct_wkv(w, u, k, v):
    """The paper's sums written out, no stabilisation (fine for small k)."""
    batch, T, D = k.shape
    y = np.zeros(k.shape)
    for t in range(T):
        num, den = np.exp(u + k[:, t]) * v[:, t], np.exp(u + k[:, t])
        for i in range(t):
            e = np.exp(-(t - 1 - i) * w + k[:, i])
            num, den = num + e * v[:, i], den + e
        y[:, t] = num / den
    return y


def test_recurrent_and_parallel_equal_the_sums():
    a = wkv_inputs(np.random.default_rng(0))
    want = direct_wkv(**a)
    for form in ("parallel", "recurrent"):
        assert rel(rwkv4_wkv_forward(**a, form=form)[0], want) < 1e-12
    y, state = rwkv4_wkv_recurrent(**a)
    y_ref, state_ref = rwkv4_wkv_recurrent_ref(**a)
    assert rel(y, want) < 1e-12 and rel(y_ref, want) < 1e-12
    for got, ref in zip(state, state_ref):
        assert rel(got, ref) < 1e-12


@pytest.mark.parametrize("form", ["parallel", "recurrent"])
def test_wkv_backward(form):
    rng = np.random.default_rng(1)
    report = check(rwkv4_wkv_forward, rwkv4_wkv_backward, rng=rng, form=form,
                   **wkv_inputs(rng, 2, 7, 3))
    assert report.ok, report
    assert {r.input for r in report.rows} == {"w", "u", "k", "v"}


@pytest.mark.parametrize("T, D", [(1, 3), (13, 40), (50, 70)])  # D ragged against BLOCK = 32
def test_recurrent_backward_equals_the_parallel_backward(T, D):
    rng = np.random.default_rng(T)
    a = wkv_inputs(rng, 3, T, D)
    a["w"][0] = 1e-4  # a channel that barely decays
    y_par, c_par = rwkv4_wkv_forward(**a, form="parallel")
    dy = rng.standard_normal(y_par.shape)
    want = rwkv4_wkv_backward(dy, c_par)
    for fwd, bwd in ((rwkv4_wkv_scan_forward, rwkv4_wkv_scan_backward),
                     (rwkv4_wkv_scan_forward_ref, rwkv4_wkv_scan_backward_ref)):
        y, cache = fwd(**a)
        assert rel(y, y_par) < 1e-12
        got = bwd(dy, cache)
        assert got.keys() == want.keys()
        for name in want:
            assert rel(got[name], want[name]) < 1e-12, (fwd.__name__, name)


def test_float32_huge_keys_stay_finite():
    rng = np.random.default_rng(2)
    a = wkv_inputs(rng, 1, 200, 4)
    a["k"] = 60.0 * rng.standard_normal(a["k"].shape)  # e^k overflows float32 past k = 88
    want = rwkv4_wkv_forward(**a)[0]
    a32 = {n: x.astype(np.float32) for n, x in a.items()}
    for y in (rwkv4_wkv_recurrent(**a32)[0], rwkv4_wkv_forward(**a32)[0]):
        assert y.dtype == np.float32 and np.all(np.isfinite(y)) and rel(y, want) < 1e-4
    dy = rng.standard_normal(want.shape)
    g64 = rwkv4_wkv_backward(dy, rwkv4_wkv_forward(**a, form="parallel")[1])
    for form in ("parallel", "recurrent"):
        g = rwkv4_wkv_backward(dy.astype(np.float32), rwkv4_wkv_forward(**a32, form=form)[1])
        for name, x in g.items():
            assert x.dtype == np.float32 and np.all(np.isfinite(x)), (form, name)
            assert rel(x, g64[name]) < 1e-3, (form, name)


def block_inputs(rng, D=5, F=7):
    return dict(time=TimeMixWeights(
                    mix_k=rng.uniform(0, 1, D), mix_v=rng.uniform(0, 1, D),
                    mix_r=rng.uniform(0, 1, D), time_decay=rng.normal(-1, 0.5, D),
                    time_first=rng.standard_normal(D),
                    **{n: rng.normal(0, 0.5, (D, D)) for n in ("Wk", "Wv", "Wr", "Wo")}),
                channel=ChannelMixWeights(
                    mix_k=rng.uniform(0, 1, D), mix_r=rng.uniform(0, 1, D),
                    Wk=rng.normal(0, 0.5, (D, F)), Wr=rng.normal(0, 0.5, (D, D)),
                    Wv=rng.normal(0, 0.5, (F, D))))


@pytest.mark.parametrize("block", ["time", "channel"])
def test_block_backwards(block):
    rng = np.random.default_rng(3)
    p = block_inputs(rng)[block]
    pair = {"time": (rwkv4_time_mix_forward, rwkv4_time_mix_backward),
            "channel": (rwkv4_channel_mix_forward, rwkv4_channel_mix_backward)}[block]
    report = check(*pair, rng=rng, x=rng.standard_normal((2, 6, 5)), w=p)
    assert report.ok, report
    assert {r.input for r in report.rows} == {"x"} | {f"w.{n}" for n in p._fields}


def test_block_decoding_equals_the_full_forward():
    rng = np.random.default_rng(4)
    p = block_inputs(rng)
    x = rng.standard_normal((2, 9, 5))
    full_t = rwkv4_time_mix_forward(x, p["time"])[0]
    full_c = rwkv4_channel_mix_forward(x, p["channel"])[0]
    st, sc, outs_t, outs_c = (None, None), None, [], []
    for t in range(x.shape[1]):
        o, st = rwkv4_time_mix_step(x[:, t], st, p["time"])
        outs_t.append(o)
        o, sc = rwkv4_channel_mix_step(x[:, t], sc, p["channel"])
        outs_c.append(o)
    assert rel(np.stack(outs_t, 1), full_t) < 1e-12 and rel(np.stack(outs_c, 1), full_c) < 1e-12


def test_bad_input():
    a = wkv_inputs(np.random.default_rng(5))
    with pytest.raises(ValueError, match="rwkv4_wkv_scan: w has shape"):
        rwkv4_wkv_forward(**{**a, "w": a["w"][:2]})
    with pytest.raises(ValueError, match="rwkv4_wkv: w has shape"):
        rwkv4_wkv_forward(**{**a, "w": a["w"][:2]}, form="parallel")
    with pytest.raises(ValueError, match="rwkv4_wkv: form must be"):
        rwkv4_wkv_forward(**a, form="chunked")
    y, cache = rwkv4_wkv_forward(**a)
    with pytest.raises(TypeError, match="rwkv4_wkv_backward: dy has dtype float32"):
        rwkv4_wkv_backward(y.astype(np.float32), cache)
