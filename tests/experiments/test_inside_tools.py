"""Activation and attribution patching, FFN key-value memories and early exit, each on an
exact behaviour: patching every site from the clean run reproduces the clean logits, nothing
changes before the first differing token, attribution equals the patch where the metric is
linear and its gradient equals a finite difference, the hidden units rebuild the FFN's output,
and the exit's two ends are the first block's lens and the model."""
import numpy as np
import pytest

from scratchllm.experiments import (activation_patching, attribution_patching, early_exit,
                                    early_exit_tradeoff, ffn_hidden, ffn_memories, logit_lens,
                                    patched_logits, site_activations, site_gradients)
from scratchllm.lm import LM, preset

V = 40
KINDS = {"dense": dict(), "sandwich": dict(block="sandwich", norm_offset=1.0),
         "moe": dict(ffn="moe", n_experts=4, top_k=2), "hybrid": dict(layer_pattern="MA"),
         "no-final-norm": dict(final_norm=False)}


def model_of(seed=0, **kw):
    cfg = preset("dense", vocab_size=V, d_model=16, n_layers=2, **kw)
    model = LM(cfg, rng=np.random.default_rng(seed), dtype=np.float64)
    rng = np.random.default_rng(seed + 1)
    for p in model.parameters():
        p.data += 0.1 * rng.standard_normal(p.data.shape)
    return model


def prompts(B=2, T=6, at=2):
    clean = np.random.default_rng(5).integers(0, V, (B, T))
    corrupt = clean.copy()
    corrupt[:, at] = (corrupt[:, at] + 7) % V
    return clean, corrupt


@pytest.mark.parametrize("kind", ["dense", "sandwich", "hybrid"])
def test_patching_every_site_from_clean_gives_the_clean_logits(kind):
    model, (clean, corrupt) = model_of(**KINDS[kind]), prompts()
    acts, logits = site_activations(model, clean)
    np.testing.assert_array_equal(logits, model.forward(clean)[0])
    np.testing.assert_array_equal(patched_logits(model, corrupt, {}), model.forward(corrupt)[0])
    every = np.ones(clean.shape[1], bool)
    np.testing.assert_array_equal(
        patched_logits(model, corrupt, {s: (a, every) for s, a in acts.items()}), logits)
    np.testing.assert_array_equal(  # the last stream alone carries everything
        patched_logits(model, corrupt, {"L1.resid": (acts["L1.resid"], every)}), logits)


def test_activation_patching_changes_nothing_before_the_first_difference():
    model, (clean, corrupt) = model_of(), prompts(at=2)
    out = activation_patching(model, clean, corrupt, 3, 9)
    assert list(out["effect"]) == ["embed", "L0.mixer", "L0.ffn", "L0.resid", "L1.mixer",
                                   "L1.ffn", "L1.resid"]
    for site, effect in out["effect"].items():
        assert effect.shape == (6,) and np.all(effect[:2] == 0), site
    full = out["clean"] - out["corrupt"]  # the last position's stream holds the whole effect
    assert abs(out["effect"]["L1.resid"][-1] - full) < 1e-12 and abs(full) > 1e-3


def test_attribution_equals_the_patch_where_the_metric_is_linear():
    model, (clean, corrupt) = model_of(**KINDS["no-final-norm"]), prompts()
    exact = activation_patching(model, clean, corrupt, 3, 9)["effect"]
    estimate = attribution_patching(model, clean, corrupt, 3, 9)
    for site in ("L1.resid", "L1.ffn"):  # logits = x_L @ W_U: linear in both
        np.testing.assert_allclose(estimate[site], exact[site], rtol=0, atol=1e-12)
    assert np.abs(estimate["L0.mixer"] - exact["L0.mixer"]).max() > 1e-6  # elsewhere: estimate


