"""Sizing arithmetic and the rules of thumb against published numbers (papers and config.json
files, copied here as literals) and against formulas written out independently of
scratchllm/teach/sizing.py and scratchllm/teach/rules.py."""
from dataclasses import replace

import pytest

from scratchllm.cli import size as size_cli
from scratchllm.specs import AttentionSpec, MambaSpec, Mask, from_flat
from scratchllm.teach import sizing as acc
from scratchllm.teach import arch, rules
from scratchllm.teach.arch import get, with_mixer
from scratchllm.teach.sizing import kv_cache, parameters

KiB = 1024


def test_llama_3_8b_parameters_term_by_term():
    p = parameters(get("llama-3-8b"))
    assert p.total == p.active == 8_030_261_248
    assert p.parts["attention"][0] == 32 * 41_943_040      # 2·4096² + 2·4096·1024
    assert p.parts["mlp"][0] == 32 * 176_160_768           # 3·4096·14336
    assert p.parts["embedding"][0] + p.parts["head"][0] == 1_050_673_152
    assert p.parts["norms"][0] == 32 * 8192 + 4096
    assert acc.human(p.total) == "8.03B"


@pytest.mark.parametrize("name, per_token", [
    ("llama-3-8b", 128 * KiB), ("llama-3-70b", 320 * KiB), ("llama-3.1-405b", 504 * KiB)])
def test_llama_kv_cache_per_token(name, per_token):
    c = kv_cache(get(name), dtype="bf16")
    assert c.elements_per_layer == 2 * 8 * 128
    assert c.bytes_per_layer == 4 * KiB
    assert c.bytes_per_token == per_token


def test_gpt3_twelve_l_d_squared_plus_embeddings():
    p = parameters(get("gpt-3-175b"))
    matrices = p.parts["attention"][0] + p.parts["mlp"][0]
    assert matrices == 12 * 96 * 12288 ** 2 == 173_946_175_488
    with_embeddings = matrices + p.parts["embedding"][0] + p.parts["positions"][0]
    assert with_embeddings == 173_946_175_488 + 50257 * 12288 + 2048 * 12288
    assert round(with_embeddings / 1e9, 2) == 174.59
    assert "head" not in p.parts                           # tied to the embedding
    # biases (qkv 3d, out d, fc 4d, proj d) and LayerNorms (2 per layer + final, weight + bias)
    assert p.total == with_embeddings + 96 * (9 * 12288 + 4 * 12288) + 2 * 12288


def test_mixtral_total_and_active():
    p = parameters(get("mixtral-8x7b"))
    assert (p.total, p.active) == (46_702_792_704, 12_879_925_248)
    assert p.parts["router"] == (32 * 4096 * 8, 32 * 4096 * 8)


def test_mistral_7b_published_config():
    d, f, layers = 4096, 14336, 32
    per_layer = 2 * d * d + 2 * d * 1024 + 3 * d * f + 2 * d
    assert parameters(get("mistral-7b")).total == layers * per_layer + 2 * 32000 * d + d
    assert acc.human(parameters(get("mistral-7b")).total) == "7.24B"


def test_deepseek_v2_mla_vs_mha_cache():
    v2 = get("deepseek-v2")
    mha = with_mixer(v2, AttentionSpec(n_heads=128, n_kv_heads=128, head_dim=128))
    assert acc.kv_elements_per_token_layer(v2) == 576
    assert acc.kv_elements_per_token_layer(mha) == 32_768
    assert acc.kv_elements_per_token_layer(v2, absorbed=False) == 128 * (192 + 128) == 40_960
    assert kv_cache(v2).bytes_per_token * 2 == 135 * KiB  # 67.5 KiB
    assert kv_cache(mha).bytes_per_token == 3840 * KiB


def test_deepseek_v3_parameters_and_cache():
    a = get("deepseek-v3")
    p = parameters(a)
    assert p.total == 671_026_419_200                       # no MTP module
    assert p.parts["attention"][0] == 61 * 187_107_328
    expert = 44_040_192
    assert p.parts["routed experts"] == (58 * 256 * expert, 58 * 8 * expert)
    assert p.parts["shared experts"][0] == 58 * expert
    assert p.parts["mlp"][0] == 3 * 3 * 7168 * 18432
    assert p.parts["router"][0] == 58 * (256 * 7168 + 256)  # gate weight + selection bias
    assert p.active == p.total - 58 * 248 * expert == 37_552_297_472
    assert acc.human(p.active) == "37.55B"
    assert round((p.active - p.parts["embedding"][0]) / 1e9, 1) == 36.6
    assert kv_cache(a, dtype="bf16").bytes_per_token == 61 * 576 * 2 == 70_272


def test_deepseek_v2_headline_sizes():
    p = parameters(get("deepseek-v2"))
    assert round(p.total / 1e9) == 236 and round(p.active / 1e9) == 21


