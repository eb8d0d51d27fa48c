"""The post-norm and sandwich-norm blocks: whole-model gradient checks, and decoding through
the states equals the full forward."""
import numpy as np
import pytest

from grads.cases import CASES, lm_tiny
from scratchllm.lm import LM


def test_post_and_sandwich_gradients():
    for report in CASES["lm_post"](np.random.default_rng(5)):
        assert report.ok, f"\n{report}"


@pytest.mark.parametrize("extra", [dict(block="post"), dict(block="output", qk_norm="full"),
                                   dict(block="sandwich", norm_offset=1.0, embed_scale=True)])
def test_decoding_equals_full_forward(extra):
    model = LM(lm_tiny("dense", **extra), rng=np.random.default_rng(0), dtype=np.float64)
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, (2, 6))
    full, _ = model.forward(ids)  # (B, T, V)
    state = model.init_state(2, 6)
    for t in range(6):
        np.testing.assert_allclose(model.decode(ids[:, t], state, t), full[:, t], rtol=1e-11,
                                   atol=1e-12)


def test_post_norm_changes_the_function():
    """block="post" is a different network from pre-norm on the same weights."""
    pre = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    post = LM(lm_tiny("dense", block="post"), rng=np.random.default_rng(0), dtype=np.float64)
    ids = np.arange(6)[None] % pre.cfg.vocab_size
    assert np.abs(pre.forward(ids)[0] - post.forward(ids)[0]).max() > 1e-3
