"""`size MODEL --parallel dp=A,tp=B,pp=C`: per-GPU memory and bytes per step on a grid
(teach/sharding.py), from the ZeRO paper's 2 + 2 + 12 bytes per parameter and the ring
formulas the library's collectives count with."""
import pytest

from scratchllm.cli import size
from scratchllm.teach.arch import MODELS
from scratchllm.teach.sharding import Grid, parse_grid, per_gpu
from scratchllm.teach.sizing import parameters


def test_zero_stages_shard_the_states_then_the_gradients_then_the_weights():
    cfg = MODELS["llama-3-8b"]
    psi = parameters(cfg).total // 2  # tp=2
    g = {z: per_gpu(cfg, Grid(dp=4, tp=2), zero=z) for z in range(4)}
    assert (g[0]["weights"], g[0]["gradients"], g[0]["adamw"]) == (2 * psi, 2 * psi, 12 * psi)
    assert g[1]["adamw"] == 3 * psi and g[1]["gradients"] == 2 * psi
    assert g[2]["gradients"] == 2 * psi // 4 and g[2]["weights"] == 2 * psi
    assert g[3]["weights"] == 2 * psi // 4 and abs(g[3]["total"] - 4 * psi) <= 2
    # ZeRO-1 and 2 send what the all-reduce sends; ZeRO-3 gathers the weights once more: 1.5x
    assert g[0]["dp"] == g[1]["dp"] == g[2]["dp"] == 3 * psi  # 2 (4-1)/4 x 2 psi
    assert g[3]["dp"] == g[0]["dp"] * 3 // 2


def test_tensor_and_pipeline_bytes_and_the_bubble():
    cfg = MODELS["llama-3-70b"]
    g = per_gpu(cfg, Grid(dp=8, tp=8, pp=4), micro_batch=1, context=4096)
    act = 4096 * 8192 * 2
    assert g["tp"] == 4 * 20 * 4 * 2 * 7 * act // 8  # m x blocks x f/g x ring
    assert g["pp"] == 4 * 2 * act and g["bubble"] == pytest.approx(3 / 7)
    assert per_gpu(cfg, Grid(dp=2))["tp"] == per_gpu(cfg, Grid(dp=2))["pp"] == 0


def test_the_grid_is_parsed_or_named_wrong():
    assert parse_grid("dp=8,tp=8,pp=4") == Grid(8, 8, 4) and parse_grid("tp=2") == Grid(tp=2)
    for bad in ("dp=0", "cp=2", "dp=x", "dp8"):
        with pytest.raises(ValueError, match="is not AXIS=N"):
            parse_grid(bad)


def test_size_parallel_prints_the_table(capsys):
    assert size.main(["llama-3-70b", "--parallel", "dp=8,tp=8,pp=4", "--zero", "1"]) == 0
    out = capsys.readouterr().out
    assert "on dp=8 x tp=8 x pp=4 = 256 GPUs, ZeRO-1" in out
    assert "sent per step, tp" in out and "pipeline bubble" in out and "42.9%" in out
    assert size.main(["dense", "--parallel", "dp=2,pp=x"]) == 1
    assert "is not AXIS=N" in capsys.readouterr().err
