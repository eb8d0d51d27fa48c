"""MoE fine-tuning: AdamW groups with their own learning rate and weight decay, the router
freeze, and the routing statistics a step reports; `finetune --freeze-router` on the mixtral
fixture."""
from pathlib import Path

import numpy as np
import pytest

from scratchllm import cli
from scratchllm.core.nn import Param
from scratchllm.core.optim import AdamW
from scratchllm.hub import load_pretrained, state_dict
from scratchllm.specs import preset
from scratchllm.train import Run, Settings, make_optimizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = dict(vocab_size=29, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=8,
            n_experts=4)


def _param(rng):
    p = Param(rng.standard_normal(5))
    p.grad = rng.standard_normal(5)
    return p


def test_a_groups_lr_scale_is_a_plain_adamw_at_that_lr():
    rng = np.random.default_rng(0)
    a, b, c = _param(rng), _param(rng), _param(rng)
    b2, c2 = Param(b.data.copy()), Param(c.data.copy())
    b2.grad, c2.grad = b.grad.copy(), c.grad.copy()
    frozen = a.data.copy()
    opt = AdamW([{"params": [a], "lr_scale": 0.0, "weight_decay": 0.1},
                 {"params": [b], "lr_scale": 0.25, "weight_decay": 0.3},
                 {"params": [c], "weight_decay": 0.0}], lr=0.04)
    plain_b = AdamW([{"params": [b2], "weight_decay": 0.3}], lr=0.01)
    plain_c = AdamW([c2], lr=0.04, weight_decay=0.0)
    for _ in range(3):
        opt.step(), plain_b.step(), plain_c.step()
    assert np.array_equal(a.data, frozen)  # scale 0: no step and no decay
    np.testing.assert_allclose(b.data, b2.data, rtol=0, atol=1e-15)
    np.testing.assert_allclose(c.data, c2.data, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match="lr_scale"):
        AdamW([{"params": [a], "lr_scale": -1.0}])


def test_a_frozen_router_stays_and_the_step_reports_routing():
    rules = [["*router*", 0.0, 0.0], ["*.ffn.w[123]", 0.5, 0.0]]
    run = Run(preset("moe", **TINY), Settings(steps=3, batch_size=2, seq_len=8, threads=1,
                                              warmup=1, param_groups=rules))
    routers = {n: p.data.copy() for n, p in run.model.named_parameters() if "router" in n}
    experts = {n: p.data.copy() for n, p in run.model.named_parameters() if ".ffn.w1" in n}
    ids = np.random.default_rng(0).integers(0, 29, 200)
    for _ in range(3):
        _, stats = run.train_step(ids)
    params = dict(run.model.named_parameters())
    assert len(routers) == 2 and all(np.array_equal(params[n].data, a)
                                     for n, a in routers.items())
    assert all(not np.array_equal(params[n].data, a) for n, a in experts.items())
    assert [i for i, _ in stats] == [0, 1] and run.last_stats is stats
    for _, share in stats:
        assert share.shape == (4,) and abs(share.sum() - 1) < 1e-6
    run.dp.close()
    with pytest.raises(ValueError, match="no parameter name matches \\['\\*gate_proj\\*'\\]"):
        make_optimizer(run.model, Settings(param_groups=[["*gate_proj*", 1.0, 0.0]]))


@pytest.mark.slow  # a whole finetune run (the Run-level test above is the fast tier's)
def test_finetune_freeze_router_keeps_mixtrals_routers(tmp_path, capsys):
    out = tmp_path / "ft"
    assert cli.main(["finetune", "--hf", str(FIXTURES / "hf" / "mixtral"), "--data",
                     str(FIXTURES / "python-docs-slice.txt"), "--out", str(out), "--steps", "2",
                     "--batch-size", "2", "--seq-len", "16", "--eval-every", "1", "--lr", "1e-3",
                     "--no-progress", "--freeze-router",
                     "--param-group", "*.ffn.w[123]", "0.5", "0.0"]) == 0
    printed = capsys.readouterr()
    assert "expert usage L0:" in printed.err and "routing in the last step: L0:" in printed.out
    before, after = (state_dict(load_pretrained(d)) for d in (FIXTURES / "hf" / "mixtral", out))
    gates = [n for n in before if n.endswith("block_sparse_moe.gate.weight")]
    assert gates and all(np.array_equal(before[n], after[n]) for n in gates)
    assert not np.array_equal(before["model.layers.0.block_sparse_moe.experts.0.w1.weight"],
                              after["model.layers.0.block_sparse_moe.experts.0.w1.weight"])
    assert cli.main(["finetune", "--hf", str(FIXTURES / "hf" / "llama"), "--data",
                     str(FIXTURES / "python-docs-slice.txt"), "--out", str(tmp_path / "x"),
                     "--freeze-router"]) == 1
    assert "has no MoE router" in capsys.readouterr().err
