"""The roofline of serving (scratchllm/teach/serving.py) against numbers counted by hand here
from the published configs (Llama 3 paper, arXiv 2407.21783, Table 3; DeepSeek-V3
inference/configs/config_671B.json) and the vendors' datasheets, the expected distinct experts
against a seeded simulation, and `size --serve --json` against its pinned keys."""
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from scratchllm.cli import size as size_cli
from scratchllm.cli.hardware import measure_experts
from scratchllm.specs import AttentionSpec, LayerSpec, Mask, ModelConfig
from scratchllm.specs import preset as get_preset
from scratchllm.teach import serving, sizing
from scratchllm.teach.arch import get

ROOT = Path(__file__).resolve().parents[2]
T = 4096
H200_BW, H200_BF16 = 4.8e12, 989e12  # NVIDIA H200 datasheet: 4.8 TB/s, 1,979 TFLOPS sparse


def _llama_3_70b(b):
    """(weight bytes, KV bytes, FLOPs) of one bf16 decode step, counted from the config."""
    D, L, H, Hkv, Dh, F, V = 8192, 80, 64, 8, 128, 28672, 128256
    layer = D * H * Dh + 2 * D * Hkv * Dh + H * Dh * D + 3 * D * F + 2 * D
    read = L * layer + V * D + D  # untied head and final norm; no embedding table
    kv = b * L * 2 * Hkv * Dh * T * 2
    flops = b * (2 * read + L * 2 * T * H * (Dh + Dh))  # QKᵀ and PV
    return read * 2, kv, flops


def _deepseek_v3(b):
    V, D, H, Dq, Dc, dn, dr, dv = 129280, 7168, 128, 1536, 512, 128, 64, 128
    E, K, Fe, F, L, n_dense = 256, 8, 2048, 18432, 61, 3
    mla = (D * Dq + Dq + Dq * H * (dn + dr) + D * (Dc + dr) + Dc + Dc * H * (dn + dv)
           + H * dv * D)
    always = (L * (mla + 2 * D) + n_dense * 3 * D * F
              + (L - n_dense) * (3 * D * Fe + D * E + E) + V * D + D)  # shared, router, bias
    distinct = E * (1 - (1 - K / E) ** b)
    read = always + (L - n_dense) * distinct * 3 * D * Fe
    active = always + (L - n_dense) * K * 3 * D * Fe
    kv = b * L * (Dc + dr) * T * 2
    flops = b * (2 * active + L * 2 * T * H * (2 * Dc + dr))  # absorbed: Dc + dr, then Dc
    return read * 2, kv, flops


@pytest.mark.parametrize("name, count", [("llama-3-70b", _llama_3_70b),
                                         ("deepseek-v3", _deepseek_v3)])
@pytest.mark.parametrize("b", [1, 64])
def test_decode_step_against_hand_counts(name, count, b):
    weight_bytes, kv_bytes, flops = count(b)
    s = serving.decode_step(get(name), serving.hardware("h200"), b, T)
    assert s.weight_bytes == pytest.approx(weight_bytes, rel=1e-12)
    assert (s.kv_bytes, s.flops) == (kv_bytes, pytest.approx(flops, rel=1e-12))
    assert s.intensity == pytest.approx(flops / (weight_bytes + kv_bytes), rel=1e-12)
    assert s.seconds == pytest.approx(max((weight_bytes + kv_bytes) / H200_BW,
                                          flops / H200_BF16), rel=1e-12)
    assert s.bound == "memory"  # intensity < the ridge 989e12 / 4.8e12 = 206 FLOP/B
    assert not s.fits           # bf16 weights alone exceed 141 GB


def test_published_round_numbers():
    llama = serving.decode_step(get("llama-3-70b"), serving.hardware("h200"), 1, T)
    assert llama.weight_bytes == 139_006_066_688 and llama.kv_bytes == 320 * 1024 * T
    assert round(llama.intensity, 3) == 1.067  # ~1 FLOP per byte: 2 FLOPs per 2-byte weight
    v3 = serving.decode_step(get("deepseek-v3"), serving.hardware("h200"), 64, T)
    assert round(serving.expected_experts(256, 8, 64), 2) == 222.44
    assert round(v3.intensity, 2) == 7.70      # 64 tokens read ~222 of 256 experts


