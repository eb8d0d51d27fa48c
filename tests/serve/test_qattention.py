"""Decode attention read straight from a quantised paged cache (serve/qattention.py): the
fused Numba twin equals the readable twin (dequantise everything, then attend) and both equal
sdpa on what PagedCache.read gives, for int8, fp8 and int4, float32 and float64, GQA, blocks
in any order and sequences of different lengths."""
import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.attention import sdpa_forward
from scratchllm.lm import LM
from scratchllm.serve import PagedCache
from scratchllm.serve.qattention import (QUANTIZED_PAGED_ATTENTION, ScoreOptions,
                                         quantized_paged_attention,
                                         quantized_paged_attention_ref)
from scratchllm.serve.quantize import quantize
from scratchllm.specs import Mask


def _pools(rng, fmt, g, n_blocks=10, Hkv=2, bs=4, Dh=8):
    k = quantize(rng.standard_normal((n_blocks, Hkv, bs, Dh)), fmt, group_size=g)
    v = quantize(rng.standard_normal((n_blocks, Hkv, bs, Dh)), fmt, group_size=g)
    return (k.codes, k.scales), (v.codes, v.scales)


@pytest.mark.parametrize("fmt,g", [("int8", 8), ("fp8", 4), ("int4", 4)])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 2e-6)])
@pytest.mark.parametrize("options", [{}, dict(softcap=0.7, sinks=np.array([0.5, -1, 2, 0]))])
def test_the_fused_twin_equals_the_readable_twin(fmt, g, dtype, tol, options):
    rng = np.random.default_rng(0)
    scores = ScoreOptions(8 ** -0.5, **options)
    kp, vp = _pools(rng, fmt, g)
    table = rng.permutation(10)[:9].reshape(3, 3)  # (B, nb) blocks in any order
    lengths = np.array([5, 12, 1])
    q = rng.standard_normal((3, 4, 8)).astype(dtype)  # H = 4 over Hkv = 2
    a, _ = quantized_paged_attention(q, kp, vp, table, lengths, fmt=fmt, group_size=g,
                                     scores=scores)
    b, _ = quantized_paged_attention_ref(q, kp, vp, table, lengths, fmt=fmt, group_size=g,
                                         scores=scores)
    assert a.dtype == dtype and np.abs(a - b).max() <= tol * np.abs(b).max()


