"""T5's sub-layers, each against transformers' own module in float64 (tests/fixtures/hf/
t5_parts, tools/make_hf_fixtures_encoders.py): the DenseReluDense as relu_mlp, the gated-gelu
DenseGatedActDense as geglu (tanh), T5LayerNorm as rmsnorm (no mean, no bias), and a
T5Attention used as cross-attention as cross_attention (unscaled, d_kv apart from D / H).
With the relative bias (tests/attention/test_relative_bias.py) these are the pieces of a T5
block."""
from pathlib import Path

import numpy as np

from scratchllm.attention import AttentionWeights, cross_attention_forward
from scratchllm.core import geglu_forward, relu_mlp_forward, rmsnorm_forward
from scratchllm.specs import AttentionSpec, Mask

REF = dict(np.load(Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "t5_parts"
                   / "expected.npz"))


def close(y, want):
    return np.abs(y - want).max() < 1e-12 * np.abs(want).max()


def test_relu_mlp_is_dense_relu_dense():
    y, _ = relu_mlp_forward(REF["x"], REF["relu/wi.weight"].T, REF["relu/wo.weight"].T)
    assert close(y, REF["relu/y"])


def test_geglu_tanh_is_the_gated_gelu_variant():
    y, _ = geglu_forward(REF["x"], REF["gated/wi_0.weight"].T, REF["gated/wi_1.weight"].T,
                         REF["gated/wo.weight"].T, approximate="tanh")
    assert close(y, REF["gated/y"])


def test_rmsnorm_is_t5_layer_norm():
    y, _ = rmsnorm_forward(REF["x"], REF["norm/weight"], eps=1e-6)
    assert close(y, REF["norm/y"])


def test_cross_attention_is_t5_cross_attention():
    spec = AttentionSpec(4, 4, 3, scale=1.0, rope=None, mask=Mask(causal=False))
    w = AttentionWeights(*(REF[f"cross/{n}.weight"].T for n in "qkvo"))
    y, _ = cross_attention_forward(REF["x"], REF["ctx"], w, spec=spec)
    assert close(y, REF["cross/y"])