def test_expected_distinct_experts_against_a_simulation():
    rng = np.random.default_rng(0)
    E, K, trials = 64, 6, 400
    for b in (1, 4, 16, 64):
        picks = np.argsort(rng.random((trials, b, E)), axis=-1)[..., :K]  # K distinct each
        distinct = np.array([len(np.unique(p)) for p in picks])
        se = distinct.std() / np.sqrt(trials) + 1e-9
        assert abs(distinct.mean() - serving.expected_experts(E, K, b)) < 4 * se + 1e-6, b
    assert abs(distinct.mean() - 64 * K) > 100  # the no-overlap count b·K is far off


def test_kv_bytes_layer_by_layer_with_windows_in_some_layers():
    full = AttentionSpec(n_heads=8, n_kv_heads=2, head_dim=16)
    local = replace(full, mask=Mask(window=100, n_sink=4))
    cfg = ModelConfig("mixed", 1000, 128, (LayerSpec(local),) * 3 + (LayerSpec(full),))
    per_token = 2 * 2 * 16
    assert serving.kv_cache_bytes(cfg, 1000, 2, "bf16") == 2 * 2 * per_token * (3 * 104 + 1000)
    assert serving.attention_flops(cfg, 1000) == 2 * (3 * 104 + 1000) * 8 * 32
    mha = serving.decode_step(get("gpt-3-175b"), serving.hardware("a100"), 1, T)
    assert mha.kv_bytes == 96 * 2 * 96 * 128 * T * 2                  # MHA: Hkv = H = 96
    mqa = replace(full, n_kv_heads=1)
    cfg_mqa = ModelConfig("mqa", 1000, 128, (LayerSpec(mqa),) * 2)
    assert serving.kv_cache_bytes(cfg_mqa, 50, 1, "fp32") == 2 * 2 * 16 * 50 * 4  # one KV head
    window = serving.decode_step(get("mistral-7b-v0.1"), serving.hardware("h100"), 2, 2 * T)
    assert window.kv_bytes == 2 * 32 * 2 * 8 * 128 * T * 2             # W = 4096 kept of 8192
    for name in ("llama-3-8b", "mistral-7b-v0.1", "deepseek-v3", "mamba-130m", "gemma-3-4b"):
        assert serving.kv_cache_bytes(get(name), 9000, 3) == \
            sizing.kv_cache(get(name), 9000, 3).bytes


def test_prefill_is_compute_bound_and_counted_causally():
    s = serving.prefill(get("llama-3-70b"), serving.hardware("h200"), 1, T)
    weight_bytes, kv_bytes, _ = _llama_3_70b(1)
    n = weight_bytes // 2
    flops = 2 * n * T + 80 * 2 * 64 * 256 * T * (T + 1) // 2
    assert (s.weight_bytes, s.kv_bytes, s.flops) == (weight_bytes, kv_bytes, flops)
    assert s.bound == "compute" and s.intensity > 989e12 / 4.8e12


def test_knee_and_max_batch():
    cfg, h100 = get("llama-3-8b"), serving.hardware("h100")
    k = serving.knee(cfg, h100, 128)
    assert serving.decode_step(cfg, h100, k - 1, 128).bound == "memory"
    assert serving.decode_step(cfg, h100, k, 128).bound == "compute"
    # at 4096 tokens a sequence's FLOPs per KV byte stay below the ridge: never compute-bound
    per_seq = serving.decode_step(cfg, h100, 1, T)
    assert per_seq.flops / per_seq.kv_bytes < 989e12 / 3.35e12
    assert serving.knee(cfg, h100, T) is None
    top = serving.max_batch(cfg, h100, T)
    weights = sizing.parameters(cfg).total * 2
    assert top == (80 * 10 ** 9 - weights) // (128 * 1024 * T)
    assert serving.fits(cfg, h100, top, T) and not serving.fits(cfg, h100, top + 1, T)
    sweep = serving.batch_sweep(cfg, h100, T)
    assert [s.batch for s in sweep][-2:] == [64, top] and all(s.fits for s in sweep)
    assert serving.max_batch(get("llama-3-70b"), h100, T) == 0


def test_peak_falls_back_to_bf16_without_units_for_the_dtype():
    assert serving.peak_flops(serving.hardware("a100"), "fp8") == 312e12
    assert serving.peak_flops(serving.hardware("h100"), "fp8") == 1979e12
    assert serving.peak_flops(serving.hardware("h100"), "float32") == 67e12


# ---------------------------------------------------------------- the command
KEYS = {"batch": int, "context": int, "weight_bytes": int, "kv_bytes": int, "flops": int,
        "intensity": float, "seconds": float, "bound": str, "fits": bool}


