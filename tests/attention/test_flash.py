"""Flash attention: equal to sdpa (forward and backward, float64, 1e-12) for every mask, block
size, ragged length, grouping and ALiBi; memory far below the score matrix; the Module option."""
import tracemalloc

import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention.flash_kernels import fused_ok
from scratchllm.attention import (Attention, alibi_bias, alibi_slopes, attention_sink_mask,
                                  causal_mask, flash_sdpa_backward, flash_sdpa_forward,
                                  sdpa_backward, sdpa_forward, sliding_window_mask)


def test_gradient_check():
    for report in CASES["flash_sdpa"](np.random.default_rng(0)):
        assert report.ok, str(report)


def _inputs(rng, B=2, H=6, Hkv=2, Tq=13, Tk=13, Dh=5, Dv=3):
    return (rng.standard_normal((B, H, Tq, Dh)), rng.standard_normal((B, Hkv, Tk, Dh)),
            rng.standard_normal((B, Hkv, Tk, Dv)))


def _sdpa_mask(T, causal, window, n_sink):
    if not causal:
        return None
    if window is None:
        return causal_mask(T)
    return attention_sink_mask(T, window, n_sink) if n_sink else sliding_window_mask(T, window)


def _assert_same(got, want):
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-12, err_msg=name)


MASKS = {"none": dict(), "causal": dict(causal=True), "window 4": dict(causal=True, window=4),
         "window 4, 3 sinks": dict(causal=True, window=4, n_sink=3),
         "window 1": dict(causal=True, window=1)}


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("blocks", [(1, 1), (4, 3), (5, 8), (13, 13), (64, 32)])
@pytest.mark.parametrize("heads", [(6, 2), (3, 3), (4, 1)])
def test_flash_equals_sdpa(mask, blocks, heads):
    rng = np.random.default_rng(sum(blocks) + heads[0])
    q, k, v = _inputs(rng, H=heads[0], Hkv=heads[1])
    opts = MASKS[mask]
    out, cache = flash_sdpa_forward(q, k, v, block_q=blocks[0], block_k=blocks[1], **opts)
    want, want_cache = sdpa_forward(q, k, v, _sdpa_mask(13, **{"causal": False, "window": None,
                                                               "n_sink": 0, **opts}))
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
    opts = MASKS[mask]
    out, cache = flash_sdpa_forward(q, k, v, block_q=blocks[0], block_k=blocks[1], sinks=sinks,
                                    **opts)
    want, want_cache = sdpa_forward(q, k, v, _sdpa_mask(13, **{"causal": False, "window": None,
                                                               "n_sink": 0, **opts}),
                                    sinks=sinks)
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
    out, cache = flash_sdpa_forward(q, k, v, causal=True, block_q=2, block_k=3, sinks=sinks)
    keep = np.arange(4)[None, :] <= np.arange(9)[:, None] - 5  # (Tq, Tk)
    want, want_cache = sdpa_forward(q, k, v, keep, sinks=sinks)
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
    out, cache = flash_sdpa_forward(q, k, v, causal=True, block_q=3, block_k=4)
    want, want_cache = sdpa_forward(q, k, v, keep)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-12)
    assert np.isfinite(out).all() and np.all(out[:, :, ~keep.any(1)] == 0)
    dout = rng.standard_normal(out.shape)
    got = flash_sdpa_backward(dout, cache)
    _assert_same(got, sdpa_backward(dout, want_cache))
    assert all(np.isfinite(g).all() for g in got.values())


