"""Early exit inside a greedy decoding loop: at threshold 1 it is the model's own greedy
decoding token for token; at threshold 0 every token leaves after block 1 with the first
block's lens as its prediction, and the blocks it skips hold, for that token, the keys and
values their projections give on the exit's hidden state (CALM's state propagation)."""
import numpy as np
import pytest

from scratchllm.experiments import early_exit_decode, logit_lens
from scratchllm.lm import LM, preset

V = 40


def model_of(**kw):
    cfg = preset("dense", vocab_size=V, d_model=16, n_layers=3, n_heads=4, n_kv_heads=2, **kw)
    model = LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    rng = np.random.default_rng(1)
    for p in model.parameters():
        p.data += 0.1 * rng.standard_normal(p.data.shape)
    return model


def greedy(model, prompt, n):
    state = model.init_state(prompt.shape[0], prompt.shape[1] + n)
    logits, out = model.prefill(prompt, state)[:, -1], []
    for pos in range(prompt.shape[1], prompt.shape[1] + n):
        out.append(logits.argmax(-1))
        logits = model.decode(out[-1], state, pos)
    return np.stack(out, 1)


@pytest.mark.parametrize("kw", [dict(), dict(layer_pattern="MAA", expand=1)],
                         ids=["attention", "hybrid"])
def test_threshold_one_is_the_models_greedy_decoding(kw):
    model, prompt = model_of(**kw), np.random.default_rng(2).integers(0, V, (2, 5))
    run = early_exit_decode(model, prompt, 6, 1.0)
    np.testing.assert_array_equal(run.tokens, greedy(model, prompt, 6))
    assert run.blocks_fraction == 1.0 and (run.exit_layer == 3).all()


def test_threshold_zero_exits_after_block_one_and_propagates_the_state():
    model, prompt = model_of(), np.random.default_rng(3).integers(0, V, (2, 5))
    run = early_exit_decode(model, prompt, 4, 0.0)
    assert (run.exit_layer == 1).all() and run.blocks_fraction == 1 / 3
    np.testing.assert_array_equal(run.tokens[:, 0], logit_lens(model, prompt)[1][:, -1].argmax(-1))
    # block 1 always ran, so x_1 of the whole sequence is exact; the later blocks' k, v for the
    # decoded tokens are their projections of norm1(x_1)
    seq = np.concatenate([prompt, run.tokens[:, :-1]], 1)  # (B, 8): the tokens fed in
    x1 = model.residual_stream(seq)[1]
    for layer, state in zip(model.layers[1:], run.state[1:]):
        _, cache = layer.mixer.forward(layer.norm1.forward(x1)[0])
        K, Vs = state.kv()
        np.testing.assert_allclose(K[:, :, 4:8], cache.k[:, :, 4:], rtol=0, atol=1e-12)
        np.testing.assert_allclose(Vs[:, :, 4:8], cache.v[:, :, 4:], rtol=0, atol=1e-12)


def test_bad_arguments_are_named():
    model, prompt = model_of(), np.zeros((1, 3), np.int64)
    with pytest.raises(ValueError, match="max_new_tokens"):
        early_exit_decode(model, prompt, 0, 0.5)
    with pytest.raises(ValueError, match="prompt_ids"):
        early_exit_decode(model, prompt[0], 2, 0.5)
    with pytest.raises(ValueError, match="threshold"):
        early_exit_decode(model, prompt, 2, float("nan"))
