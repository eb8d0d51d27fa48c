"""Divergence is refused up front or stops the run: AdamW and clip_grad_norm refuse
out-of-domain values, a non-finite loss or gradient norm stops training with the step and the
likely cause and keeps the last good checkpoint, a checkpoint holding NaN is refused, and
detect_anomaly names the first Module that went non-finite."""
import math
import re
from pathlib import Path

import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.cli import train
from scratchllm.core import AdamW, NonFiniteError, Param, clip_grad_norm, detect_anomaly
from scratchllm.lm import LM, preset
from scratchllm.train import checkpoint, trainer
from scratchllm.train.settings import Settings

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "python-docs-slice.txt"
QUICK = ["--data", str(FIXTURE), "--batch-size", "2", "--seq-len", "16", "--no-progress"]
IDS = np.random.default_rng(0).integers(0, 23, 400)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=math.inf), r"AdamW: lr must be a finite number > 0, got inf"),
    (dict(lr=math.nan), r"AdamW: lr must be a finite number > 0, got nan"),
    (dict(lr=-1e-3), r"AdamW: lr must be a finite number > 0"),
    (dict(eps=0.0), r"AdamW: eps must be a finite number > 0"),
    (dict(weight_decay=math.nan), r"AdamW: weight_decay must be a finite number >= 0"),
    (dict(betas=(1.0, 0.9)), r"AdamW: betas must lie in \[0, 1\)"),
    (dict(betas=(0.9,)), r"AdamW: betas must lie in \[0, 1\)"),
])
def test_adamw_refuses_out_of_domain_hyperparameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdamW([Param(np.zeros(3))], **kwargs)


def test_adamw_step_refuses_a_non_finite_scheduled_lr():
    p = Param(np.ones(3))
    opt = AdamW([p])
    opt.lr = math.inf
    with pytest.raises(ValueError, match=r"AdamW.step: lr must be a finite number >= 0"):
        opt.step()
    np.testing.assert_array_equal(p.data, np.ones(3))


def test_clip_grad_norm_refuses_a_nan_norm_and_scales_nothing():
    a, b = Param(np.zeros(2)), Param(np.zeros(2))
    a.grad[:] = [3.0, np.nan]
    b.grad[:] = [4.0, 0.0]
    with pytest.raises(NonFiniteError, match=r"clip_grad_norm: the global gradient norm is nan"):
        clip_grad_norm([a, b], 1.0)
    np.testing.assert_array_equal(b.grad, [4.0, 0.0])
    b.grad[:] = [np.inf, 0.0]
    with pytest.raises(NonFiniteError, match="norm is nan|norm is inf"):
        clip_grad_norm([b], 1.0)
    with pytest.raises(ValueError, match="clip_grad_norm: max_norm must be a finite number > 0"):
        clip_grad_norm([b], math.inf)


def _tiny_run():
    s = Settings(batch_size=2, seq_len=8, steps=6, warmup=1, eval_every=2, threads=1)
    return trainer.Run(lm_tiny("dense"), s)


def test_a_nan_step_stops_fit_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    run = _tiny_run()
    original = trainer.Run.train_step

    def poisoned_at_3(self, ids):
        if self.step == 3:  # the weights go bad after the step-2 checkpoint
            self.model.layers[0].mixer.wq.data[0, 0] = np.nan
        return original(self, ids)

    monkeypatch.setattr(trainer.Run, "train_step", poisoned_at_3)
    eval_set = [(IDS[None, :8], IDS[None, 1:9])]
    with pytest.raises(NonFiniteError) as err:
        trainer.fit(run, IDS, None, out=tmp_path, progress=False, eval_set=eval_set)
    msg = str(err.value)
    assert re.match(r"training stopped at step 4: the training loss is (nan|inf)", msg), msg
    assert "the weights already hold NaN or inf (layers.0.mixer.wq)" in msg
    assert f"The last good checkpoint in {tmp_path} (step 2) is kept." in msg
    arrays, meta = checkpoint.load_state(tmp_path)  # still loads: finite, step 2
    assert meta["step"] == 2 and run.step == 3


def test_an_inf_gradient_with_finite_weights_is_named_as_a_too_high_learning_rate():
    run = _tiny_run()
    backward = run.model.loss_backward

    def overflowing(dloss, cache):  # the gradients overflow at step 2, as after a huge
        backward(dloss, cache)      # update (inside the backward: the data-parallel sum
        if run.step == 1:           # after it squares them for the clip)
            run.model.parameters()[0].grad[0] = np.inf

    run.model.loss_backward = overflowing
    run.train_step(IDS)
    before = [p.data.copy() for p in run.model.parameters()]
    peak = re.escape(f"{Settings().lr:g}")  # the default peak lr
    with pytest.raises(NonFiniteError, match=r"^step 2: clip_grad_norm: the global gradient "
                                             rf"norm is inf .*the learning rate \(peak {peak}, "):
        run.train_step(IDS)
    assert run.step == 1 and all(np.array_equal(a, p.data)
                                 for a, p in zip(before, run.model.parameters()))


def test_detect_anomaly_names_the_first_module_that_went_non_finite():
    model = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    model.layers[1].ffn.W2.data[0, 0] = np.inf
    x, y = IDS[None, :8], IDS[None, 1:9]
    with detect_anomaly(model):
        with pytest.raises(NonFiniteError, match=r"^detect_anomaly: the output of layers\.1\."
                                                 r"ffn \(SwiGLUFFN\.forward\) holds NaN or inf"):
            model.loss(x, y)
    assert "forward" not in vars(model.layers[1].ffn)  # unpatched after the block
    model.layers[1].ffn.W2.data[0, 0] = 0.0
    loss, cache = model.loss(x, y)
    with detect_anomaly(model):
        with pytest.raises(NonFiniteError, match=r"input gradient of (norm|head)"):
            model.loss_backward(np.nan, cache)


def test_train_refuses_a_non_finite_or_huge_lr_and_a_negative_seed(capsys):
    for flag, value, match in (("--lr", "inf", r"must be a finite number in \(0, 1\], got inf"),
                               ("--lr", "1e6", r"must be a finite number in \(0, 1\]"),
                               ("--lr", "nan", r"must be a finite number"),
                               ("--seed", "-1", r"must be >= 0, got -1"),
                               ("--steps", "0", r"must be >= 1, got 0")):
        with pytest.raises(SystemExit) as exit_:
            train.main(QUICK + [flag, value])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert re.match(rf"scratchllm train: argument {flag}: {match}", err), err


def test_a_checkpoint_holding_nan_weights_is_refused(tmp_path):
    run = _tiny_run()
    run.train_step(IDS)
    run.save(tmp_path)
    arrays, meta = checkpoint.load_state(tmp_path)
    arrays["model.norm.g"][0] = np.nan
    checkpoint.save_state(tmp_path, arrays, meta)
    with pytest.raises(checkpoint.CheckpointError, match=r"entry model\.norm\.g holds NaN"):
        _tiny_run().load(tmp_path)


@pytest.mark.parametrize("field, value", [("norm_eps", -1e-5), ("norm_eps", math.nan),
                                          ("rope_base", math.inf), ("capacity_factor", 0.0),
                                          ("bias_gamma", -1.0), ("window", 4.5),
                                          ("window", "4"), ("rope_scaling", {"factor": 2})])
def test_model_config_validates_every_real_valued_field(field, value):
    with pytest.raises((ValueError, TypeError), match=rf"^ModelConfig: .*{field}"):
        preset("dense", **{field: value})
