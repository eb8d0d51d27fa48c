"""Flash attention: equal to sdpa (forward and backward, float64, 1e-12) for every mask, block
size, ragged length, grouping and ALiBi; memory far below the score matrix; the Module option."""
import tracemalloc

import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import (Attention, alibi_bias, alibi_slopes, causal_mask,
                                  flash_sdpa_backward, flash_sdpa_forward, sdpa_backward,
                                  sdpa_forward)
from scratchllm.specs import AttentionSpec, Mask, ScoresSpec


def test_gradient_check():
    for report in CASES["flash_sdpa"](np.random.default_rng(0)):
        assert report.ok, str(report)


def _inputs(rng, B=2, H=6, Hkv=2, Tq=13, Tk=13, Dh=5, Dv=3):
    return (rng.standard_normal((B, H, Tq, Dh)), rng.standard_normal((B, Hkv, Tk, Dh)),
            rng.standard_normal((B, Hkv, Tk, Dv)))


def _assert_same(got, want):
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-12, err_msg=name)


MASKS = {"none": None, "causal": Mask(), "window 4": Mask(window=4),
         "window 4, 3 sinks": Mask(window=4, n_sink=3), "window 1": Mask(window=1)}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("blocks", [(1, 1), (4, 3), (5, 8), (13, 13), (64, 32)])
@pytest.mark.parametrize("heads", [(6, 2), (3, 3), (4, 1)])
def test_flash_equals_sdpa(mask, blocks, heads):
    rng = np.random.default_rng(sum(blocks) + heads[0])
    q, k, v = _inputs(rng, H=heads[0], Hkv=heads[1])
    out, cache = flash_sdpa_forward(q, k, v, mask=MASKS[mask], block=blocks)
    want, want_cache = sdpa_forward(q, k, v, MASKS[mask])  # masks.mask_array's whole array
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    dout = rng.standard_normal(out.shape)
    _assert_same(flash_sdpa_backward(dout, cache), sdpa_backward(dout, want_cache))


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("blocks", [(1, 1), (4, 3), (5, 8), (64, 32)])
@pytest.mark.parametrize("heads", [(6, 2), (3, 3)])
def test_flash_with_gpt_oss_sinks_equals_sdpa(mask, blocks, heads):
    """The learned sink logit: forward and every gradient (dsinks too), ragged T = 13."""
    rng = np.random.default_rng(100 + sum(blocks) + heads[0])
    q, k, v = _inputs(rng, H=heads[0], Hkv=heads[1])
    sinks = 2 * rng.standard_normal(heads[0])
    out, cache = flash_sdpa_forward(q, k, v, mask=MASKS[mask], sinks=sinks, block=blocks)
    want, want_cache = sdpa_forward(q, k, v, MASKS[mask], sinks=sinks)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    dout = rng.standard_normal(out.shape)
    got, ref = flash_sdpa_backward(dout, cache), sdpa_backward(dout, want_cache)
    assert sorted(got) == sorted(ref) == ["k", "q", "sinks", "v"]
    _assert_same(got, ref)


def test_sinks_take_all_the_mass_of_a_row_that_sees_no_key():
    """Tq > Tk, causal: the first rows see no key, so the sink has P = 1 and out = 0."""
    rng = np.random.default_rng(4)
    q, k, v = _inputs(rng, Tq=9, Tk=4)
    sinks = rng.standard_normal(6)
    out, cache = flash_sdpa_forward(q, k, v, mask=Mask(), sinks=sinks, block=(2, 3))
    keep = np.arange(4)[None, :] <= np.arange(9)[:, None] - 5  # (Tq, Tk)
    want, want_cache = sdpa_forward(q, k, v, Mask(array=keep), sinks=sinks)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    assert np.all(out[:, :, :5] == 0)
    dout = rng.standard_normal(out.shape)
    _assert_same(flash_sdpa_backward(dout, cache), sdpa_backward(dout, want_cache))


@pytest.mark.parametrize("Tq, Tk", [(5, 13), (13, 5), (1, 9)])
def test_bottom_right_causal_alignment_and_fully_masked_rows(Tq, Tk):
    """Query i sits at position i + Tk - Tq; with Tq > Tk the first rows see no key: zeros."""
    rng = np.random.default_rng(Tq * Tk)
    q, k, v = _inputs(rng, Tq=Tq, Tk=Tk)
    keep = np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + (Tk - Tq)  # (Tq, Tk)
    out, cache = flash_sdpa_forward(q, k, v, mask=Mask(), block=(3, 4))
    want, want_cache = sdpa_forward(q, k, v, Mask(array=keep))
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    assert np.isfinite(out).all() and np.all(out[:, :, ~keep.any(1)] == 0)
    dout = rng.standard_normal(out.shape)
    got = flash_sdpa_backward(dout, cache)
    _assert_same(got, sdpa_backward(dout, want_cache))
    assert all(np.isfinite(g).all() for g in got.values())


