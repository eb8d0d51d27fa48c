"""Multi-token prediction (lm/mtp.py): module 1 is its composition of the shared embedding and
head, the loss is CE + (lambda / D) sum_k L^k, the config round-trips, and a run trains it."""
from dataclasses import replace

import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.core import fused
from scratchllm.lm import LM
from scratchllm.specs import MTPSpec, from_dict, to_dict


def _model(D=2, **kw):
    cfg = replace(lm_tiny("dense", **kw), mtp=MTPSpec(D, 0.5) if D else None)
    return LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)


def _ce(logits, targets):
    return float(fused.CROSS_ENTROPY.forward(logits, targets)[0])


def test_the_loss_is_the_trunks_plus_the_modules_by_hand():
    model = _model(D=2)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, model.cfg.vocab_size, (2, 6))
    targets = np.concatenate([ids[:, 1:], rng.integers(0, model.cfg.vocab_size, (2, 1))], 1)
    total, cache = model.loss(ids, targets)
    logits, c = model.forward(ids)
    h = c.last  # the trunk's x_L, before the final norm
    want = [_ce(logits, targets)]
    for k, mod in enumerate(model.mtp.depths, 1):
        n = 6 - k
        e = model.embed.E.data[ids[:, k:]]
        a = np.concatenate([mod.enorm.forward(e)[0], mod.hnorm.forward(h[:, :n])[0]], -1)
        h = mod.block.forward(a @ mod.proj.W.data)[0]
        z = mod.norm.forward(h)[0] @ model.head.W.data  # the shared head
        want.append(_ce(z, targets[:, k:]))
    assert np.isclose(cache.ce, want[0], rtol=1e-12)
    assert np.allclose(cache.mtp_cache.losses, want[1:], rtol=1e-12)
    assert np.isclose(float(total), want[0] + 0.5 / 2 * sum(want[1:]), rtol=1e-12)


def test_too_short_a_sequence_and_config_round_trip():
    model = _model(D=2)
    with pytest.raises(ValueError, match="T=2"):
        model.loss(np.zeros((1, 2), int), np.zeros((1, 2), int))
    assert from_dict(to_dict(model.cfg)) == model.cfg
    assert "mtp" not in to_dict(lm_tiny("dense"))  # no MTP: the file as before
    assert model.cfg.n_params() == model.n_params()
    assert _model(D=0).mtp is None


def test_a_run_trains_the_modules_and_records_their_losses():
    from scratchllm.train import trainer
    from scratchllm.train.settings import Settings
    s = Settings(batch_size=2, seq_len=8, steps=2, warmup=1, threads=1)
    run = trainer.Run(replace(lm_tiny("dense"), mtp=MTPSpec(2)), s)
    ids = np.random.default_rng(0).integers(0, run.cfg.vocab_size, 300)
    before = run.model.mtp.depths[1].proj.W.data.copy()
    for _ in range(2):
        run.train_step(ids)
    assert len(run.mtp_losses) == 2 and run.mtp_losses[0].shape == (2,)
    assert not np.array_equal(before, run.model.mtp.depths[1].proj.W.data)
