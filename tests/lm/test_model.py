"""The decoder LM: whole-model gradient checks per preset, cached decoding == full recompute,
config errors, tied heads, MoE statistics."""
import numpy as np
import pytest

from grads.cases import CASES, LM_TINY, lm_tiny
from scratchllm.lm import LM, preset
from scratchllm.specs import from_dict, from_flat, to_dict

PRESET_NAMES = ["dense", "moe", "mla", "swa", "hybrid"]
V = LM_TINY["vocab_size"]
tiny = lm_tiny


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_whole_model_gradients(name):
    """The registered grads case lm_NAME: every Param, CE + MoE aux terms (dense: also tied)."""
    reports = CASES[f"lm_{name}"](np.random.default_rng(7))
    for report in reports:
        assert report.ok, f"\n{report}"
    checked = {row.input for report in reports for row in report.rows}
    model = LM(tiny(name), rng=np.random.default_rng(0))
    assert checked == {n for n, _ in model.named_parameters()}


def test_tied_head_has_no_head_param():
    model = LM(tiny("dense", tie_embeddings=True), rng=np.random.default_rng(0))
    assert not any(name.startswith("head") for name, _ in model.named_parameters())


def test_loss_includes_weighted_aux_terms():
    rng = np.random.default_rng(2)
    cfg = tiny("moe", balance_coef=0.5, z_coef=0.25)
    model = LM(cfg, rng=rng, dtype=np.float64)
    ids = rng.integers(0, V, (2, 5))
    loss, cache = model.loss(ids, ids)
    moe = [c.ffn.inner.losses for c in cache.lm.blocks]  # each layer's unweighted aux and z
    expected = cache.ce + sum(0.5 * a + 0.25 * z for a, z in moe)
    assert len(cache.lm.aux) == cfg.n_layers
    assert [dict(terms) for terms in cache.lm.aux] == [{"balance": 0.5 * a, "z": 0.25 * z}
                                                       for a, z in moe]
    assert float(loss) == pytest.approx(expected, rel=1e-12)
    assert cache.aux > 0


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_cached_decoding_equals_full_recompute(name):
    rng = np.random.default_rng(3)
    model = LM(tiny(name), rng=rng, dtype=np.float64)
    T = 9  # longer than the swa window (3) + sinks (1): the rolling cache must wrap
    ids = rng.integers(0, V, (2, T))
    full, _ = model.forward(ids)  # (2, T, V)
    state = model.init_state(batch=2, max_len=T)
    for t in range(T):
        step = model.decode(ids[:, t], state, t)  # (2, V)
        np.testing.assert_allclose(step, full[:, t], rtol=0, atol=1e-9,
                                   err_msg=f"{name}: position {t}")


def test_float32_stays_float32():
    model = LM(tiny("moe"), rng=np.random.default_rng(0))
    ids = np.random.default_rng(1).integers(0, V, (2, 5))
    loss, cache = model.loss(ids, ids)
    model.loss_backward(1.0, cache)
    assert loss.dtype == np.float32
    assert all(p.grad.dtype == np.float32 for p in model.parameters())


def test_after_step_reports_usage_and_moves_the_bias():
    rng = np.random.default_rng(4)
    model = LM(tiny("mla", bias_gamma=0.1), rng=rng, dtype=np.float64)
    ids = rng.integers(0, V, (2, 7))
    _, cache = model.loss(ids, ids)
    stats = model.after_step(cache)
    assert [i for i, _ in stats] == [0, 1]
    for _, frac in stats:
        assert frac.sum() == pytest.approx(1.0)
    biases = [b for _, b in model.named_buffers()]
    assert all(np.abs(b).max() == pytest.approx(0.1) for b in biases)


@pytest.mark.parametrize("fields, message", [
    (dict(d_model=30, n_heads=4), "divisible by n_heads"),
    (dict(n_heads=4, n_kv_heads=3), "multiple of n_kv_heads"),
    (dict(attention="linear"), "attention must be"),
    (dict(ffn="moe", top_k=9, n_experts=8), "top_k=9"),
    (dict(layer_pattern="MAX", n_layers=3), "layer_pattern"),
    (dict(layer_pattern="MA", n_layers=3), "layer_pattern"),
    (dict(n_sink=2), "n_sink"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_config_errors_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        from_flat(**fields)


def test_config_round_trip_and_unknown_fields():
    cfg = preset("hybrid")
    assert from_dict(to_dict(cfg)) == cfg
    with pytest.raises(ValueError, match="unknown field"):
        from_dict(dict(to_dict(cfg), n_expert=3))
    with pytest.raises(ValueError, match="unknown preset"):
        preset("gpt5")


def test_bad_ids_raise():
    model = LM(tiny("dense"), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        model.forward(np.zeros(5, dtype=np.int64))
    with pytest.raises(TypeError, match="integer"):
        model.forward(np.zeros((1, 5)))


def test_forward_takes_input_ids_by_keyword():
    """transformers' keyword, forward(input_ids=ids), gives what forward(ids) gives; the ids
    go once."""
    model = LM(tiny("dense"), rng=np.random.default_rng(0))
    ids = np.arange(6)[None] % model.cfg.vocab_size
    assert np.array_equal(model.forward(input_ids=ids)[0], model.forward(ids)[0])
    assert np.array_equal(model.forward(**{"input_ids": ids})[0], model.forward(ids=ids)[0])
    for call in (lambda: model.forward(), lambda: model.forward(ids, input_ids=ids)):
        with pytest.raises(TypeError, match="give the token ids once"):
            call()


def test_a_config_too_big_for_memory_is_a_memory_error_naming_lm():
    cfg = from_flat(vocab_size=2 ** 20, d_model=2 ** 16, n_layers=64, n_heads=64,
                    n_kv_heads=64, d_ff=2 ** 18)  # a 2^36-float embedding: 256 GiB
    with pytest.raises(MemoryError, match=r"LM: the weights of this config \(d_model=65536"):
        LM(cfg, rng=np.random.default_rng(0))
