"""MLA models in serving: paged and contiguous caches of latents [kv_norm(c_kv) | k_pe], one
decode call for rows at different positions, chunks after a prefix hit, batched prefill,
quantised latents, and speculative decoding with the model's own MTP modules drafting; every
request's tokens equal the model's own unbatched greedy decode (LatentKVState) exactly."""
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM, generate_ids
from scratchllm.serve import (ContiguousCache, PagedCache, decode_rows, forward_rows,
                              generate_batch, make_engine, paged_supported, speculative_generate)
from scratchllm.specs import MTPSpec

V = LM_TINY["vocab_size"]


def _mla(seed=0, mtp=None, **kw):
    cfg = lm_tiny("mla", **kw)
    cfg = cfg if mtp is None else replace(cfg, mtp=MTPSpec(mtp))
    return LM(cfg, rng=np.random.default_rng(seed), dtype=np.float64)


@pytest.fixture(scope="module")
def model():
    return _mla()


def _alone(model, prompt, n):
    """The request's own unbatched greedy decode (model.prefill, then model.decode)."""
    return list(generate_ids(model, prompt, n, None, temperature=0.0))


def _mix(seed, n=6, shared=(), vocab=V):
    rng = np.random.default_rng(seed)
    prompts = [list(shared) + [int(t) for t in rng.integers(0, vocab, rng.integers(1, 10))]
               for _ in range(n)]
    return prompts, [int(k) for k in rng.integers(1, 8, n)]