def test_attribution_tracks_the_patch_on_a_small_model():
    model, (clean, corrupt) = model_of(), prompts()
    exact = activation_patching(model, clean, corrupt, 3, 9)["effect"]
    estimate = attribution_patching(model, clean, corrupt, 3, 9)
    a = np.concatenate(list(exact.values()))
    b = np.concatenate([estimate[s] for s in exact])
    assert np.corrcoef(a, b)[0, 1] > 0.5


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_site_gradients_are_the_metrics_derivative(kind):
    model, (_, ids) = model_of(**KINDS[kind]), prompts()
    grads_before = [p.grad.copy() for p in model.parameters()]
    M, acts, grads = site_gradients(model, ids, 3, 9)
    rng, eps = np.random.default_rng(0), 1e-6
    every = np.ones(ids.shape[1], bool)
    for site in ("embed", "L0.mixer", "L1.ffn"):
        d = rng.standard_normal(acts[site].shape)
        up, down = (patched_logits(model, ids, {site: (acts[site] + s * d, every)})
                    for s in (eps, -eps))
        fd = ((up - down)[:, -1, 3] - (up - down)[:, -1, 9]).mean() / (2 * eps)
        np.testing.assert_allclose((grads[site] * d).sum(), fd, rtol=1e-6)
    for p, g in zip(model.parameters(), grads_before):
        np.testing.assert_array_equal(p.grad, g)  # the Params' grads are left alone


def test_patching_refuses_what_it_cannot_read():
    clean, corrupt = prompts()
    with pytest.raises(ValueError, match="post-norm"):
        activation_patching(model_of(block="post"), clean, corrupt, 1)
    with pytest.raises(ValueError, match="one shape"):
        attribution_patching(model_of(), clean, corrupt[:, :4], 1)
    with pytest.raises(ValueError, match="not a token id"):
        site_gradients(model_of(), clean, V)


@pytest.mark.parametrize("ffn", ["swiglu", "geglu", "gelu_mlp", "relu_mlp"])
def test_ffn_hidden_units_rebuild_the_ffn_output(ffn):
    model = model_of(ffn=ffn)
    block = model.layers[1]
    a = np.random.default_rng(2).standard_normal((2, 5, 16))
    y = ffn_hidden(block.ffn, a) @ block.ffn.W2.data
    if getattr(block.ffn, "b2", None) is not None:
        y = y + block.ffn.b2.data
    np.testing.assert_allclose(y, block.ffn.forward(a)[0], rtol=0, atol=1e-12)


def test_ffn_memories_read_the_largest_keys_and_values():
    model, (ids, _) = model_of(), prompts()
    mem = ffn_memories(model, ids, 1, top=3)
    h = mem["activations"]  # (B, T, F)
    F = h.shape[-1]
    assert mem["key_tokens"].shape == mem["value_tokens"].shape == (F, 3)
    np.testing.assert_array_equal(mem["key_values"][:, 0], h.reshape(-1, F).max(0))
    b, t = mem["key_positions"][:, 0].T
    np.testing.assert_array_equal(mem["key_tokens"][:, 0], ids[b, t])
    np.testing.assert_array_equal(h[b, t, np.arange(F)], mem["key_values"][:, 0])
    assert np.all(np.diff(mem["value_logits"], axis=1) <= 0)  # largest first
    with pytest.raises(ValueError, match="not a dense FFN"):
        ffn_memories(model_of(**KINDS["moe"]), ids, 0)


def test_early_exit_ends_are_the_first_lens_and_the_model():
    model, (ids, _) = model_of(), prompts()
    lens = logit_lens(model, ids)
    never = early_exit(model, ids, 1.5)
    np.testing.assert_array_equal(never["tokens"], model.forward(ids)[0].argmax(-1))
    assert never["agreement"] == 1.0 and never["blocks_fraction"] == 1.0
    always = early_exit(model, ids, 0.0)
    np.testing.assert_array_equal(always["tokens"], lens[1].argmax(-1))
    assert always["blocks_fraction"] == 0.5 and np.all(always["exit_layer"] == 1)
    curve = early_exit_tradeoff(model, ids, [0.0, 0.05, 0.1, 0.5, 1.5])
    fractions = [f for _, _, f in curve]
    assert fractions == sorted(fractions) and curve[-1][1:] == (1.0, 1.0)