@pytest.mark.parametrize("mask", [None, Mask(), Mask(window=3)])
def test_alibi_inside_flash_equals_sdpa_with_the_bias_and_its_slope_gradient(mask):
    rng = np.random.default_rng(7)
    q, k, v = _inputs(rng, Tq=11, Tk=11)
    slopes = alibi_slopes(6) * (1 + rng.random(6))
    out, cache = flash_sdpa_forward(q, k, v, mask=mask, alibi_slopes=slopes, block=(4, 3))
    bias = alibi_bias(slopes, 11, 11)  # (H, T, T)
    want, want_cache = sdpa_forward(q, k, v, mask, bias=bias)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    dout = rng.standard_normal(out.shape)
    got, ref = flash_sdpa_backward(dout, cache), sdpa_backward(dout, want_cache)
    _assert_same(got, {n: ref[n] for n in "qkv"})
    dist = -np.abs(np.arange(11)[:, None] - np.arange(11)[None, :])  # bias = slope * dist
    np.testing.assert_allclose(got["alibi_slopes"], np.einsum("hij,ij->h", ref["bias"], dist),
                               rtol=1e-12, atol=1e-12)


def test_float32_close_to_float64():
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, Tq=40, Tk=40)
    out64, _ = flash_sdpa_forward(q, k, v, mask=Mask(), block=(16, 8))
    out32, _ = flash_sdpa_forward(*(a.astype(np.float32) for a in (q, k, v)), mask=Mask(),
                                  block=(16, 8))
    assert out32.dtype == np.float32
    np.testing.assert_allclose(out32, out64, atol=1e-5)


def _peak_bytes(fn):
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_stays_far_below_the_score_matrix():
    """fwd + bwd at T = 1024: the (B, H, T, T) float64 matrix is 16 MiB; flash's peak stays
    under a tenth of it, while sdpa's own peak holds at least the matrix (so the measure sees
    it)."""
    rng = np.random.default_rng(0)
    B, H, T, Dh = 1, 2, 1024, 8
    q, k, v = (rng.standard_normal((B, H, T, Dh)) for _ in range(3))
    dout = rng.standard_normal((B, H, T, Dh))
    matrix = B * H * T * T * 8

    def flash():
        out, cache = flash_sdpa_forward(q, k, v, mask=Mask(), block=64)
        flash_sdpa_backward(dout, cache)

    def dense():
        out, cache = sdpa_forward(q, k, v, Mask())
        sdpa_backward(dout, cache)

    assert _peak_bytes(dense) >= matrix
    assert _peak_bytes(flash) < matrix / 10


@pytest.mark.parametrize("kwargs, match", [
    (dict(mask=Mask(array=causal_mask(13))), "a mask array or a block pattern needs sdpa"),
    (dict(mask=Mask(block=4)), "a mask array or a block pattern needs sdpa"),
    (dict(block=0), "block must be >= 1"),
    (dict(block=(4, 0)), "block must be >= 1"),
    (dict(alibi_slopes=np.ones(5)), "alibi_slopes has shape"),
    (dict(sinks=np.ones(4)), "sinks has shape"),
])
def test_bad_options_are_errors(kwargs, match):
    q, k, v = _inputs(np.random.default_rng(0))
    with pytest.raises(ValueError, match=match):
        flash_sdpa_forward(q, k, v, **kwargs)