def test_mamba_130m_matches_the_hf_checkpoint():
    p = parameters(get("mamba-130m"))
    assert p.total == 129_135_360                            # state-spaces/mamba-130m-hf numel
    c = kv_cache(get("mamba-130m"), context=10**6, batch=3, dtype="fp32")
    assert c.bytes_per_token == 0
    assert c.bytes == 3 * 24 * 1536 * (3 + 16) * 4           # independent of the context


def test_flops_per_token():
    a = get("llama-3-8b")
    n = 8_030_261_248 - 128256 * 4096                        # the embedding lookup is free
    assert acc.flops_per_token(a, 0) == 2 * n
    assert acc.flops_per_token(a, 2048) == 2 * n + 2 * 32 * 2048 * 4096
    assert acc.flops_per_token(a, 2048, training=True) == 3 * acc.flops_per_token(a, 2048)
    gpt3 = get("gpt-3-175b")                                 # tied: the head matmul still costs
    assert acc.flops_per_token(gpt3, 0) == 2 * (parameters(gpt3).total - 2048 * 12288)
    mix = get("mixtral-8x7b")
    assert acc.flops_per_token(mix, 0) == 2 * (12_879_925_248 - 32000 * 4096)


def test_serving_memory_and_window():
    a = get("llama-3-70b")
    s = acc.serving_memory(a, 65536, 8, "bf16")
    assert s.cache == 80 * 4096 * 65536 * 8 == 160 * KiB ** 3
    assert s.weights == 2 * 70_553_706_496 and s.total == s.weights + s.cache
    assert acc.serving_memory(a, 65536, 8, "bf16", kv_dtype="fp8").cache == s.cache // 2
    mistral = get("mistral-7b")
    swa = with_mixer(mistral, replace(mistral.layers[0].mixer, mask=Mask(window=4096, n_sink=4)))
    assert kv_cache(swa, context=32768).tokens == 4100
    assert kv_cache(swa, context=1000).tokens == 1000


def test_the_lms_flat_names_describe_the_same_models():
    llama = from_flat(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                      d_ff=14336, tie_embeddings=False, window=None)
    assert parameters(llama) == parameters(get("llama-3-8b"))
    v3 = from_flat(
        vocab_size=129280, d_model=7168, n_layers=61, n_heads=128, n_kv_heads=128, d_ff=2048,
        attention="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, ffn="moe", n_experts=256, top_k=8, n_shared=1,
        first_k_dense=3, dense_d_ff=18432, bias_gamma=1e-3)
    # the LM's selection bias is a buffer, not a Param: not counted
    assert parameters(v3).total == v3.n_params() == 671_026_419_200 - 58 * 256
    assert kv_cache(v3).bytes_per_token == 70_272
    hybrid = from_flat(vocab_size=64, d_model=16, n_layers=4, n_heads=2, n_kv_heads=1,
                       d_ff=32, layer_pattern="MAMA", d_state=4, d_conv=3, expand=2)
    assert acc.n_attention_layers(hybrid) == 2


