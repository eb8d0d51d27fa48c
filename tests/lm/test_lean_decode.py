"""lm/lean_decode.py: LM.decode's lean step for plain pre-norm Llama-style stacks equals the
general path (Block.decode around gqa_decode) and the full causal forward, and takes only
the steps and models it covers."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM
from scratchllm.lm.lean_decode import lean_decode, lean_layers, lean_step

V = LM_TINY["vocab_size"]
LEAN = [{}, dict(qkv_bias=True, o_bias=True), dict(rope_style="interleaved"),
        dict(rope_partial=0.5), dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
        dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0,
                           "original_max_position_embeddings": 3}), dict(norm_offset=1.0),
        dict(attn_scale=0.3), dict(n_kv_heads=4), dict(head_dim=6)]


def _general(model, ids_t, state, position):
    """LM.decode's general path: every layer's Block.decode, then the head."""
    x = model._embed_forward(ids_t[:, None], position)[0][:, 0]  # (B, D)
    for layer, st in zip(model.layers, state):
        x = layer.decode(x, st, position)  # (B, D)
    return model.unembed(x)  # (B, V)


@pytest.mark.parametrize("kw", LEAN, ids=str)
def test_lean_decode_equals_the_general_path_and_the_forward(kw):
    rng = np.random.default_rng(5)
    model = LM(lm_tiny("dense", **kw), rng=rng, dtype=np.float64)
    for p in model.parameters():  # biases and gains away from their init (0, 1)
        p.data += 0.1 * rng.standard_normal(p.data.shape)
    assert lean_layers(model)
    T = 6
    ids = rng.integers(0, V, (2, T))
    lean, general = model.init_state(2, T), model.init_state(2, T)
    steps = []
    for t in range(T):
        assert lean_step(model, lean, t)
        steps.append(model.decode(ids[:, t], lean, t))  # (2, V)
        np.testing.assert_allclose(steps[-1], _general(model, ids[:, t], general, t),
                                   rtol=0, atol=1e-12)
    for a, b in zip(lean, general):  # the same keys and values appended
        np.testing.assert_allclose(a.k, b.k, rtol=0, atol=1e-12)
        np.testing.assert_allclose(a.v, b.v, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(a.lengths, b.lengths)
    if "dynamic" not in str(kw):  # dynamic NTK scales by the length seen: no one forward
        logits, _ = model.forward(ids)  # (2, T, V): the training forward, causal
        np.testing.assert_allclose(np.stack(steps, 1), logits, rtol=0, atol=1e-10)


def test_float32_lean_decode_is_close_to_the_general_path():
    rng = np.random.default_rng(6)
    model = LM(lm_tiny("dense"), rng=rng)  # float32
    ids = rng.integers(0, V, (1, 5))
    lean, general = model.init_state(1, 5), model.init_state(1, 5)
    for t in range(5):
        a = model.decode(ids[:, t], lean, t)
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, _general(model, ids[:, t], general, t), rtol=0,
                                   atol=2e-5)


@pytest.mark.parametrize("name, kw", [("swa", {}), ("dense", dict(qk_norm=True)),
                                      ("dense", dict(attn_softcap=20.0)), ("moe", {}),
                                      ("mla", {}), ("dense", dict(block="post")),
                                      ("dense", dict(norm="layernorm"))], ids=str)
def test_other_stacks_take_the_general_path(name, kw):
    model = LM(lm_tiny(name, **kw), rng=np.random.default_rng(0), dtype=np.float64)
    assert not lean_layers(model)
    assert not lean_step(model, model.init_state(1, 4), 0)


def test_lean_step_only_for_a_plain_step(monkeypatch):
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    state = model.init_state(2, 3)
    assert lean_step(model, state, 0)
    assert not lean_step(model, state, 1)  # the rows hold 0 tokens, not 1
    assert not lean_step(model, state, np.array([0, 0]))  # one position per row
    model.decode(np.array([1, 2]), state, np.array([0, 0]))  # the general path
    assert lean_step(model, state, 1)
    for st in state:
        st.lengths[1] = 0  # row 1 restarted: the rows out of step
    assert not lean_step(model, state, 1)
    full = model.init_state(1, 2)
    model.decode(np.array([1]), full, 0)
    model.decode(np.array([1]), full, 1)
    assert not lean_step(model, full, 2)  # no room: the general path raises
    with pytest.raises(ValueError, match="KVState is full"):
        model.decode(np.array([1]), full, 2)
    monkeypatch.setenv("SCRATCHLLM_READABLE", "1")  # the readable twins: the general path
    assert not lean_step(model, model.init_state(1, 3), 0)


def test_lean_decode_silu_of_large_negative_gates_is_finite():
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0))  # float32
    for layer in model.layers:
        layer.ffn.W1.data *= 1e4  # exp(-h) overflows float32 for h << 0
    state = model.init_state(1, 2)
    x = model._embed_forward(np.array([[3]]))[0][:, 0]  # (1, D)
    with np.errstate(over="raise"):
        y = lean_decode(model, x, state, 0)
    assert np.isfinite(y).all()
