"""The grads case of every loaded tiny checkpoint (lm_hub, one test per family), and the one
gradient it leaves out: GPT-2's key bias, whose gradient is zero without RoPE."""

import numpy as np
import pytest

from grads.cases import HF_FIXTURES
from grads.cases.hub import lm_hub_family
from scratchllm.hub import flat_of, load_pretrained
from hub_fixtures import HF


@pytest.mark.parametrize("family", HF_FIXTURES)
def test_every_loaded_family_passes_its_gradient_check(family):
    report = lm_hub_family(family)
    assert report.label == family and report.rows
    assert report.ok, f"\n{report}"


def test_gpt2_key_bias_gradient_is_zero():
    """softmax(s + c) = softmax(s) for a per-row constant c = q . bk."""
    model = load_pretrained(HF / "gpt2", dtype=np.float64)
    ids = np.random.default_rng(0).integers(0, flat_of(model.cfg).vocab_size, (2, 7))
    loss, cache = model.loss(ids, np.roll(ids, -1, axis=1))
    model.loss_backward(1.0, cache)
    bk = model.layers[0].mixer.bk.grad
    bq = model.layers[0].mixer.bq.grad
    assert np.abs(bk).max() < 1e-12 * np.abs(bq).max()