def test_serve_json_keys_and_types(capsys):
    argv = ["deepseek-v3", "--serve", "--hw", "h200", "--batch", "1,8,64", "--context", "4096",
            "--json"]
    assert size_cli.main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["batch"] for r in rows] == [1, 8, 64]
    for r in rows:
        assert set(r) == set(KEYS)
        assert all(type(r[k]) is t for k, t in KEYS.items()), r
        assert r["bound"] in ("memory", "compute") and r["context"] == 4096
    assert rows[0]["kv_bytes"] == _deepseek_v3(1)[1] and rows[0]["fits"] is False
    assert size_cli.main(["llama-3-8b", "--serve", "--hw", "h100", "--batch", "1,2000",
                          "--json", "--dtype", "fp8"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["fits"] for r in rows] == [True, False]  # listed whether or not it fits
    assert rows[0]["weight_bytes"] * 2 == _bf16_llama_8b_weight_bytes()


def _bf16_llama_8b_weight_bytes():
    return serving.decode_step(get("llama-3-8b"), serving.hardware("h100"), 1, T).weight_bytes


def test_serve_table_and_plot(tmp_path, capsys):
    png = tmp_path / "knee.png"
    assert size_cli.main(["llama-3-8b", "--serve", "--hw", "h100", "--context", "128",
                          "--batch", "1,64,512", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "compute-bound from batch 438" in out and png.stat().st_size > 0
    assert [line.split()[-2] for line in out.splitlines() if line.strip()[:1].isdigit()
            and "GiB" in line] == ["memory", "memory", "compute"]


def test_this_machine_measured_beside_the_prediction(capsys):
    assert size_cli.main(["dense", "--serve", "--hw", "this", "--measure", "--batch", "1,2",
                          "--context", "16", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit()
            and "MiB" in line]
    assert [r[0] for r in rows] == ["1", "2"] and all(float(r[-1].replace(",", "")) > 0
                                                      for r in rows)
    assert "measured tokens/s" in out


def test_distinct_experts_measured_from_a_router():
    got = dict(measure_experts(get_preset("moe"), [1, 8, 64]))  # E 8, K 2
    assert got[1] == 2 and got[64] == 8 and 2 < got[8] <= 8
    assert abs(got[8] - serving.expected_experts(8, 2, 8)) < 1.5  # 7.2 expected
    assert measure_experts(get_preset("dense"), [4]) == []


@pytest.mark.parametrize("argv", [["llama-3-8b", "--json"], ["llama-3-8b", "--hw", "h100"],
                                  ["dense", "--serve", "--hw", "h100", "--measure"],
                                  ["dense", "--serve", "--hw", "this", "--measure", "--json"],
                                  ["llama-3-8b", "--batch", "1,8"], ["llama-3-8b", "--serve",
                                  "--hw", "tpu"], ["llama-3-8b", "--serve", "--batch", "1,x"],
                                  ["--serve"]])
def test_serve_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        size_cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and err[-1].startswith("scratchllm size: ")


def test_serve_loads_no_numpy_unless_measuring_this_machine():
    code = ("import sys; from scratchllm.cli import size; "
            "size.main(['llama-3-8b', '--serve', '--hw', 'h200', '--json']); "
            "assert 'numpy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)


@pytest.mark.parametrize("T, want", [(1024, 3642), (32768, 1776)])
def test_deepseek_v3_knee_by_hand(T, want):
    """At the knee every expert is read ((1 − 8/256)^3642 ≈ e^-116), so a step moves W + b·K
    bytes for b·F FLOPs: knee = ceil(R·W / (F − R·K)) with the ridge R = 989e12 / 4.8e12.
    It falls with the context because absorbed MLA's attention, 2·128·(2·512 + 64) FLOPs per
    2·576 bytes of cache (242 FLOP/B), is above the ridge by itself."""
    V, D, E, K, Fe, L, n_dense = 129280, 7168, 256, 8, 2048, 61, 3
    weight_bytes = _deepseek_v3(1)[0] + (L - n_dense) * (E - K) * 3 * D * Fe * 2  # all experts
    active = 37_552_297_472 - V * D                      # the embedding lookup multiplies nothing
    F = 2 * active + L * 2 * T * 128 * (2 * 512 + 64)
    kv = L * 576 * 2 * T
    R = 989e12 / 4.8e12
    assert math.ceil(R * weight_bytes / (F - R * kv)) == want
    v3, h200 = get("deepseek-v3"), serving.hardware("h200")
    assert serving.knee(v3, h200, T) == want
    assert serving.sequence_intensity(v3, T) == pytest.approx(F / kv, rel=1e-12)
    assert 128 * 1088 / 576 > R                          # the attention alone: compute-bound
    assert not serving.decode_step(v3, h200, want, T).fits   # one H200 holds no such batch
