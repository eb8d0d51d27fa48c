"""The chapters' numbers `size` prints beside the exact counts: F ≈ 8/3·D (Llama 3: 3.5·D),
a 1B model's ~260M embedding parameters, DeepSeek-V2's 93.3% KV cut against DeepSeek 67B."""
import pytest

from scratchllm.cli import size as size_cli
from scratchllm.teach import rules
from scratchllm.teach.arch import get
from scratchllm.teach.sizing import parameters


def test_ffn_width_rules():
    assert rules.ffn_ratio(get("llama-3-8b")) == 3.5  # 14,336 / 4,096
    assert rules.SWIGLU_RULE * 3 == pytest.approx(8)  # 3·D·F = 8·D² at F = 8/3·D
    assert rules.ffn_ratio(get("mixtral-8x7b")) is None  # no dense FFN


def test_a_1b_model_spends_260m_on_its_128k_embedding():
    e = rules.embedding_share(get("llama-3.2-1b"))
    assert e.params == 128256 * 2048 == 262_668_288
    assert e.total == parameters(get("llama-3.2-1b")).total == 1_235_814_400  # HF's count
    untied = rules.embedding_share(get("llama-3-8b"))
    assert untied.params == 2 * 128256 * 4096


def test_deepseek_v2_cuts_the_kv_cache_of_deepseek_67b_by_93_3_percent():
    c = rules.kv_cut(get("deepseek-v2"), get("deepseek-67b"))
    assert (c.elements, c.reference) == (60 * 576, 95 * 2 * 8 * 128)
    assert round(100 * c.cut, 1) == 82.2 and round(100 * c.cut_quantised, 1) == 93.3
    assert parameters(get("deepseek-67b")).total == 67_425_001_472  # "67B"


def test_size_prints_them(capsys):
    assert size_cli.main(["deepseek-v2"]) == 0
    out = capsys.readouterr().out
    assert "KV cut vs DeepSeek 67B (dense)" in out and "93.3% at 6 bits" in out
    assert size_cli.main(["llama-3.2-1b"]) == 0
    assert "262,668,288  262.67M = 21.3% of 1.24B" in capsys.readouterr().out