@pytest.mark.parametrize("mask", [Mask(), Mask(window=3, n_sink=1)])
def test_attention_module_with_flash_equals_sdpa(mask):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 9, 16))
    mods = [Attention(16, AttentionSpec(4, 2, mask=mask, scores=ScoresSpec(impl, 4)),
                      rng=np.random.default_rng(1), dtype=np.float64)
            for impl in ("sdpa", "flash")]
    dy = rng.standard_normal(x.shape)
    outs = [m.forward(x) for m in mods]
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=0, atol=1e-12)
    dxs = [m.backward(dy, c) for m, (_, c) in zip(mods, outs)]
    np.testing.assert_allclose(dxs[1], dxs[0], rtol=0, atol=1e-12)
    for p0, p1 in zip(mods[0].parameters(), mods[1].parameters()):
        np.testing.assert_allclose(p1.grad, p0.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mask", [Mask(), Mask(window=3)])
def test_attention_module_with_sinks_flash_sdpa_and_decode_agree(mask):
    """gpt-oss attention: flash equals sdpa (output, dx, every Param grad incl. sinks), and
    decoding token by token equals the full forward."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 9, 16))
    mods = [Attention(16, AttentionSpec(4, 2, qkv_bias=True, o_bias=True, sinks=True,
                                        mask=mask, scores=ScoresSpec(impl, 4)),
                      rng=np.random.default_rng(1), dtype=np.float64)
            for impl in ("sdpa", "flash")]
    for m in mods:
        m.sinks.data[:] = [1.5, -0.5, 0.0, 3.0]
    dy = rng.standard_normal(x.shape)
    outs = [m.forward(x) for m in mods]
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=0, atol=1e-12)
    dxs = [m.backward(dy, c) for m, (_, c) in zip(mods, outs)]
    np.testing.assert_allclose(dxs[1], dxs[0], rtol=0, atol=1e-12)
    for (n, p0), (_, p1) in zip(mods[0].named_parameters(), mods[1].named_parameters()):
        np.testing.assert_allclose(p1.grad, p0.grad, rtol=0, atol=1e-12, err_msg=n)
    assert np.abs(mods[0].sinks.grad).min() > 0
    state = mods[0].init_state(2, 9)
    steps = np.stack([mods[0].decode(x[:, t], state, t) for t in range(9)], axis=1)
    np.testing.assert_allclose(steps, outs[0][0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("opts", [dict(mask=Mask()), dict(mask=Mask(window=5, n_sink=2)),
                                  dict(alibi_slopes=alibi_slopes(6))])
def test_float32_numba_passes_equal_the_readable_numpy_twin(opts, monkeypatch):
    """The fused twin (flash_lanes.py: per-lane loops, flash_kernels' Numba passes) against
    the readable NumPy loops (SCRATCHLLM_READABLE=1) in float32, forward and every gradient,
    sinks included."""
    rng = np.random.default_rng(9)
    q, k, v = (a.astype(np.float32) for a in _inputs(rng, Tq=21, Tk=21))
    sinks, dout = rng.standard_normal(6).astype(np.float32), rng.standard_normal(
        (2, 6, 21, 3)).astype(np.float32)
    if "alibi_slopes" in opts:
        opts = dict(alibi_slopes=opts["alibi_slopes"].astype(np.float32))

    def run(readable):
        monkeypatch.setenv("SCRATCHLLM_READABLE", readable)
        out, cache = flash_sdpa_forward(q, k, v, sinks=sinks, block=(8, 5), **opts)
        assert cache.opts.fused == (readable == "0")  # chosen once, carried by the cache
        monkeypatch.setenv("SCRATCHLLM_READABLE", "0" if readable == "1" else "1")
        return {"out": out, **flash_sdpa_backward(dout, cache)}

    fast = run("0")
    readable = run("1")
    for name, want in readable.items():
        np.testing.assert_allclose(fast[name], want, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("opts", [dict(mask=Mask()), dict(mask=Mask(window=5, n_sink=2))])
def test_lanes_on_threads_give_the_bits_of_lanes_in_turn(opts, monkeypatch):
    """flash_lanes.run_tasks: with a BLAS of 2 threads the lanes run on 2 threads (BLAS set to
    1 meanwhile, then restored), and every output and gradient has the same bits as with a
    BLAS of 1 thread (lanes in turn)."""
    from scratchllm.attention import flash_lanes
    from scratchllm.core import blas
    rng = np.random.default_rng(11)
    q, k, v = (a.astype(np.float32) for a in _inputs(rng, B=2, H=6, Hkv=3, Tq=37, Tk=37))
    sinks, dout = rng.standard_normal(6).astype(np.float32), rng.standard_normal(
        (2, 6, 37, 3)).astype(np.float32)
    monkeypatch.setenv("SCRATCHLLM_READABLE", "0")
    monkeypatch.setattr(flash_lanes, "THREADS_FROM", 0)  # threads even for this small call

    def run(blas_threads):
        calls = []
        controls = [(lambda: blas_threads, calls.append)]
        monkeypatch.setattr(blas, "thread_controls", lambda: controls)
        out, cache = flash_sdpa_forward(q, k, v, sinks=sinks, block=(8, 5), **opts)
        return {"out": out, **flash_sdpa_backward(dout, cache)}, calls

    threaded, calls = run(2)
    assert calls == [1, 2, 1, 2]  # forward and backward: one BLAS thread, then restored
    in_turn, calls = run(1)
    assert calls == []
    for name, want in in_turn.items():
        np.testing.assert_array_equal(threaded[name], want, err_msg=name)
