"""The continuous-batching engine: every request's tokens equal its own unbatched greedy
decode, paged == contiguous, preemption by recomputation, prefix sharing, copy-on-write that
never changes another sequence, and no request lost or duplicated."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM, generate_ids
from scratchllm.serve import PagedCache, decode_rows, forward_rows, generate_batch, make_engine

V = LM_TINY["vocab_size"]


@pytest.fixture(scope="module")
def model():
    return LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)


def _alone(model, prompt, n):
    """The request's own unbatched greedy decode (model.prefill, then model.decode)."""
    return list(generate_ids(model, prompt, n, None, temperature=0.0))


def _mix(seed, n=7, shared=()):
    rng = np.random.default_rng(seed)
    prompts = [list(shared) + [int(t) for t in rng.integers(0, V, rng.integers(1, 10))]
               for _ in range(n)]
    return prompts, [int(k) for k in rng.integers(0, 8, n)]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_mixes_equal_unbatched_decoding(model, seed):
    prompts, news = _mix(seed)
    want = [_alone(model, p, k) for p, k in zip(prompts, news)]
    assert generate_batch(model, prompts, news, kv="contiguous") == want
    assert generate_batch(model, prompts, news, kv="paged", block_size=4) == want
    tight = generate_batch(model, prompts, news, kv="paged", block_size=2, n_blocks=9)
    assert tight == want  # 9 blocks of 2 tokens: requests are preempted and recomputed
    assert [len(o) for o in tight] == news
    engine = make_engine(model, "paged", block_size=3, max_tokens=200, rows=False)
    for i, (p, k) in enumerate(zip(prompts, news)):
        engine.submit(i, p, k)  # LM.decode per group of equal lengths instead of decode_rows
    assert [engine.run()[i] for i in range(len(prompts))] == want


@pytest.mark.parametrize("kw", [dict(positions="sinusoidal"), dict(positions="learned"),
                                dict(qk_norm=True, qkv_bias=True),
                                dict(attn_softcap=0.5, logit_softcap=0.3, embed_scale=True)])
def test_decode_rows_equals_each_sequence_alone(kw):
    model = LM(lm_tiny("dense", **kw), rng=np.random.default_rng(0), dtype=np.float64)
    prompts = [[3, 1, 4], [1, 5, 9, 2, 6, 5, 3], [5, 8, 9, 7, 9]]
    cache = PagedCache(model, n_blocks=12, block_size=2)
    for s, p in enumerate(prompts):
        cache.blocks.add(s, p), cache.blocks.reserve(s, len(p) + 1)
        model.prefill(np.array([p]), cache.views([s], 0))
    logits = decode_rows(model, np.array([1, 2, 3]), cache, [0, 1, 2], np.array([3, 7, 5]))
    for b, p in enumerate(prompts):
        state = model.init_state(1, 10)
        model.prefill(np.array([p]), state)
        np.testing.assert_allclose(logits[b], model.decode(np.array([b + 1]), state, len(p))[0],
                                   rtol=0, atol=1e-12)


def test_preemption_happens_and_no_request_is_lost_or_duplicated(model):
    prompts, news = _mix(3, n=8)
    engine = make_engine(model, "paged", block_size=2, n_blocks=8)
    for i, (p, k) in enumerate(zip(prompts, news)):
        engine.submit(i, p, k)
    while engine.waiting or engine.running:
        engine.step()
        held = [r.rid for r in engine.waiting] + [r.rid for r in engine.running] + \
            list(engine.finished)
        assert sorted(held) == list(range(8))  # each request in exactly one place
        assert engine.cache.blocks.blocks_in_use() <= 8
    assert engine.stats["preemptions"] > 0
    assert [engine.finished[i].out for i in range(8)] == \
        [_alone(model, p, k) for p, k in zip(prompts, news)]
    assert engine.cache.blocks.blocks_in_use() == 0


def test_a_shared_system_prompt_hits_the_prefix_cache(model):
    system = [3, 1, 4, 1, 5, 9, 2, 6]
    prompts, news = _mix(4, n=5, shared=system)
    engine = make_engine(model, "paged", block_size=4, n_blocks=64)
    for i, (p, k) in enumerate(zip(prompts, news)):
        engine.submit(i, p, k)
    out = engine.run()
    assert [out[i] for i in range(5)] == [_alone(model, p, k) for p, k in zip(prompts, news)]
    bm = engine.cache.blocks
    assert bm.hits >= 2 * 4  # the system prompt's 2 blocks, for every request after the first


