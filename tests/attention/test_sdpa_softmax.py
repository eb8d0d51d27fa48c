"""sdpa's fused softmax (attention/sdpa_softmax.py) against the readable path
(SCRATCHLLM_READABLE=1): outputs and gradients to 1e-6 (float32) / 1e-12 (float64), for a
causal, a sliding + sink, a per-head and no mask, with grouped heads and a fully masked row,
plain and soft-capped (Gemma 2: the fused kernels take c tanh(scale s / c) and its 1 - t^2)."""
import numpy as np
import pytest

from scratchllm.attention import attention_sink_mask, causal_mask, sdpa_backward, sdpa_forward
from scratchllm.attention.sdpa_softmax import kept_runs, softmax_scores_
from scratchllm.specs import AttentionSpec, Mask

TOL = {np.float32: 1e-6, np.float64: 1e-12}


def run(q, k, v, mask, dout, readable, monkeypatch, softcap=None):
    if readable:
        monkeypatch.setenv("SCRATCHLLM_READABLE", "1")
    else:
        monkeypatch.delenv("SCRATCHLLM_READABLE", raising=False)
    out, cache = sdpa_forward(q, k, v, None if mask is None else Mask(array=mask),
                              softcap=softcap)
    assert cache.fused == (not readable and (mask is None or mask.ndim == 2))
    return out, sdpa_backward(dout, cache)


@pytest.mark.parametrize("softcap", [None, 0.9])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["causal", "sink", "per-head", "none", "empty row", "runs"])
def test_fused_softmax_matches_the_readable_sdpa(kind, dtype, softcap, monkeypatch):
    rng = np.random.default_rng(0)
    B, H, Hkv, T, Dh = 2, 6, 2, 9, 5
    q = (2 * rng.standard_normal((B, H, T, Dh))).astype(dtype)
    k, v = (rng.standard_normal((B, Hkv, T, Dh)).astype(dtype) for _ in range(2))
    mask = {"causal": causal_mask(T), "sink": attention_sink_mask(T, 3, 2), "none": None,
            "per-head": rng.random((H, T, T)) < 0.7, "empty row": causal_mask(T),
            "runs": rng.random((T, T)) < 0.5}[kind]  # one mask, several runs of keys a row
    if kind == "empty row":
        mask = mask.copy()
        mask[4] = False
    dout = rng.standard_normal((B, H, T, Dh)).astype(dtype)
    out, g = run(q, k, v, mask, dout, False, monkeypatch, softcap)
    out_r, g_r = run(q, k, v, mask, dout, True, monkeypatch, softcap)
    for a, b in [(out, out_r)] + [(g[n], g_r[n]) for n in ("q", "k", "v")]:
        assert a.dtype == b.dtype == dtype
        assert np.max(np.abs(a - b)) <= TOL[dtype] * np.max(np.abs(b))
    if kind == "empty row":
        assert np.all(out[:, :, 4] == 0) and np.all(g["q"][:, :, 4] == 0)


def test_softmax_scores_rows_sum_to_one_and_respect_the_mask():
    s = np.random.default_rng(1).standard_normal((3, 4, 4)).astype(np.float32)
    p = softmax_scores_(s.copy(), causal_mask(4), 0.5)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-6)
    assert np.all(p[:, ~causal_mask(4)] == 0)
    e = np.exp(0.5 * s[0, 1, :2].astype(np.float64))
    np.testing.assert_allclose(p[0, 1, :2], e / e.sum(), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gqa_takes_the_fused_rope_and_softmax_and_matches_the_readable_path(dtype, monkeypatch):
    from scratchllm.attention import AttentionWeights, gqa_backward, gqa_forward
    from scratchllm.attention.rope_heads import rope_heads_backward
    rng = np.random.default_rng(3)
    B, T, D, H, Hkv = 2, 7, 16, 4, 2
    x = rng.standard_normal((B, T, D)).astype(dtype)
    w = AttentionWeights(*[(rng.standard_normal(s) * 0.5).astype(dtype)
                           for s in ((D, D), (D, D // 2), (D, D // 2), (D, D))])
    dy = rng.standard_normal((B, T, D)).astype(dtype)
    outs = []
    for readable in (False, True):
        monkeypatch.setenv("SCRATCHLLM_READABLE", "1" if readable else "0")
        y, cache = gqa_forward(x, w, spec=AttentionSpec(H, Hkv))
        monkeypatch.setenv("SCRATCHLLM_READABLE", "0" if readable else "1")  # chosen already
        fused = (cache.qkv.rope_q.backward is rope_heads_backward, cache.attend.fused)
        assert fused == (not readable, not readable)
        outs.append((y, gqa_backward(dy, cache)))
    (y, g), (y_r, g_r) = outs
    pairs = [(getattr(g["w"], n), getattr(g_r["w"], n)) for n in ("wq", "wk", "wv", "wo")]
    for a, b in [(y, y_r), (g["x"], g_r["x"])] + pairs:
        assert a.dtype == b.dtype == dtype
        assert np.max(np.abs(a - b)) <= TOL[dtype] * np.max(np.abs(b))


def test_a_row_of_nan_scores_stays_nan_as_on_the_readable_path():
    s = np.random.default_rng(0).standard_normal((1, 4, 4)).astype(np.float32)
    s[0, 1, :2] = np.nan  # every score row 1 keeps is NaN (a NaN weight upstream)
    keep = np.tril(np.ones((4, 4), bool))
    softmax_scores_(s, keep, 0.5)
    assert np.isnan(s[0, 1, :2]).all() and (s[0, 1, 2:] == 0).all()
    assert np.isfinite(s[0, [0, 2, 3]]).all()


def test_kept_runs_are_the_runs_of_each_mask_row():
    """kept_runs: rebuilding each row from its runs gives the mask back; a window with sinks
    has two runs a row once the window has left the sinks, causal one, an empty row none."""
    rng = np.random.default_rng(4)
    for keep in (rng.random((7, 11)) < 0.5, attention_sink_mask(9, 3, 2), causal_mask(5),
                 np.zeros((2, 3), bool), np.ones((1, 4), bool)):
        starts, ends, n_runs = kept_runs(keep)
        rebuilt = np.zeros_like(keep)
        for t in range(keep.shape[0]):
            for u in range(n_runs[t]):
                assert starts[t, u] < ends[t, u]
                rebuilt[t, starts[t, u]:ends[t, u]] = True
        assert np.array_equal(rebuilt, keep)
    assert kept_runs(attention_sink_mask(9, 3, 2))[2].tolist() == [1] * 5 + [2] * 4
    assert kept_runs(causal_mask(5))[2].tolist() == [1] * 5
