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


def test_gemma_3_kv_overhead_at_32k_from_60_to_under_15_percent(capsys):
    g = get("gemma-3-4b")
    assert parameters(g).total == 3_880_263_168          # transformers' Gemma3ForCausalLM count
    assert parameters(get("gemma-3-1b")).total == 999_885_952
    per_token_layer = 2 * 4 * 256 * 2                    # K and V, 4 KV heads of 256, bf16
    global_layers = [i for i in range(34) if (i + 1) % 6 == 0]  # 5, 11, 17, 23, 29
    kv = (len(global_layers) * 32768 + (34 - len(global_layers)) * 1024) * per_token_layer
    o = rules.kv_overhead(g, 32768)
    assert (o.kv, o.global_kv, o.weights) == (kv, 34 * 32768 * per_token_layer,
                                              2 * 3_880_263_168)
    assert round(100 * o.global_ratio, 1) == 58.8 and round(100 * o.ratio, 1) == 10.2
    assert o.global_ratio > 0.55 and o.ratio < 0.15      # the chapter's ~60% and under 15%
    assert size_cli.main(["gemma-3-4b", "--context", "32768"]) == 0
    out = capsys.readouterr().out
    assert "10.2%  58.8% with every layer global" in out and "(5 of 34 layers global)" in out
    assert f"{kv:,}" in out and "32,768 / 1,024" in out


def test_int4_weights_half_a_byte_plus_a_scale_per_group(capsys):
    from scratchllm.teach import sizing
    assert sizing.dtype_bytes("int4") == 0.5 + 2 / 128 == 0.515625
    assert sizing.dtype_bytes("int4-g32") == 0.5625        # llama.cpp Q4_0: 4.5 bits
    n = parameters(get("llama-3-70b")).total
    q = rules.int4_weights(get("llama-3-70b"))
    assert q.rule == n // 2 == 35_276_853_248                # the chapter's ~35 GB
    assert q.exact == n // 2 + n // 128 * 2                  # n is a multiple of 128
    s = sizing.serving_memory(get("llama-3-70b"), 4096, 1, "int4", kv_dtype="bf16")
    assert s.weights == q.exact
    assert sizing.kv_cache(get("llama-3-8b"), 10, dtype="int4-g64").bytes_per_layer == \
        2 * 8 * 128 // 2 + 2 * 8 * 128 // 64 * 2
    for bad in ("int4-g0", "int4-gx", "int3"):
        with pytest.raises(ValueError, match="int4-gN"):
            sizing.dtype_bytes(bad)
    assert size_cli.main(["llama-3-70b", "--dtype", "int4", "--kv-dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert f"{q.exact:,}" in out and "35,276,853,248" in out and "(+3.1%)" in out
    with pytest.raises(SystemExit):
        size_cli.main(["llama-3-70b", "--dtype", "int5"])
    assert "int4-gN" in capsys.readouterr().err


def test_int4_weights_in_the_serving_model():
    from scratchllm.teach import serving
    cfg, h100 = get("llama-3-70b"), serving.hardware("h100")
    top = serving.max_batch(cfg, h100, 4096, "int4", "bf16")
    weights = rules.int4_weights(cfg).exact
    assert top == (80 * 10 ** 9 - weights) // (320 * 1024 * 4096) == 32 and type(top) is int
    step = serving.decode_step(cfg, h100, 1, 4096, "int4", "bf16")
    assert step.weight_bytes == pytest.approx((parameters(cfg).total - 128256 * 8192) * 0.515625)