@pytest.mark.parametrize("seed", [8, 9])
def test_prefix_hits_with_preemption_and_freed_cached_blocks(model, seed):
    system = [3, 1, 4, 1, 5, 9]
    prompts, news = _mix(seed, n=8, shared=system)
    want = [_alone(model, p, k) for p, k in zip(prompts, news)]
    engine = make_engine(model, "paged", block_size=3, n_blocks=10)
    for i, (p, k) in enumerate(zip(prompts, news)):
        engine.submit(i, p, k)
    out = engine.run()
    assert [out[i] for i in range(8)] == want
    assert engine.cache.blocks.hits > 0 and engine.stats["preemptions"] > 0


@pytest.mark.parametrize("kv_dtype", ["int8", "fp8", "int4"])
def test_quantised_paged_equals_quantised_contiguous(model, kv_dtype):
    prompts, news = _mix(5, n=5)
    paged = generate_batch(model, prompts, news, kv="paged", block_size=4, kv_dtype=kv_dtype)
    assert paged == generate_batch(model, prompts, news, kv="contiguous", kv_dtype=kv_dtype)
    assert [len(o) for o in paged] == news


def test_copy_on_write_never_changes_the_other_sequence(model):
    prompt = [5, 2, 7, 1, 8, 3]  # 6 tokens: a partial second block of 4
    cache = PagedCache(model, n_blocks=8, block_size=4)
    bm = cache.blocks
    bm.add("a", prompt), bm.reserve("a", len(prompt))
    model.prefill(np.array([prompt]), cache.views(["a"], 0))
    bm.commit("a", prompt)
    bm.fork("a", "b")  # b shares both blocks, the partial one too
    for seq in ("a", "b"):
        cache.copy_blocks(bm.reserve(seq, 1))
    assert bm.tables["a"][1] != bm.tables["b"][1] and bm.tables["a"][0] == bm.tables["b"][0]
    logits = model.decode(np.array([11, 19]), cache.views(["a", "b"], 6), 6)  # (2, V)
    for row, t in zip(logits, (11, 19)):
        state = model.init_state(1, 8)
        model.prefill(np.array([prompt]), state)
        np.testing.assert_allclose(row, model.decode(np.array([t]), state, 6)[0],
                                   rtol=0, atol=1e-12)
    k_a, _ = cache.read(0, ["a"], [7])
    k_b, _ = cache.read(0, ["b"], [7])
    np.testing.assert_array_equal(k_a[..., :6, :], k_b[..., :6, :])
    assert not np.array_equal(k_a[..., 6, :], k_b[..., 6, :])


def test_edge_cases_and_errors(model):
    assert generate_batch(model, [[1, 2], [3]], [0, 1]) == [[], _alone(model, [3], 1)]
    with pytest.raises(ValueError, match="needs 3 blocks"):
        generate_batch(model, [[1, 2, 3, 4]], 2, block_size=2, n_blocks=2)
    with pytest.raises(ValueError, match="kv_dtype"):
        generate_batch(model, [[1]], 1, kv_dtype="int2")
    with pytest.raises(ValueError, match="full causal GQA"):
        generate_batch(LM(lm_tiny("swa"), rng=np.random.default_rng(0)), [[1]], 1)


@pytest.mark.parametrize("name", ["swa", "mla", "hybrid"])
def test_contiguous_serves_any_mixer_through_its_own_states(name):
    model = LM(lm_tiny(name), rng=np.random.default_rng(0), dtype=np.float64)
    prompts, news = _mix(7, n=4)
    want = [_alone(model, p, k) for p, k in zip(prompts, news)]
    assert generate_batch(model, prompts, news, kv="contiguous") == want


def test_forward_rows_continues_each_row_from_its_own_position(model):
    rng = np.random.default_rng(6)
    ids = rng.integers(0, V, (3, 9))  # row b holds starts[b] tokens, then 3 more in one call
    starts = np.array([2, 6, 4])
    cache = PagedCache(model, n_blocks=12, block_size=4)
    for s in range(3):
        cache.blocks.add(s, [0]), cache.blocks.reserve(s, starts[s] + 3)
        model.prefill(ids[s:s + 1, :starts[s]], cache.views([s], 0))
    chunk = np.stack([ids[s, starts[s]:starts[s] + 3] for s in range(3)])  # (3, 3)
    logits = forward_rows(model, chunk, cache, [0, 1, 2], starts)  # (3, 3, V)
    full, _ = model.forward(ids)  # (3, 9, V)
    for s in range(3):
        np.testing.assert_allclose(logits[s], full[s, starts[s]:starts[s] + 3], rtol=0,
                                   atol=1e-12)


