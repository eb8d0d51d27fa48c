"""DeepSeek-V3's multi-token-prediction layers in a Hugging Face checkpoint
(tools/make_hf_fixtures_mtp.py): loaded into the library's MTP modules, each module's logits
equal transformers' MtpModel (module 1) and DeepSeek-V3's chain (module 2, h^1 before its
norm), the block input equals a hand NumPy computation from the safetensors, and saving
writes every tensor back bit for bit."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from hub_fixtures import HF, expected, rel_err
from scratchllm.hub import load_pretrained, save_pretrained

D = HF / "deepseek_v3_mtp"


@pytest.fixture(scope="module")
def loaded():
    return load_pretrained(D, dtype=np.float64), expected("deepseek_v3_mtp")


def test_the_mtp_layers_load_and_match_transformers(loaded):
    model, want = loaded
    assert model.cfg.mtp is not None and model.cfg.mtp.depth == 2
    assert len(model.layers) == 2  # the MTP layers are not trunk layers
    assert len(want["unexpected_on_load"]) > 0  # DeepseekV3ForCausalLM dropped them
    ids = want["ids"]
    logits, cache = model.forward(ids)
    assert rel_err(logits, want["logits"]) < 1e-10
    h0 = cache.last  # (B, T, D) before the final norm
    assert rel_err(h0, want["trunk_hidden"]) < 1e-10
    h1, logits1, c1 = model.mtp.step(model, 1, h0[:, :-1], ids[:, 1:])
    assert rel_err(logits1, want["mtp1_logits"]) < 1e-10
    _, logits2, _ = model.mtp.step(model, 2, h1[:, :-1], ids[:, 2:])
    assert rel_err(logits2, want["mtp2_logits"]) < 1e-10
    assert rel_err(logits2, want["hf_chain_mtp2_logits"]) > 1e-3  # MtpModel's chain differs
    mod = model.mtp.depths[0]  # the block's input [enorm(E t); hnorm(h)] M, by hand
    e = model.embed.E.data[ids[:, 1:]]
    a = mod.proj.forward(np.concatenate([mod.enorm.forward(e)[0],
                                         mod.hnorm.forward(h0[:, :-1])[0]], -1))[0]
    assert rel_err(a, want["hand_block_input1"]) < 1e-10


def test_saving_writes_the_mtp_layers_back_bit_for_bit(tmp_path):
    save_pretrained(load_pretrained(D), tmp_path)
    a, b = load_file(D / "model.safetensors"), load_file(tmp_path / "model.safetensors")
    assert sorted(a) == sorted(b)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["num_nextn_predict_layers"] == 2 and hf["num_hidden_layers"] == 2


def test_counted_layers_the_file_lacks_are_left_out_and_copies_must_agree(tmp_path):
    """config.json counts 2 MTP layers; a file with the first one alone loads with depth 1,
    one with none (transformers' own save_pretrained) without MTP; a copy of the head that
    differs from the trunk's is refused."""
    from safetensors.numpy import save_file
    tensors = load_file(D / "model.safetensors")
    (tmp_path / "config.json").write_text((D / "config.json").read_text())
    save_file({k: v for k, v in tensors.items() if not k.startswith("model.layers.3.")},
              tmp_path / "model.safetensors")
    assert load_pretrained(tmp_path).cfg.mtp.depth == 1
    save_file({k: v for k, v in tensors.items() if not k.startswith(("model.layers.3.",
                                                                      "model.layers.2."))},
              tmp_path / "model.safetensors")
    assert load_pretrained(tmp_path).cfg.mtp is None
    save_file({k: v for k, v in tensors.items() if not k.endswith(("embed_tokens.weight",
                                                                    "head.head.weight"))
               or k == "model.embed_tokens.weight"}, tmp_path / "model.safetensors")
    assert load_pretrained(tmp_path).cfg.mtp.depth == 2  # the copies are optional
    bad = dict(tensors)
    bad["model.layers.2.shared_head.head.weight"] = bad["lm_head.weight"] + 1
    save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="differs from lm_head.weight"):
        load_pretrained(tmp_path)


def test_other_families_refuse_mtp_modules():
    """mtp_depth is a flat name (ModelConfig.mtp); only deepseek_v3 saves MTP layers."""
    from dataclasses import replace

    from scratchllm.lm import LM, preset
    from scratchllm.specs import MTPSpec
    cfg = replace(preset("dense", vocab_size=32, d_model=16, n_layers=1, n_heads=2,
                         n_kv_heads=1, d_ff=16, mtp_depth=2, mtp_weight=0.1), name="llama")
    assert cfg.mtp == MTPSpec(2, 0.1)
    with pytest.raises(ValueError, match="mtp_depth=0"):
        save_pretrained(LM(cfg, rng=np.random.default_rng(0)), "/nonexistent/never-written")


def test_an_mla_preset_with_mtp_modules_saves_and_loads_as_deepseek_v3(tmp_path):
    """`train --mtp D` on the mla preset, then save_pretrained: the MTP modules (an MoE block
    each, with its selection bias) come back from load_pretrained bit for bit."""
    from scratchllm.hub.pretrained import state_dict
    from scratchllm.lm import LM, preset
    cfg = preset("mla", vocab_size=40, d_model=24, n_layers=2, n_heads=4, n_kv_heads=2,
                 d_ff=16, n_experts=4, top_k=2, norm_eps=1e-6, q_lora_rank=8, kv_lora_rank=8,
                 qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6, mtp_depth=2)
    model = LM(cfg, rng=np.random.default_rng(0))
    model.mtp.depths[1].block.ffn.selection_bias[...] = np.arange(4) / 10
    save_pretrained(model, tmp_path)
    again = load_pretrained(tmp_path)
    assert again.cfg.mtp.depth == 2
    a, b = state_dict(model), state_dict(again)
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)
    assert "model.layers.3.mlp.gate.e_score_correction_bias" in a
