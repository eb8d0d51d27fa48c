"""MLP-only layers (layer_pattern letter F, LayerSpec(mixer=None)) and the chapter's hybrid
recipe as the mamba2_hybrid preset: 43% Mamba-2, 7% attention, 50% MLP, one sub-layer per
layer."""
import numpy as np
import pytest

from scratchllm.lm import LM
from scratchllm.specs import FFNSpec, LayerSpec, NormSpec, from_dict, preset, to_dict
from scratchllm.specs.unflat import to_flat
from scratchllm.teach.sizing import kv_cache

TINY = dict(vocab_size=19, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24, d_state=4)


def test_the_recipe_preset_has_the_chapters_shares():
    cfg = preset("mamba2_hybrid")
    kinds = [type(layer.mixer).__name__ for layer in cfg.layers]
    shares = {k: kinds.count(k) / len(kinds) for k in set(kinds)}
    assert round(100 * shares["Mamba2Spec"]) == 43
    assert round(100 * shares["AttentionSpec"]) == 7
    assert round(100 * shares["NoneType"]) == 50
    # one sub-layer per layer: the mixers carry no FFN, the MLP layers no mixer
    assert all((layer.mixer is None) != (layer.ffn is None) for layer in cfg.layers)
    assert from_dict(to_dict(cfg)) == cfg
    assert preset(**dict(to_flat(cfg), name="mamba2_hybrid")) == cfg


def test_an_mlp_only_block_is_x_plus_swiglu_of_the_normed_x():
    cfg = preset("dense", **TINY, n_layers=2, layer_pattern="AF")
    model = LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    block = model.layers[1]
    assert block.mixer is None and block.norm1 is None
    x = np.random.default_rng(1).standard_normal((2, 5, 16))
    y, cache = block.forward(x)
    g = block.norm2.g.data
    a = x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.norm.eps) * g
    f = block.ffn
    h1, h3 = a @ f.W1.data, a @ f.W3.data
    want = x + (h1 / (1 + np.exp(-h1)) * h3) @ f.W2.data
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-12)
    dy = np.random.default_rng(2).standard_normal(y.shape)
    dx = block.backward(dy, cache)
    eps = 1e-6  # a directional derivative of sum(y * dy)
    u = np.random.default_rng(3).standard_normal(x.shape)
    fd = ((block.forward(x + eps * u)[0] - block.forward(x - eps * u)[0]) * dy).sum() / (2 * eps)
    assert abs(fd - (dx * u).sum()) < 1e-7 * abs(fd)


def test_decoding_through_mlp_only_layers_equals_the_forward():
    cfg = preset("mamba2_hybrid", **TINY, n_layers=4, layer_pattern="SFAF")
    model = LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    ids = np.random.default_rng(1).integers(0, 19, (2, 6))
    full, _ = model.forward(ids)
    state = model.init_state(2, 6)
    assert state[1] is None and state[3] is None  # an MLP layer keeps nothing
    steps = [model.decode(ids[:, t], state, t) for t in range(6)]
    np.testing.assert_allclose(np.stack(steps, axis=1), full, rtol=0, atol=1e-10)
    np.testing.assert_allclose(model.prefill(ids, model.init_state(2, 6)), full, atol=1e-10)
    assert cfg.n_params() == sum(p.data.size for p in model.parameters())
    assert kv_cache(cfg, 8).bytes_per_token == 2 * 2 * 4 * 2  # one attention layer: K, V of
    #                                                          Hkv 2 x Dh 4 in bf16


def test_mlp_only_layers_are_refused_where_they_cannot_be():
    with pytest.raises(ValueError, match="needs a mixer, an FFN or both"):
        LayerSpec(None, None)
    with pytest.raises(ValueError, match="MLP-only block .* is pre-norm"):
        LayerSpec(None, FFNSpec(), NormSpec(), "post")
    with pytest.raises(ValueError, match="MLP-only layers \\(F\\) but ffn='none'"):
        preset("dense", n_layers=2, layer_pattern="AF", ffn="none")