@pytest.mark.parametrize("kind", ["paged", "contiguous"])
def test_batched_prefill_rows_equal_each_prompt_alone(model, kind):
    """Prompts of lengths 2, 7, 4 in one padded forward, one of them after a cached prefix
    of 3 tokens: each row's last logits equal its own forward's; padding is never stored."""
    from scratchllm.serve import ContiguousCache, prefill_rows
    rng = np.random.default_rng(8)
    prompts = [[int(t) for t in rng.integers(0, V, n)] for n in (2, 7, 4)]
    starts = np.array([0, 3, 0])
    if kind == "paged":
        cache = PagedCache(model, n_blocks=12, block_size=4)
        for s, p in enumerate(prompts):
            cache.blocks.add(s, [0]), cache.blocks.reserve(s, len(p))
    else:
        cache = ContiguousCache(model)
        for s, p in enumerate(prompts):
            cache.add(s, len(p))  # no room for padding: it must not be written
    model.prefill(np.array([prompts[1][:3]]), cache.views([1], 0))  # the cached prefix
    logits = prefill_rows(model, [p[s:] for p, s in zip(prompts, starts)], cache, [0, 1, 2],
                          starts)  # (3, V)
    for s, p in enumerate(prompts):
        np.testing.assert_allclose(logits[s], model.forward(np.array([p]))[0][0, -1], rtol=0,
                                   atol=1e-12)
    with pytest.raises(ValueError, match="non-empty"):
        prefill_rows(model, [[1], []], cache, [0, 1], np.array([0, 0]))


def test_the_engine_with_batched_prefill_equals_unbatched_decoding(model):
    prompts, news = _mix(3)
    news = [max(k, 1) for k in news]
    want = [_alone(model, p, k) for p, k in zip(prompts, news)]
    for kv in ("paged", "contiguous"):
        engine = make_engine(model, kv, block_size=4, max_tokens=300, batch_prefill=True)
        for i, (p, k) in enumerate(zip(prompts, news)):
            engine.submit(i, p, k)
        assert [engine.run()[i] for i in range(len(prompts))] == want
        assert engine.stats["prefill_calls"] == 1  # all admitted in the first step


def test_generate_batch_prefills_prompts_of_different_lengths_in_one_call(model, monkeypatch):
    """generate_batch(batch_prefill=True): the first step's prompts (lengths 1 to 9) go through
    one rows.prefill_rows call; every request's tokens equal its own unbatched greedy decode,
    on paged, contiguous and tight (preempting) caches; quantised caches give the tokens of
    the same cache prefilled one prompt at a time."""
    from scratchllm.serve import engine as engine_module
    calls, original = [], engine_module.prefill_rows

    def counting(model, prompts, *args):
        calls.append([len(p) for p in prompts])
        return original(model, prompts, *args)
    monkeypatch.setattr(engine_module, "prefill_rows", counting)
    prompts, news = _mix(11)
    want = [_alone(model, p, k) for p, k in zip(prompts, news)]
    admitted = [len(p) for p, k in zip(prompts, news) if k > 0]
    assert len(set(admitted)) > 1
    for kw in (dict(kv="contiguous"), dict(block_size=4)):
        calls.clear()
        assert generate_batch(model, prompts, news, batch_prefill=True, **kw) == want
        assert calls == [admitted]  # every prompt in the first step's one call
    calls.clear()
    tight = generate_batch(model, prompts, news, block_size=2, n_blocks=9, batch_prefill=True)
    assert tight == want and len(calls) > 1  # preempted requests are prefilled again later
    for kv_dtype in ("int8", "int4"):
        assert generate_batch(model, prompts, news, kv_dtype=kv_dtype, batch_prefill=True) \
            == generate_batch(model, prompts, news, kv_dtype=kv_dtype)
    with pytest.raises(ValueError, match="batch_prefill=True needs"):
        generate_batch(LM(lm_tiny("swa"), rng=np.random.default_rng(0)), [[1], [2, 3]], 1,
                       kv="contiguous", batch_prefill=True)