def test_windows_in_some_layers_are_counted_layer_by_layer():
    mixed = from_flat(n_layers=3, d_model=32, n_heads=4, n_kv_heads=2, window=8,
                      layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    assert acc.layer_windows(mixed) == (8, 8, None) and acc.n_global_layers(mixed) == 1
    c = kv_cache(mixed, context=100, batch=3, dtype="fp32")
    per_layer = 2 * 2 * 8 * 4                                # K and V, 2 heads of 8, fp32
    assert c.layer_tokens == (8, 8, 100) and c.tokens == 100
    assert c.kv_bytes == (8 + 8 + 100) * per_layer and c.bytes == 3 * c.kv_bytes
    assert kv_cache(mixed, context=5).layer_tokens == (5, 5, 5)
    n = 2 * (parameters(mixed).total - mixed.vocab_size * 32)
    assert acc.flops_per_token(mixed, 100) == n + 2 * (8 + 8 + 100) * 4 * 8
    assert rules.receptive_field(mixed) is None               # the global layer sees it all
    wider = replace(mixed, layers=mixed.layers[:2] + (replace(
        mixed.layers[2], mixer=replace(mixed.layers[2].mixer, n_kv_heads=4)),))
    with pytest.raises(ValueError, match="attention layers 0 and 2 with different sizes"):
        kv_cache(wider)


def test_cli_prints_exact_integers(capsys):
    assert size_cli.main(["llama-3-70b", "--context", "65536", "--batch", "8", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    for text in ("70,553,706,496", "70.55B", "327,680", "320.00 KiB", "171,798,691,840",
                 "160.00 GiB", "141,107,412,992"):
        assert text in out, out
    assert size_cli.main(["deepseek-v3"]) == 0
    out = capsys.readouterr().out
    assert "671,026,419,200" in out and "37,552,297,472" in out and "70,272" in out


def test_cli_list_and_unknown_name(capsys):
    assert size_cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in arch.MODELS), out
    with pytest.raises(SystemExit) as e:
        size_cli.main(["llama-9"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown model 'llama-9'" in err and "deepseek-v3" in err
    with pytest.raises(ValueError, match="known: llama-3-8b"):
        get("gpt-5")
    with pytest.raises(ValueError, match="unknown dtype"):
        kv_cache(get("llama-3-8b"), dtype="fp6")


# ---------------------------------------------------------------- the chapters' rules of thumb
def test_gpt3_rule_beside_the_exact_count_and_its_pieces(capsys):
    gpt3 = get("gpt-3-175b")
    assert rules.twelve_l_d2(gpt3) == 173_946_175_488
    assert parameters(gpt3).total == 174_604_259_328
    assert rules.block_pieces(gpt3) == [("attention", 4 * 12288 ** 2, 603_979_776),
                                      ("mlp", 8 * 12288 ** 2, 1_207_959_552)]
    assert size_cli.main(["gpt-3-175b"]) == 0
    out = capsys.readouterr().out
    assert "173,946,175,488" in out and "174,604,259,328" in out
    assert "603,979,776" in out and "1,207,959,552" in out


def test_flop_rules_2n_and_6n():
    a = get("llama-3-8b")
    assert rules.flop_rules(a) == (2 * 8_030_261_248, 6 * 8_030_261_248)
    assert rules.flop_rules(get("mixtral-8x7b")) == (2 * 12_879_925_248, 6 * 12_879_925_248)


def test_attention_overtakes_the_weight_matmuls_at_6d_or_12d():
    gpt3 = get("gpt-3-175b")
    assert rules.attention_crossover(gpt3, "4n2d") == 6 * 12288
    assert rules.attention_crossover(gpt3, "2Td") == 12 * 12288
    # at that context the 2Td attention term of flops_per_token equals the blocks' 2·12·D²·L
    n = 12 * 12288
    attention_term = acc.flops_per_token(gpt3, n) - acc.flops_per_token(gpt3, 0)
    assert attention_term == 2 * 12 * 12288 ** 2 * 96
    assert rules.attention_crossover(get("mamba-130m")) is None
    with pytest.raises(ValueError, match="convention must be"):
        rules.attention_crossover(gpt3, "6nd")


def test_mistral_v01_window_and_its_131k_receptive_field(capsys):
    v01, v02 = get("mistral-7b-v0.1"), get("mistral-7b")
    assert parameters(v01) == parameters(v02)
    assert (acc.sliding_window(v01), acc.sliding_window(v02)) == (4096, None)
    assert rules.receptive_field(v01) == 32 * 4096 == 131_072 and rules.receptive_field(v02) == 0
    assert kv_cache(v01, context=32768).tokens == 4096
    n = 2 * (parameters(v01).total - 32000 * 4096)
    assert acc.flops_per_token(v01, 32768) == n + 2 * 32 * 4096 * 4096  # attends to W only
    assert size_cli.main(["mistral-7b-v0.1"]) == 0
    out = capsys.readouterr().out
    assert "131,072" in out and "131k" in out


def test_llama_405b_gqa_against_mha():
    a = get("llama-3.1-405b")
    mha = with_mixer(a, replace(a.layers[0].mixer, n_kv_heads=128))
    assert kv_cache(a).bytes_per_layer == 4096
    assert kv_cache(mha).bytes_per_layer == 2 * 128 * 128 * 2 == 16 * 4096


def test_mixtral_headline_figures():
    p = parameters(get("mixtral-8x7b"))
    assert (round(p.total / 1e9, 1), round(p.active / 1e9, 1)) == (46.7, 12.9)


def test_mamba_state_chapter_and_full():
    mamba = with_mixer(get("llama-3-8b"), MambaSpec())        # D 4096, N 16, expand 2, conv 4
    m = rules.mamba_state_numbers(mamba)
    assert m.chapter == 4096 * 16 == 65_536                    # the chapter's ~64k per layer
    assert m.full == 2 * 4096 * 16 + 3 * 2 * 4096 == 155_648   # expand and conv state
    small = rules.mamba_state_numbers(get("mamba-130m"))
    assert small == (768 * 16, 1536 * (16 + 3))


def test_kv_against_state_at_1k_32k_1m():
    rows = rules.cache_at(get("llama-3-8b"))
    assert rows == [(1024, 1024 * 128 * KiB, 0), (32768, 32768 * 128 * KiB, 0),
                    (1048576, 1048576 * 128 * KiB, 0)]
    state = 24 * 1536 * 19 * 2
    assert rules.cache_at(get("mamba-130m")) == [(T, 0, state) for T in (1024, 32768, 1048576)]


def test_explain_prints_the_formula_under_each_line(capsys):
    assert size_cli.main(["gpt-3-175b", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "= 12 · 96 · 12288²" in out and "= P / (2·Dattn)" in out
    assert "= 2·Hkv·Dh (K and V)" in out
    assert size_cli.main(["gpt-3-175b"]) == 0
    assert "= 12 · 96" not in capsys.readouterr().out
    assert size_cli.main(["mamba-130m", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "D·N = 768·16" in out and "12,288" in out and "29,184" in out
