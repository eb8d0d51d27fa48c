"""The tools on small float64 models of every kind of block: the logit lens's last row is the
model's logits, direct logit attribution sums to the logit, attention patterns are the
forward's own, and the head scores find the heads they name."""
import numpy as np
import pytest

from scratchllm.experiments import (attention_patterns, direct_logit_attribution, head_scores,
                                    logit_lens)
from scratchllm.lm import LM, preset

V = 40
CONFIGS = {
    "dense": dict(),
    "gpt2-like": dict(norm="layernorm", positions="learned", qkv_bias=True, o_bias=True,
                      tie_embeddings=True),
    "sandwich": dict(block="sandwich", norm_offset=1.0),
    "moe": dict(ffn="moe", n_experts=4, top_k=2),
    "hybrid": dict(layer_pattern="MA"),
    "softcap": dict(logit_softcap=3.0, attn_softcap=2.0),
    "no-final-norm": dict(final_norm=False, embed_norm=True),
}


def model_of(name, seed=0):
    cfg = preset("dense", vocab_size=V, d_model=16, n_layers=2, **CONFIGS[name])
    model = LM(cfg, rng=np.random.default_rng(seed), dtype=np.float64)
    rng = np.random.default_rng(seed + 1)
    for p in model.parameters():  # off the initial values (gains 1, biases 0)
        p.data += 0.1 * rng.standard_normal(p.data.shape)
    return model


def ids_of(B=2, T=7, seed=3):
    return np.random.default_rng(seed).integers(0, V, (B, T))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logit_lens_last_layer_is_the_models_logits(name):
    model, ids = model_of(name), ids_of()
    lens = logit_lens(model, ids)
    assert lens.shape == (model.cfg.n_layers + 1, *ids.shape, V)
    np.testing.assert_array_equal(lens[-1], model.forward(ids)[0])
    assert not np.allclose(lens[0], lens[-1])  # the earlier rows read something else


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_direct_logit_attribution_sums_to_the_logit(name):
    model, ids = model_of(name), ids_of()
    logits = model.forward(ids)[0]
    for target in (0, 17):
        parts = direct_logit_attribution(model, ids, target)
        assert all(p.shape == ids.shape for p in parts.values())
        logit = logits[..., target]
        cap = model.cfg.logit_softcap
        logit = logit if cap is None else cap * np.arctanh(logit / cap)  # before the cap
        np.testing.assert_allclose(sum(parts.values()), logit, rtol=0, atol=1e-10)


def test_attribution_names_every_head_and_each_one_counts():
    model, ids = model_of("dense"), ids_of()
    parts = direct_logit_attribution(model, ids, 5)
    H = model.cfg.layers[0].mixer.n_heads
    heads = [f"L{i}.H{h}" for i in range(2) for h in range(H)]
    assert [k for k in parts if ".H" in k] == heads
    assert {"embed", "L0.ffn", "L1.ffn"} <= set(parts)
    logit = model.forward(ids)[0][..., 5]
    without = sum(v for k, v in parts.items() if k != "L1.H2")
    assert np.abs(without - logit).max() > 1e-6  # a head left out breaks the sum


def test_attribution_refuses_post_norm_and_a_bad_target():
    cfg = preset("dense", vocab_size=V, d_model=16, n_layers=1, block="post")
    model = LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match="post-norm"):
        direct_logit_attribution(model, ids_of(), 1)
    with pytest.raises(ValueError, match="not a token id"):
        direct_logit_attribution(model_of("dense"), ids_of(), V)


@pytest.mark.parametrize("name", ["dense", "gpt2-like", "hybrid"])
def test_attention_patterns_are_causal_distributions(name):
    model, ids = model_of(name), ids_of()
    patterns = attention_patterns(model, ids)
    attn_layers = [i for i, s in enumerate(model.cfg.layers) if hasattr(s.mixer, "n_kv_heads")]
    assert sorted(patterns) == attn_layers
    for P in patterns.values():
        np.testing.assert_allclose(P.sum(-1), 1.0, atol=1e-12)
        assert np.all(np.triu(P[0, 0], 1) == 0)


def _one_hot_pattern(T, keys):
    """(1, 1, T, T) attention with query t entirely on keys[t]."""
    P = np.zeros((1, 1, T, T))
    P[0, 0, np.arange(T), keys] = 1.0
    return P


def test_head_scores_find_the_head_each_names():
    n = 6
    r = np.random.default_rng(0).permutation(V)[:n]
    ids = np.concatenate([r, r])[None]  # (1, 2n): every token distinct within a half
    T, t = 2 * n, np.arange(2 * n)
    prev = _one_hot_pattern(T, np.maximum(t - 1, 0))
    induction = _one_hot_pattern(T, np.where(t >= n, t - n + 1, 0))
    sink = _one_hot_pattern(T, np.zeros(T, int))
    scores = head_scores(None, ids, patterns={0: prev, 1: induction, 2: sink})
    assert scores["previous_token"][0][0] == 1.0 and scores["sink"][2][0] == 1.0
    assert scores["induction"][1][0] == 1.0
    assert scores["induction"][0][0] == 0.0 and scores["previous_token"][1][0] < 0.2


def test_steering_with_nothing_changes_nothing_and_reads_the_residual():
    from scratchllm.experiments import steered_logits, steering_vector
    model, ids = model_of("dense"), ids_of()
    logits = model.forward(ids)[0]
    v = steering_vector(model, ids, ids_of(seed=9), 0)
    assert v.shape == (16,) and np.abs(v).max() > 0
    np.testing.assert_allclose(steered_logits(model, ids, 0, v, scale=0.0), logits, atol=1e-12)
    np.testing.assert_allclose(steered_logits(model, ids, -1, 0 * v), logits, atol=1e-12)
    last = len(model.layers) - 1  # after the last block: only the final norm and head remain
    x_L = model.residual_stream(ids)[-1]
    np.testing.assert_allclose(steered_logits(model, ids, last, v, 2.0),
                               model.unembed(x_L + 2.0 * v), atol=1e-12)
    assert np.abs(steered_logits(model, ids, 0, v, 4.0) - logits).max() > 1e-3
    with pytest.raises(ValueError, match="layer must be"):
        steered_logits(model, ids, 2, v)
