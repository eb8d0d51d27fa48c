"""YaRN as two released checkpoints configure it: gpt-oss's `truncate: false` against numbers
from transformers' _compute_yarn_parameters, and DeepSeek's mscale^2 in the MLA softmax scale
against transformers' yarn_apply_mscale transcribed."""
import math

import numpy as np
import pytest

from scratchllm.attention import mla_softmax_scale, rope_frequencies

# gpt-oss (GptOssConfig defaults = gpt-oss-20b/120b config.json): head_dim 64, rope_theta 1.5e5
GPT_OSS = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
           "truncate": False, "original_max_position_embeddings": 4096}
# transformers 5.24.0: ROPE_INIT_FUNCTIONS["yarn"](GptOssConfig()) -> inv_freq (float32), 1.3466
HF_INV_FREQ = {0: 1.0, 7: 0.07374456524848938, 8: 0.05081327259540558,
               9: 0.031705696135759354, 12: 0.006794959306716919,
               17: 0.00012931869423482567, 18: 3.830881178146228e-05,
               31: 3.023511396804679e-07}
HF_ATTENTION_FACTOR = 1.3465735902799727


def test_gpt_oss_yarn_equals_transformers_numbers():
    inv_freq, af = rope_frequencies(64, 150000.0, GPT_OSS)
    assert af == pytest.approx(HF_ATTENTION_FACTOR, rel=1e-15)
    idx = list(HF_INV_FREQ)
    np.testing.assert_allclose(inv_freq[idx], list(HF_INV_FREQ.values()), rtol=2e-7)  # f32


def test_untruncated_ramp_starts_at_the_exact_correction_dims():
    """Independent transcription in float64: the ramp runs from 8.09 to 17.40 (not the
    truncated 8 and 18), so pairs 9..17 blend differently from the truncated schedule."""
    dim, base, s = 64, 150000.0, 32.0
    low, high = (dim * math.log(4096 / (n * 2 * math.pi)) / (2 * math.log(base)) for n in (32, 1))
    assert low == pytest.approx(8.0928, abs=1e-4) and high == pytest.approx(17.3980, abs=1e-4)
    theta = base ** (-np.arange(0, dim, 2) / dim)
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    want = theta / s * ramp + theta * (1 - ramp)
    inv_freq, _ = rope_frequencies(dim, base, GPT_OSS)
    np.testing.assert_allclose(inv_freq, want, rtol=1e-13)
    truncated, _ = rope_frequencies(dim, base, {**GPT_OSS, "truncate": True})
    differ = np.flatnonzero(~np.isclose(inv_freq, truncated, rtol=1e-9))
    assert differ.tolist() == list(range(9, 18))


def hf_yarn_apply_mscale(rope_parameters, scaling):
    """huggingface/transformers src/transformers/models/deepseek_v3/modeling_deepseek_v3.py
    yarn_apply_mscale with yarn_get_mscale, transcribed."""
    def yarn_get_mscale(scale=1, mscale=1):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
    if rope_parameters.get("rope_type", "default") != "default":
        mscale_all_dim = rope_parameters.get("mscale_all_dim", 0)
        if mscale_all_dim:
            mscale = yarn_get_mscale(rope_parameters["factor"], mscale_all_dim)
            scaling = scaling * mscale * mscale
    return scaling


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
     "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},  # DeepSeek-V3
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
     "mscale": 0.707, "mscale_all_dim": 0.707},  # DeepSeek-V2-Lite
    {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096},
    {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096,
     "mscale_all_dim": 1.0},
    {"rope_type": "default", "mscale_all_dim": 1.0, "factor": 40.0},
    {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
     "mscale_all_dim": 1.0},
])
def test_mla_softmax_scale_equals_transformers(rope, qk_head_dim=192):
    hf_rope = {("rope_type" if key == "type" else key): value for key, value in rope.items()}
    want = hf_yarn_apply_mscale(hf_rope, qk_head_dim ** -0.5)
    assert mla_softmax_scale(qk_head_dim, rope) == pytest.approx(want, rel=1e-15)
    assert mla_softmax_scale(qk_head_dim) == qk_head_dim ** -0.5


def test_deepseek_v3_mscale_moves_to_the_softmax_scale():
    """With mscale = mscale_all_dim the rope attention factor is 1 and the whole YaRN
    temperature (0.1 ln 40 + 1)^2 = 1.874 multiplies the softmax scale."""
    rope = {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
            "mscale": 1.0, "mscale_all_dim": 1.0}
    _, af = rope_frequencies(64, 10000.0, rope)
    assert af == 1.0
    assert mla_softmax_scale(192, rope) * 192 ** 0.5 == pytest.approx(
        (0.1 * math.log(40) + 1) ** 2, rel=1e-15)
