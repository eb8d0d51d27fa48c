"""lm/lean_prefill.py: the lean prefill (two threads over the prompt's positions) equals the
general path (Block.prefill around Attention.prefill) in float64: the layers' output, the
logits after the head and the KV states it fills; and takes only the models and states it
covers."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM
from scratchllm.lm.lean_prefill import MIN_SPAN, lean_prefill, lean_prefill_ok
from test_lean_decode import LEAN

V = LM_TINY["vocab_size"]


def _model(kw, seed=5, dtype=np.float64):
    rng = np.random.default_rng(seed)
    model = LM(lm_tiny("dense", **kw), rng=rng, dtype=dtype)
    for p in model.parameters():  # biases and gains away from their init (0, 1)
        p.data += 0.1 * rng.standard_normal(p.data.shape).astype(dtype)
    return model, rng


def _general(model, x, state):
    """LM.trunk_prefill's layers: every Block.prefill in turn."""
    for layer, st in zip(model.layers, state):
        x = layer.prefill(x, st)  # (B, T, D)
    return x


@pytest.mark.parametrize("kw", LEAN, ids=str)
def test_lean_prefill_equals_the_general_path(kw):
    model, rng = _model(kw)
    T = 2 * MIN_SPAN + 5  # two spans of positions
    ids = rng.integers(0, V, (2, T))
    x = model._embed_forward(ids)[0]  # (2, T, D)
    lean, general = model.init_state(2, T + 3), model.init_state(2, T + 3)
    assert lean_prefill_ok(model, lean, T)
    got = lean_prefill(model, x, lean)  # (2, T, D)
    want = _general(model, x, general)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(model.prefill(ids, model.init_state(2, T)), model.unembed(want),
                               rtol=0, atol=1e-12)
    for a, b in zip(lean, general):  # the same keys and values, the same lengths
        np.testing.assert_allclose(a.k, b.k, rtol=0, atol=1e-12)
        np.testing.assert_allclose(a.v, b.v, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(a.lengths, b.lengths)
    nxt = rng.integers(0, V, 2)  # decoding continues from the lean state as from the general
    np.testing.assert_allclose(model.decode(nxt, lean, T), model.decode(nxt, general, T),
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("T, threads", [(1, 2), (MIN_SPAN - 1, 2), (3 * MIN_SPAN + 1, 3)])
def test_lean_prefill_spans(T, threads):
    model, rng = _model({}, seed=7)
    x = model._embed_forward(rng.integers(0, V, (1, T)))[0]  # (1, T, D)
    lean, general = model.init_state(1, T), model.init_state(1, T)
    np.testing.assert_allclose(lean_prefill(model, x, lean, threads=threads),
                               _general(model, x, general), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(lean[0].lengths, [T])


def test_float32_lean_prefill_is_close_and_finite():
    model, rng = _model({}, seed=8, dtype=np.float32)
    for layer in model.layers:
        layer.ffn.W1.data *= 1e4  # exp(-h) overflows float32 for h << 0
    x = model._embed_forward(rng.integers(0, V, (1, 2 * MIN_SPAN)))[0]
    lean, general = model.init_state(1, 2 * MIN_SPAN), model.init_state(1, 2 * MIN_SPAN)
    with np.errstate(over="raise"):
        got = lean_prefill(model, x, lean)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    want = _general(model, x, general)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-4 * np.abs(want).max())


def test_lean_prefill_ok_only_for_fresh_kv_states_of_lean_stacks(monkeypatch):
    model, _ = _model({})
    state = model.init_state(1, 4)
    assert lean_prefill_ok(model, state, 4)
    assert not lean_prefill_ok(model, state, 5)  # no room
    assert not lean_prefill_ok(model, state, 0)
    model.decode(np.array([1]), state, 0)
    assert not lean_prefill_ok(model, state, 2)  # not fresh
    for name, kw in [("swa", {}), ("dense", dict(qk_norm=True)), ("moe", {})]:
        other = LM(lm_tiny(name, **kw), rng=np.random.default_rng(0), dtype=np.float64)
        assert not lean_prefill_ok(other, other.init_state(1, 4), 4)
    monkeypatch.setenv("SCRATCHLLM_READABLE", "1")  # the readable twins: the general path
    assert not lean_prefill_ok(model, model.init_state(1, 4), 4)


def test_an_error_in_one_span_reaches_the_caller():
    model, rng = _model({}, seed=9)
    x = model._embed_forward(rng.integers(0, V, (1, 2 * MIN_SPAN)))[0]
    state = model.init_state(1, 2 * MIN_SPAN)
    model.layers[1].ffn.W2.data = model.layers[1].ffn.W2.data[:-1]  # a wrong shape
    with pytest.raises(ValueError, match="swiglu"):
        lean_prefill(model, x, state)


def test_lean_prefill_takes_as_many_spans_as_blas_has_threads(monkeypatch):
    import scratchllm.lm.lean_prefill as lp
    run, seen = lp.run_tasks, []

    def counted(fn, n_tasks, workers):
        seen.append(n_tasks)
        return run(fn, n_tasks, workers)
    monkeypatch.setattr(lp, "run_tasks", counted)
    model, rng = _model({}, seed=10)
    x = model._embed_forward(rng.integers(0, V, (1, 4 * MIN_SPAN)))[0]
    want = _general(model, x, model.init_state(1, 4 * MIN_SPAN))
    for blas, spans in [([1], 1), ([2], 2), ([3, 1], 3), ([], 1)]:
        monkeypatch.setattr(lp, "blas_threads", lambda blas=blas: blas)
        got = lean_prefill(model, x, model.init_state(1, 4 * MIN_SPAN))
        assert seen[-1] == spans
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