@pytest.mark.parametrize("opts", [dict(), dict(causal=True), dict(causal=True, window=3)])
def test_alibi_inside_flash_equals_sdpa_with_the_bias_and_its_slope_gradient(opts):
    rng = np.random.default_rng(7)
    q, k, v = _inputs(rng, Tq=11, Tk=11)
    slopes = alibi_slopes(6) * (1 + rng.random(6))
    out, cache = flash_sdpa_forward(q, k, v, slopes, block_q=4, block_k=3, **opts)
    mask = _sdpa_mask(11, **{"causal": False, "window": None, "n_sink": 0, **opts})
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
    out64, _ = flash_sdpa_forward(q, k, v, causal=True, block_q=16, block_k=8)
    out32, _ = flash_sdpa_forward(*(a.astype(np.float32) for a in (q, k, v)), causal=True,
                                  block_q=16, block_k=8)
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
        out, cache = flash_sdpa_forward(q, k, v, causal=True, block_q=64, block_k=64)
        flash_sdpa_backward(dout, cache)

    def dense():
        out, cache = sdpa_forward(q, k, v, causal_mask(T))
        sdpa_backward(dout, cache)

    assert _peak_bytes(dense) >= matrix
    assert _peak_bytes(flash) < matrix / 10


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=3), "window=3 needs causal=True"),
    (dict(causal=True, n_sink=2), "n_sink=2 needs a window"),
    (dict(block_q=0), "block_q must be > 0"),
    (dict(alibi_slopes=np.ones(5)), "alibi_slopes has shape"),
    (dict(sinks=np.ones(4)), "sinks has shape"),
])
def test_bad_options_are_errors(kwargs, match):
    q, k, v = _inputs(np.random.default_rng(0))
    with pytest.raises(ValueError, match=match):
        flash_sdpa_forward(q, k, v, **kwargs)


@pytest.mark.parametrize("mask_kw", [dict(), dict(mask="sliding", window=3, n_sink=1)])
def test_attention_module_with_flash_equals_sdpa(mask_kw):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 9, 16))
    mods = [Attention(16, 4, 2, rng=np.random.default_rng(1), dtype=np.float64,
                      attn_impl=impl, **mask_kw) for impl in ("sdpa", "flash")]
    mods[1].flash_block = 4
    dy = rng.standard_normal(x.shape)
    outs = [m.forward(x) for m in mods]
    np.testing.assert_allclose(outs[1][0], outs[0][0], rtol=0, atol=1e-12)
    dxs = [m.backward(dy, c) for m, (_, c) in zip(mods, outs)]
    np.testing.assert_allclose(dxs[1], dxs[0], rtol=0, atol=1e-12)
    for p0, p1 in zip(mods[0].parameters(), mods[1].parameters()):
        np.testing.assert_allclose(p1.grad, p0.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mask_kw", [dict(), dict(mask="sliding", window=3)])
def test_attention_module_with_sinks_flash_sdpa_and_decode_agree(mask_kw):
    """gpt-oss attention: flash equals sdpa (output, dx, every Param grad incl. sinks), and
    decoding token by token equals the full forward."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 9, 16))
    mods = [Attention(16, 4, 2, rng=np.random.default_rng(1), dtype=np.float64, qkv_bias=True,
                      o_bias=True, sinks=True, attn_impl=impl, flash_block=4, **mask_kw)
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


@pytest.mark.parametrize("opts", [dict(causal=True), dict(causal=True, window=5, n_sink=2),
                                  dict(alibi_slopes=alibi_slopes(6))])
def test_float32_numba_passes_equal_the_readable_numpy_twin(opts, monkeypatch):
    """flash_kernels' fused exp and dS passes (float32) against the NumPy lines they replace
    (SCRATCHLLM_READABLE=1), forward and every gradient, sinks included."""
    rng = np.random.default_rng(9)
    q, k, v = (a.astype(np.float32) for a in _inputs(rng, Tq=21, Tk=21))
    sinks, dout = rng.standard_normal(6).astype(np.float32), rng.standard_normal(
        (2, 6, 21, 3)).astype(np.float32)
    if "alibi_slopes" in opts:
        opts = dict(alibi_slopes=opts["alibi_slopes"].astype(np.float32))

    def run():
        out, cache = flash_sdpa_forward(q, k, v, block_q=8, block_k=5, sinks=sinks, **opts)
        return {"out": out, **flash_sdpa_backward(dout, cache)}

    assert fused_ok(q[:, :2, :8] @ k[:, :, :5].swapaxes(-1, -2))  # a block's scores: Numba
    fast = run()
    monkeypatch.setenv("SCRATCHLLM_READABLE", "1")
    assert not fused_ok(q)
    readable = run()
    for name, want in readable.items():
        np.testing.assert_allclose(fast[name], want, rtol=1e-5, atol=1e-5, err_msg=name)