@pytest.mark.parametrize("fmt", ["int8", "fp8", "int4"])
def test_it_is_sdpa_on_the_paged_caches_dequantised_keys(fmt):
    """A tiny model's layer-0 keys and values in a quantised PagedCache: the kernel on its
    pools and block tables equals sdpa on PagedCache.read (the decode path's dequantise then
    attend)."""
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    cache = PagedCache(model, n_blocks=12, block_size=4, kv_dtype=fmt)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3, 5, 8, 9, 7], [2]]
    for s, p in enumerate(prompts):
        cache.blocks.add(s, p), cache.blocks.reserve(s, len(p))
        model.prefill(np.array([p]), cache.views([s], 0))
    lengths = np.array([len(p) for p in prompts])
    K, V = cache.read(0, [0, 1, 2], lengths)  # (B, Hkv, L, Dh)
    B, Hkv, L, Dh = K.shape
    H = model.layers[0].mixer.spec.n_heads
    q = np.random.default_rng(1).standard_normal((B, H, Dh))
    keep = (np.arange(L) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, L)
    want, _ = sdpa_forward(q[:, :, None], np.repeat(K, H // Hkv, 1), np.repeat(V, H // Hkv, 1),
                           Mask(array=keep), Dh ** -0.5)  # (B, H, 1, Dh)
    nb = cache.blocks.blocks_for(L)
    table = np.array([(t + t[:1] * nb)[:nb] for t in (cache.blocks.tables[s] for s in range(3))])
    out, _ = QUANTIZED_PAGED_ATTENTION.forward(q, *cache.pools[0], table, lengths, fmt=fmt,
                                               group_size=cache.codecs[0].group,
                                               scores=ScoreOptions(Dh ** -0.5))
    np.testing.assert_allclose(out, want[:, :, 0], rtol=0, atol=1e-12)


def test_bad_inputs_and_no_backward():
    rng = np.random.default_rng(2)
    kp, vp = _pools(rng, "int8", 8)
    q, table = rng.standard_normal((2, 4, 8)), np.array([[0, 1], [2, 3]])
    with pytest.raises(ValueError, match="lengths must be 1 .. nb \\* bs = 8"):
        quantized_paged_attention(q, kp, vp, table, np.array([9, 1]), fmt="int8",
                                  group_size=8, scores=ScoreOptions(1.0))
    with pytest.raises(ValueError, match="fmt must be one of"):
        quantized_paged_attention(q, kp, vp, table, np.array([2, 1]), fmt="int2",
                                  group_size=8, scores=ScoreOptions(1.0))
    with pytest.raises(ValueError, match="H a multiple"):
        quantized_paged_attention(q[:, :3], kp, vp, table, np.array([2, 1]), fmt="int8",
                                  group_size=8, scores=ScoreOptions(1.0))
    _, cache = QUANTIZED_PAGED_ATTENTION.forward(q, kp, vp, table, np.array([2, 1]),
                                                 fmt="int8", group_size=8, scores=ScoreOptions(1.0))
    with pytest.raises(NotImplementedError, match="inference only"):
        QUANTIZED_PAGED_ATTENTION.backward(np.ones_like(q), cache)


@pytest.mark.parametrize("fmt,kw", [("int8", {}), ("int4", dict(attn_output_gate=True)),
                                    ("fp8", dict(attn_softcap=0.5, attn_sinks=True))])
def test_decode_rows_on_a_quantised_paged_cache_reads_the_codes_in_the_kernel(fmt, kw,
                                                                              monkeypatch):
    """decode_rows, LM.decode and one-token forward_rows on a quantised PagedCache(kernel=True)
    go through the kernel (once per layer; not without kernel=True) and give the logits of
    LM.decode on the same cache without it (dequantise, then attend) to 1e-12, soft-capped
    scores, sink logits and an output gate too."""
    from scratchllm.serve import decode_rows, forward_rows, qattention
    model = LM(lm_tiny("dense", **kw), rng=np.random.default_rng(0), dtype=np.float64)
    for layer in model.layers:  # sinks away from 0, so that they matter
        if layer.mixer.sinks is not None:
            layer.mixer.sinks.data[...] = np.linspace(-1, 2, layer.mixer.sinks.data.size)
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3], [5, 8, 9, 7, 9]]
    caches = []
    for kernel in (True, False):
        cache = PagedCache(model, n_blocks=12, block_size=2, kv_dtype=fmt, kernel=kernel)
        for s, p in enumerate(prompts):
            cache.blocks.add(s, p), cache.blocks.reserve(s, len(p) + 3)
            model.prefill(np.array([p]), cache.views([s], 0))
        caches.append(cache)
    calls = []
    kernel = qattention.quantized_paged_attention
    monkeypatch.setattr(qattention, "QUANTIZED_PAGED_ATTENTION", qattention.Twin(
        (lambda *a, **k: calls.append(1) or kernel(*a, **k), None), (None, None)))
    monkeypatch.setenv("SCRATCHLLM_READABLE", "0")
    import scratchllm.serve.views as views
    monkeypatch.setattr(views, "QUANTIZED_PAGED_ATTENTION", qattention.QUANTIZED_PAGED_ATTENTION)
    ids, positions = np.array([1, 2, 3]), np.array([3, 7, 5])
    fused = decode_rows(model, ids, caches[0], [0, 1, 2], positions)  # (3, V)
    assert len(calls) == len(model.layers)
    decode_rows(model, ids, caches[1], [0, 1, 2], positions)
    assert len(calls) == len(model.layers)  # kernel=False (the default): dequantise first
    want = model.decode(ids, caches[1].views([0, 1, 2], positions), positions)  # (3, V)
    np.testing.assert_allclose(fused, want, rtol=0, atol=1e-12)
    ids2, at = np.array([4, 5, 6]), positions + 1  # LM.decode on the kernel cache's views
    fused = model.decode(ids2, caches[0].views([0, 1, 2], at), at)  # (3, V)
    assert len(calls) == 2 * len(model.layers)
    want = model.decode(ids2, caches[1].views([0, 1, 2], at), at)  # (3, V)
    np.testing.assert_allclose(fused, want, rtol=0, atol=1e-12)
    ids3, at = np.array([[7], [8], [9]]), at + 1  # forward_rows with one token per row
    fused = forward_rows(model, ids3, caches[0], [0, 1, 2], at)[:, 0]  # (3, V)
    assert len(calls) == 3 * len(model.layers)
    want = model.decode(ids3[:, 0], caches[1].views([0, 1, 2], at), at)  # (3, V)
    np.testing.assert_allclose(fused, want, rtol=0, atol=1e-12)
