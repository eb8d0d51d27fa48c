"""T5's relative position bias: the buckets equal transformers' (offsets -700..700 for several
bucket geometries: tests/fixtures/hf/t5_buckets, tools/make_hf_fixtures_encoders.py), a
decoding query at offset t gets row t of the full table, and the table's gradient (the
grads case relative_bias, also through unscaled attention)."""
from pathlib import Path

import numpy as np
import pytest

from grads.cases import CASES
from scratchllm.attention import relative_bias_forward, relative_position_buckets
from scratchllm.specs import RelativeBiasSpec

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "t5_buckets" / "expected.npz"


def test_buckets_equal_transformers():
    ref = dict(np.load(FIXTURE))
    assert len(ref) == 5
    for key, want in ref.items():
        nb, md, bi = (int(v) for v in key.split("_"))
        spec = RelativeBiasSpec(nb, md, bool(bi))
        got = relative_position_buckets(1, 1401, spec=spec, offset=700)  # offsets -700..700
        assert np.array_equal(got, want), key


def test_a_decoding_query_gets_its_row_of_the_full_bias():
    spec = RelativeBiasSpec(8, 12, bidirectional=False)
    table = np.random.default_rng(0).standard_normal((8, 3))
    full, _ = relative_bias_forward(table, spec=spec, Tq=9, Tk=9)  # (1, 3, 9, 9)
    for t in range(9):
        row, _ = relative_bias_forward(table, spec=spec, Tq=1, Tk=t + 1, offset=t)
        assert np.array_equal(row[0, :, 0], full[0, :, t, :t + 1])


def test_spec_refuses_a_max_distance_inside_the_exact_buckets():
    with pytest.raises(ValueError, match="max_distance"):
        RelativeBiasSpec(32, 8)


def test_table_gradient():
    for report in CASES["relative_bias"](np.random.default_rng(0)):
        assert report.ok, f"\n{report}"


def _decoder_layer(seed, T):
    """A T5 decoder self-attention layer (causal, unscaled, a random bias table) and x."""
    from scratchllm.attention import Attention
    from scratchllm.specs import AttentionSpec, Mask
    rng = np.random.default_rng(seed)
    spec = AttentionSpec(2, 2, 3, scale=1.0, rope=None, mask=Mask(),
                         position_bias=RelativeBiasSpec(8, 12, bidirectional=False))
    layer = Attention(5, spec, rng=rng, dtype=np.float64)
    layer.rel_table.data[...] = rng.standard_normal((8, 2))
    return layer, rng.standard_normal((2, T, 5))


def test_attention_layer_decodes_as_its_causal_forward():
    """An Attention layer with T5's bias (decoder self-attention: causal, unscaled): decoding
    token by token from a KVState gives the rows of the full forward."""
    layer, x = _decoder_layer(1, 9)
    full, _ = layer.forward(x)  # (2, 9, 5)
    state = layer.init_state(2, 9)
    for t in range(9):
        assert np.allclose(layer.decode(x[:, t], state, t), full[:, t], rtol=0, atol=1e-12)


def test_spec_refuses_relative_bias_beside_another_position_scheme():
    from scratchllm.specs import AttentionSpec
    with pytest.raises(ValueError, match="rope and a position bias are two position schemes"):
        AttentionSpec(2, 2, position_bias=RelativeBiasSpec())  # RoPE is on by default


def test_encoder_attention_layer_equals_transformers_t5_attention():
    """One T5Attention (relative bias, bidirectional, unscaled, d_kv = 3 with d_model = 8) in
    float64 (tests/fixtures/hf/t5_attention): the output within 1e-12 and the gradient of
    every weight, the bias table included, within 1e-10."""
    from scratchllm.attention import AttentionWeights, gqa_backward, gqa_forward
    from scratchllm.specs import AttentionSpec, Mask
    ref = dict(np.load(FIXTURE.parents[1] / "t5_attention" / "expected.npz"))
    spec = AttentionSpec(4, 4, 3, scale=1.0, rope=None, mask=Mask(causal=False),
                         position_bias=RelativeBiasSpec(8, 12))
    w = AttentionWeights(*(ref[f"{n}.weight"].T for n in "qkvo"),
                         rel_table=ref["relative_attention_bias.weight"])
    y, cache = gqa_forward(ref["x"], w, spec=spec)
    assert np.abs(y - ref["y"]).max() < 1e-12 * np.abs(ref["y"]).max()
    G = np.random.default_rng(int(ref["G_seed"])).standard_normal(y.shape)
    dw = gqa_backward(G, cache)["w"]
    for mine, theirs in [(dw.wq.T, "q"), (dw.wk.T, "k"), (dw.wv.T, "v"), (dw.wo.T, "o"),
                         (dw.rel_table, "relative_attention_bias")]:
        want = ref[f"grad/{theirs}.weight"]
        assert np.abs(mine - want).max() < 1e-10 * np.abs(want).max(), theirs


def test_rows_at_their_own_positions_decode_as_their_own_sequences():
    """Per-row positions (a KVState whose rows restart): row 1 restarts at step 3 and must
    decode as a fresh sequence, row 0 continues; each equals its own full forward."""
    layer, x = _decoder_layer(2, 7)
    full0, _ = layer.forward(x[:1])  # row 0: all 7 tokens
    full1, _ = layer.forward(x[1:, 3:])  # row 1: tokens 3.. as a sequence of its own
    state = layer.init_state(2, 12)
    for t in range(7):
        pos = np.array([t, t if t < 3 else t - 3])
        y = layer.decode(x[:, t], state, pos)  # (2, 5)
        assert np.allclose(y[0], full0[0, t], rtol=0, atol=1e-12)
        if t >= 3:
            assert np.allclose(y[1], full1[0, t - 3], rtol=0, atol=1e-12)