def test_the_caches_hold_one_latent_of_dc_plus_dr_per_token(model):
    cache = PagedCache(model, n_blocks=4, block_size=3)
    Dc, dr = LM_TINY["kv_lora_rank"], LM_TINY["qk_rope_head_dim"]
    assert [len(p) for p in cache.pools] == [1, 1]  # one stream per layer, not k and v
    assert cache.pools[0][0][0].shape == (4, 1, 3, Dc + dr) and cache.pools[0][0][1] is None
    q = PagedCache(model, n_blocks=4, block_size=3, kv_dtype="int8")
    assert q.codecs[0].group == 2 and q.pools[0][0][1].shape == (4, 1, 3, (Dc + dr) // 2)
    assert paged_supported(model)


def test_random_mixes_equal_unbatched_decoding(model):
    prompts, news = _mix(0)
    want = [_alone(model, p, k) for p, k in zip(prompts, news)]
    assert generate_batch(model, prompts, news, kv="contiguous") == want
    assert generate_batch(model, prompts, news, kv="paged", block_size=4) == want
    tight = generate_batch(model, prompts, news, kv="paged", block_size=2, n_blocks=8)
    assert tight == want  # preempted and recomputed
    assert generate_batch(model, prompts, news, block_size=3, batch_prefill=True) == want
    engine = make_engine(model, "paged", block_size=3, max_tokens=200, rows=False)
    for i, (p, k) in enumerate(zip(prompts, news)):
        engine.submit(i, p, k)  # LM.decode per group of equal lengths on LatentViews
    assert [engine.run()[i] for i in range(len(prompts))] == want


def test_a_shared_prefix_with_preemption_equals_unbatched_decoding(model):
    prompts, news = _mix(4, n=7, shared=[3, 1, 4, 1, 5, 9])
    want = [_alone(model, p, k) for p, k in zip(prompts, news)]
    engine = make_engine(model, "paged", block_size=3, n_blocks=10)
    for i, (p, k) in enumerate(zip(prompts, news)):
        engine.submit(i, p, k)
    assert [engine.run()[i] for i in range(7)] == want
    assert engine.cache.blocks.hits > 0 and engine.stats["preemptions"] > 0


@pytest.mark.parametrize("kw", [dict(), dict(q_lora_rank=5, rope_style="interleaved")])
def test_decode_rows_and_forward_rows_equal_each_sequence_alone(kw):
    model = _mla(**kw)
    rng = np.random.default_rng(6)
    ids = rng.integers(0, V, (3, 10))
    starts = np.array([2, 6, 4])
    cache = PagedCache(model, n_blocks=12, block_size=4)
    for s in range(3):
        cache.blocks.add(s, [0]), cache.blocks.reserve(s, starts[s] + 4)
        model.prefill(ids[s:s + 1, :starts[s]], cache.views([s], 0))
    logits = decode_rows(model, ids[np.arange(3), starts], cache, [0, 1, 2], starts)  # (3, V)
    full, _ = model.forward(ids)  # (3, 10, V)
    for s in range(3):
        state = model.init_state(1, 10)
        model.prefill(ids[s:s + 1, :starts[s]], state)
        alone = model.decode(ids[s, starts[s]:starts[s] + 1], state, int(starts[s]))[0]
        np.testing.assert_allclose(logits[s], alone, rtol=0, atol=1e-12)
        np.testing.assert_allclose(logits[s], full[s, starts[s]], rtol=0, atol=1e-12)
    chunk = np.stack([ids[s, starts[s] + 1:starts[s] + 4] for s in range(3)])  # (3, 3)
    rows = forward_rows(model, chunk, cache, [0, 1, 2], starts + 1)  # (3, 3, V)
    for s in range(3):
        np.testing.assert_allclose(rows[s], full[s, starts[s] + 1:starts[s] + 4], rtol=0,
                                   atol=1e-12)


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8", "int4"])
def test_quantised_latents_paged_equal_contiguous_and_stay_within_the_bound(model, kv_dtype):
    prompts, news = _mix(5, n=4)
    paged = generate_batch(model, prompts, news, block_size=4, kv_dtype=kv_dtype)
    assert paged == generate_batch(model, prompts, news, kv="contiguous", kv_dtype=kv_dtype)
    exact, quant = ContiguousCache(model), ContiguousCache(model, kv_dtype)
    for c in (exact, quant):
        c.add(0, 8)
        model.prefill(np.array([prompts[0][:8]]), c.views([0], 0))
    n = len(prompts[0][:8])
    (a,), (b,) = exact.read(0, [0], [n]), quant.read(0, [0], [n])  # (1, 1, n, Dc+dr)
    Dc = LM_TINY["kv_lora_rank"]
    for part in (slice(None, Dc), slice(Dc, None)):  # the latent's and the rope key's scales
        amax = np.abs(a[..., part]).max(-1, keepdims=True)  # no group spans both parts
        tol = {"int8": amax / 127 / 2, "int4": amax / 7 / 2,
               "fp8": 2.0 ** -4 * np.abs(a[..., part]) + 2.0 ** -10 * amax / 448}[kv_dtype]
        assert (np.abs(b[..., part] - a[..., part]) <= tol * (1 + 1e-6)).all()


@pytest.mark.parametrize("draft,k", [("mtp", 1), ("mtp", 3), ("mtp:1", 4)])
def test_speculation_with_the_mla_models_own_mtp_modules_equals_its_greedy_output(draft, k):
    target = _mla(mtp=2)
    prompt = [3, 1, 4, 1, 5]
    ids, stats = speculative_generate(target, draft, prompt, 12, k=k)
    assert ids == _alone(target, prompt, 12)
    assert stats["proposed"] > 0 and 0 <= stats["accepted"] <= stats["proposed"]


def test_speculation_with_an_mla_draft_model_equals_the_targets_greedy_output(model):
    draft = _mla(seed=1, n_layers=1)
    prompt = [2, 7, 1, 8]
    ids, stats = speculative_generate(model, draft, prompt, 10, k=3)
    assert ids == _alone(model, prompt, 10)
    ids, stats = speculative_generate(model, model, prompt, 10, k=3)  # a perfect draft
    assert ids == _alone(model, prompt, 10) and stats["accepted"] == stats["proposed"]


@pytest.mark.parametrize("name", ["deepseek_v3_mtp", "deepseek_v2"])
def test_loaded_deepseek_checkpoints_serve_batched_and_draft_with_their_mtp_layers(name):
    """DeepSeek-V3 with its two MTP layers (the MTP modules draft for it) and DeepSeek-V2
    (q_lora, YaRN RoPE with its mscale): the engine's tokens and the speculative ones equal
    each model's own greedy decode."""
    from scratchllm.hub import load_pretrained
    model = load_pretrained(Path(__file__).parents[1] / "fixtures" / "hf" / name,
                            dtype=np.float64)
    vocab = model.cfg.vocab_size
    prompts, news = _mix(3, n=4, vocab=vocab)
    want = [_alone(model, p, k) for p, k in zip(prompts, news)]
    assert generate_batch(model, prompts, news, block_size=4) == want
    if model.mtp is not None:
        ids, stats = speculative_generate(model, "mtp", prompts[0], 9, k=2)
        assert ids == _alone(model, prompts[0], 9) and stats["proposed"] > 0


def test_an_indexer_is_refused_by_the_paged_cache_and_served_by_its_own_states():
    model = _mla(index_topk=3, index_n_heads=2, index_head_dim=4, q_lora_rank=5)
    assert not paged_supported(model)
    with pytest.raises(ValueError, match="indexer"):
        PagedCache(model, n_blocks=4, block_size=2)
    prompts, news = _mix(2, n=2)
    assert generate_batch(model, prompts, news, kv="contiguous") == \
        [_alone(model, p, k) for p, k in zip(prompts, news)]
