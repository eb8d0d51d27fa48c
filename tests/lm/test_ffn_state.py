"""A Block whose FFN keeps a decoding state (RWKV-4's channel mix, FFNSpec kind
"channel_mix"): the layer's state is an FFNState of the mixer's and the FFN's; prefill then
decode equals the full forward; the mixer's state alone is refused by name."""
import numpy as np
import pytest

from scratchllm.lm import LM
from scratchllm.lm.block import FFNState
from scratchllm.specs import from_flat


def test_channel_mix_decoding_state():
    cfg = from_flat(name="x", vocab_size=30, d_model=8, n_layers=2, layer_pattern="WW",
                    ffn="channel_mix", d_ff=12, norm="layernorm", embed_norm=True)
    model = LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    ids = np.random.default_rng(1).integers(0, 30, (2, 6))
    full, _ = model.forward(ids)
    state = model.init_state(2, 6)
    assert all(isinstance(s, FFNState) for s in state)
    np.testing.assert_allclose(model.prefill(ids[:, :4], state), full[:, :4], atol=1e-12)
    for t in (4, 5):
        np.testing.assert_allclose(model.decode(ids[:, t], state, t), full[:, t], atol=1e-12)
    with pytest.raises(ValueError, match="keeps a decoding state: give Block.init_state"):
        model.layers[0].decode(np.zeros((2, 8)), state[0].mixer, 0)
