"""The newer causal families' config checks: a config.json field whose value the library does
not implement is an error naming it (olmo2, gemma2, qwen3_moe, deepseek_v2, mamba2,
llama4_text, deepseek_v32, rwkv), and a
model whose options a family cannot express does not save as it. The numbers themselves
(logits, gradients, greedy ids, save) are tests/hub/test_pretrained.py's."""
import json
import shutil

import numpy as np
import pytest

from scratchllm.hub import flat_of, load_pretrained, save_pretrained
from scratchllm.lm import LM, preset
from hub_fixtures import HF


@pytest.mark.parametrize("family, field, value", [
    ("olmo2", "attention_bias", True), ("olmo2", "hidden_act", "gelu"),
    ("gemma2", "use_bidirectional_attention", True), ("gemma2", "attention_bias", True),
    ("qwen3_moe", "mlp_only_layers", [1]), ("qwen3_moe", "use_sliding_window", True),
    ("deepseek_v2", "topk_method", "noaux_tc"), ("deepseek_v2", "num_key_value_heads", 2),
    ("deepseek_v2", "n_shared_experts", 0), ("mamba2", "layer_norm_epsilon", 1e-6),
    ("mamba2", "time_step_limit", [0.0, 1.0]), ("mamba2", "use_bias", True),
    ("llama4_text", "moe_layers", [0, 1, 3]),
    ("llama4_text", "layer_types", ["sliding_attention"] * 4),
    ("llama4_text", "attention_bias", True), ("deepseek_v32", "q_lora_rank", None),
    ("deepseek_v32", "mlp_layer_types", ["sparse", "dense"]),
    ("deepseek_v32", "layer_types", ["full_attention"] * 2), ("rwkv", "rescale_every", -1),
    ("rwkv", "attention_hidden_size", 8), ("rwkv", "layer_norm_epsilon", 1e-6)])
def test_config_errors_name_the_field(family, field, value, tmp_path):
    d = tmp_path / family
    shutil.copytree(HF / family, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, field: value}))
    with pytest.raises(ValueError, match=f"{field} = "):
        load_pretrained(d)


def test_the_loaded_options_read_as_flat_names():
    f = {name: flat_of(load_pretrained(HF / name).cfg) for name in (
        "olmo2", "gemma2", "qwen3_moe", "deepseek_v2", "deepseek_v2_lite", "mamba2_groups")}
    assert (f["olmo2"].block, f["olmo2"].qk_norm) == ("output", "full")
    assert (f["gemma2"].attn_softcap, f["gemma2"].logit_softcap) == (2.0, 3.0)
    assert f["gemma2"].layer_types == ["sliding_attention", "full_attention"]
    assert (f["qwen3_moe"].first_k_dense, f["qwen3_moe"].norm_topk_prob) == (1, True)
    assert (f["deepseek_v2"].n_group, f["deepseek_v2"].group_top) == (4, 1)
    assert (f["deepseek_v2_lite"].norm_eps, f["deepseek_v2_lite"].mla_norm_eps) == (1e-5, 1e-6)
    assert f["mamba2_groups"].ssm_groups == 2
    llama4 = flat_of(load_pretrained(HF / "llama4_text").cfg)
    assert (llama4.attention_chunk, llama4.nope_layers, llama4.qk_norm) == (4, [2], "l2")
    assert (llama4.moe_gate_input, llama4.moe_every, llama4.pad_id) == (True, 2, 0)
    assert llama4.attn_temperature == [0.5, 2]
    v32 = flat_of(load_pretrained(HF / "deepseek_v32").cfg)
    assert (v32.index_topk, v32.index_n_heads, v32.index_head_dim) == (4, 4, 8)


@pytest.mark.parametrize("name, overrides, named", [
    ("dense", dict(block="output", qk_norm=True), "olmo2 cannot express qk_norm=True"),
    ("dense", dict(block="sandwich", norm_offset=1.0, embed_scale=True, ffn="geglu",
                   attn_softcap=5.0, attn_impl="flash"), "attn_softcap"),
    ("dense", dict(logit_softcap=30.0), "has the shape of none of the families"),
    ("moe", dict(qk_norm=True, n_shared=1), "qwen3_moe cannot express n_shared=1")])
def test_save_names_what_the_family_cannot_express(name, overrides, named, tmp_path):
    try:
        model = LM(preset(name, vocab_size=11, d_model=8, n_layers=2, n_heads=2, n_kv_heads=1,
                          d_ff=8, **overrides), rng=np.random.default_rng(0))
    except ValueError as e:  # a spec that refuses the combination names it too
        assert "softcap" in str(e)
        return
    with pytest.raises(ValueError, match=named):
        save_pretrained(model, tmp_path)
    assert not (tmp_path / "model.safetensors").exists()
