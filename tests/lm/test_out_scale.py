"""LayerSpec.out_scale (RWKV's inference rescale, flat rescale_every N: the hidden state halved
after every N-th block): the flat name picks the layers and reads back, a block's output is
scaled in training, prefill and decoding alike, and families other than rwkv refuse to save
it. Its gradients: grads case lm_hub's rwkv (rescale_every 1); against transformers:
tests/hub/test_pretrained.py's rwkv_rescale (slow tier)."""
import dataclasses

import numpy as np
import pytest

from scratchllm.hub import flat_of, save_pretrained
from scratchllm.lm import LM
from scratchllm.specs import from_flat, preset

TINY = dict(vocab_size=31, d_model=16, n_heads=4, n_kv_heads=2, d_ff=24)


def test_rescale_every_halves_every_nth_block_and_reads_back():
    cfg = preset("rwkv", **dict(TINY, n_layers=5, layer_pattern="W" * 5, rescale_every=2))
    assert [layer.out_scale for layer in cfg.layers] == [1.0, 0.5, 1.0, 0.5, 1.0]
    assert flat_of(cfg).rescale_every == 2
    with pytest.raises(ValueError, match="rescale_every must be an integer >= 0"):
        from_flat(rescale_every=-1)


@pytest.mark.parametrize("name", ["dense", "rwkv"])
def test_a_halved_block_is_the_block_times_one_half_in_every_path(name):
    base = dict(TINY, n_layers=2) if name == "dense" else dict(TINY, n_layers=2,
                                                             layer_pattern="WW")
    plain = LM(preset(name, **base), rng=np.random.default_rng(0), dtype=np.float64)
    halved = LM(preset(name, **base, rescale_every=1), rng=np.random.default_rng(0),
                dtype=np.float64)
    ids = np.random.default_rng(1).integers(0, 31, (2, 5))
    x = plain._embed_forward(ids)[0]
    for layer in plain.layers:
        x = layer.forward(x)[0] * 0.5  # (B, T, D)
    logits, _ = halved.forward(ids)
    np.testing.assert_allclose(logits, plain.unembed(x), rtol=0, atol=1e-12)
    state = halved.init_state(2, 5)
    steps = [halved.prefill(ids[:, :3], state)] + [
        halved.decode(ids[:, t], state, t)[:, None] for t in (3, 4)]
    np.testing.assert_allclose(np.concatenate(steps, 1), logits, rtol=0, atol=1e-12)


def test_a_family_without_the_rescale_refuses_to_save_it(tmp_path):
    cfg = preset("dense", **dict(TINY, n_layers=2), rescale_every=1)
    model = LM(dataclasses.replace(cfg, name="llama"), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="rescale_every=0"):
        save_pretrained(model, tmp_path / "out")
