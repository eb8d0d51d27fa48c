"""Training with Muon (core/muon.py): which Params it takes, the checkpoint keeps its
momentum and a resumed run is bit-exact, and the CLI's --optimizer / defaults."""
from argparse import Namespace
from dataclasses import asdict

import numpy as np
import pytest

from grads.cases import lm_tiny
from scratchllm.cli import train
from scratchllm.core.muon import MuonAdamW
from scratchllm.core.optim import AdamW
from scratchllm.lm import preset
from scratchllm.specs.unflat import flat_view
from scratchllm.train import trainer
from scratchllm.train.settings import Settings, first_run, first_run_model


def _settings(**kw):
    return Settings(**{**dict(batch_size=3, seq_len=8, steps=20, warmup=2, threads=1),
                               **kw})


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    run = trainer.Run(lm_tiny("dense"), _settings(optimizer="muon", muon_lr=0.03))
    opt, names = run.opt, {id(p): n for n, p in run.model.named_parameters()}
    assert isinstance(opt, MuonAdamW) and opt.ratio == pytest.approx(0.03 / 5e-3)
    muon = sorted(names[id(p)].split(".", 2)[2] for p in opt.muon.params)
    n_layers = len(run.cfg.layers)
    assert muon == sorted(["ffn.W1", "ffn.W2", "ffn.W3", "mixer.wk", "mixer.wo",
                           "mixer.wq", "mixer.wv"] * n_layers)
    adamw = {names[id(p)] for p in opt.adamw.params}
    assert {"embed.E", "head.W", "norm.g"} <= adamw and len(adamw) + len(muon) == len(names)
    assert opt.muon.momentum == 0.95 and opt.muon.nesterov
    # the same decay a step as AdamW's matrices: muon lr * muon wd = lr * wd
    assert opt.muon.lr * opt.muon.wd == pytest.approx(5e-3 * 0.1, rel=1e-12)
    assert isinstance(trainer.Run(lm_tiny("dense"), _settings()).opt, AdamW)  # the default
    with pytest.raises(ValueError, match=r"Settings.optimizer must be one of \('adamw', "
                                         r"'muon'\), got 'sgd'"):
        trainer.Run(lm_tiny("dense"), _settings(optimizer="sgd"))


def test_a_param_group_rule_wins_over_muon():
    s = _settings(optimizer="muon", param_groups=[["layers.0.ffn.W*", 0.0, 0.0]])
    run = trainer.Run(lm_tiny("dense"), s)
    frozen = [p for n, p in run.model.named_parameters() if n.startswith("layers.0.ffn.W")]
    assert len(frozen) == 3 and not any(p in run.opt.muon.params for p in frozen)
    before = [p.data.copy() for p in frozen]
    ids = np.random.default_rng(0).integers(0, run.cfg.vocab_size, 300)
    run.train_step(ids)
    assert all(np.array_equal(p.data, b) for p, b in zip(frozen, before))


def test_resume_keeps_the_momentum_and_is_bit_exact(tmp_path):
    ids = np.random.default_rng(1).integers(0, lm_tiny("dense").vocab_size, 400)
    s = _settings(optimizer="muon", steps=6)
    straight = trainer.Run(lm_tiny("dense"), s)
    for _ in range(6):
        straight.train_step(ids)
    first = trainer.Run(lm_tiny("dense"), s)
    for _ in range(3):
        first.train_step(ids)
    first.save(tmp_path)
    resumed = trainer.Run(lm_tiny("dense"), s)
    resumed.load(tmp_path)
    assert resumed.opt.muon.t == 3 and resumed.opt.adamw.t == 3
    for a, b in zip(resumed.opt.muon.m, first.opt.muon.m):
        np.testing.assert_array_equal(a, b)
    assert any(m.any() for m in resumed.opt.muon.m)
    for _ in range(3):
        resumed.train_step(ids)
    assert resumed.losses == straight.losses
    for (n, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=n)
    adamw_run = trainer.Run(lm_tiny("dense"), _settings(steps=6))
    with pytest.raises(trainer.checkpoint.CheckpointError,
                       match="optimizer state does not match"):
        adamw_run.load(tmp_path)  # a Muon checkpoint is not AdamW's


def _args(**given):
    names = ("steps", "batch_size", "seq_len", "lr", "seed", "eval_every", "threads", "fp8",
             "pack_documents", "balance_across", "optimizer", "muon_lr")
    return Namespace(**{n: given.get(n) for n in names})


def test_cli_defaults_to_the_first_run_and_resumes_old_checkpoints_as_adamw():
    assert train._settings(_args()) == first_run()
    assert first_run() == Settings(steps=1700, lr=7e-3, final_lr=0.03, weight_decay=0.3,
                                   eval_every=850)
    assert train._settings(_args(optimizer="muon", muon_lr=0.03)) == Settings(
        steps=1700, lr=7e-3, final_lr=0.03, weight_decay=0.3, eval_every=850,
        optimizer="muon", muon_lr=0.03)
    old = asdict(Settings(steps=70))
    del old["optimizer"], old["muon_lr"]  # saved before the field existed
    assert train._settings(_args(), saved=old) == Settings(steps=70)
    muon_run = dict(asdict(Settings(optimizer="muon")), threads=2)
    assert train._settings(_args(), saved=muon_run).optimizer == "muon"  # resumed as saved
    assert train._settings(_args(), ranks=2).optimizer == "adamw"  # mpiexec: AdamW
    with pytest.raises(ValueError, match="--optimizer muon runs in one process"):
        train._settings(_args(optimizer="muon"), ranks=2)


def test_cli_trains_the_first_run_model_without_a_preset_and_the_preset_with_one():
    """No --preset: the dense preset narrowed to d_model 96, d_ff 256 (still Llama-style:
    4 pre-norm layers of RMSNorm, GQA with RoPE on 4 query and 2 KV heads, SwiGLU)."""
    first = train._model(None)
    assert first == first_run_model() == preset("dense", d_model=96, d_ff=256)
    assert first.n_params() == 602_976 and preset("dense").n_params() == 1_049_728
    view = flat_view(first)
    assert (view.n_layers, view.n_heads, view.n_kv_heads, view.positions, view.ffn,
            view.norm, view.block, view.vocab_size) == (4, 4, 2, "rope", "swiglu", "rmsnorm",
                                                        "pre", 1024)
    assert train._model("dense") == preset("dense")
    assert train._model("moe") == preset("moe")


def test_cli_rejects_an_unknown_optimizer(capsys):
    with pytest.raises(SystemExit) as e:
        train.build_parser().parse_args(["--optimizer", "sgd"])
    assert e.value.code == 2
    assert "--optimizer: invalid choice: 'sgd' (choose from" in capsys.readouterr().err


@pytest.mark.parametrize("threads", [1, 2])
def test_the_optimizers_threads_are_the_runs(threads):
    """--threads 1 keeps AdamW's fused update (and Muon's) on one thread too."""
    assert trainer.Run(lm_tiny("dense"), _settings(threads=threads)).opt.threads == threads
    muon = trainer.Run(lm_tiny("dense"), _settings(threads=threads, optimizer="muon")).opt
    assert muon.adamw.threads == threads
