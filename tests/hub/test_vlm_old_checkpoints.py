"""Vision-language checkpoints as transformers 4 wrote them (the ones on the Hub: llava-hf's,
google's Gemma 3, Qwen's Qwen2-VL) load as the fixtures do: the tower's tensors under
vision_tower.vision_model. (llava, gemma3), and Qwen2-VL's config.json with the LM's fields at
the top and rope_scaling {"type": "mrope", "mrope_section": [...]}, nested configs that keep
only their changed fields; and bfloat16 files."""
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scratchllm.hub import family_named, load_pretrained
from hub_fixtures import HF, expected


@pytest.mark.parametrize("name", ["llava", "gemma3_vl"])
def test_a_tower_under_vision_model_loads(name, tmp_path):
    for f in ("config.json", "generation_config.json"):
        shutil.copy(HF / name / f, tmp_path)
    tensors = load_file(HF / name / "model.safetensors")
    save_file({k.replace("vision_tower.", "vision_tower.vision_model.", 1): v
               for k, v in tensors.items()}, tmp_path / "model.safetensors")
    ref = expected(name)
    old, new = load_pretrained(tmp_path, np.float64), load_pretrained(HF / name, np.float64)
    assert all(np.array_equal(p.data, q.data) for (_, p), (_, q) in zip(
        old.named_parameters(), new.named_parameters()))
    logits, _ = old.forward(input_ids=ref["input_ids"], pixel_values=ref["pixel_values"])
    assert np.abs(logits - ref["logits"]).max() < 1e-9 * np.abs(ref["logits"]).max()


def test_qwen2_vl_config_of_transformers_4_reads_the_same():
    hf = json.loads((HF / "qwen2_vl" / "config.json").read_text())
    text = dict(hf.pop("text_config"))
    rope = text.pop("rope_parameters")
    text.pop("model_type")
    old = dict(hf, **text, rope_theta=rope["rope_theta"],
               rope_scaling={"type": "mrope", "mrope_section": rope["mrope_section"]})
    old["vision_config"] = dict(old["vision_config"], in_chans=3)
    old["vision_config"].pop("in_channels")
    family = family_named("qwen2_vl")
    assert family.from_hf(old) == family.from_hf(json.loads(
        (HF / "qwen2_vl" / "config.json").read_text()))
    with pytest.raises(ValueError, match="rope 'yarn'"):
        family.from_hf(dict(old, rope_scaling={"type": "yarn", "factor": 2.0,
                                               "mrope_section": [1, 1, 2]}))


DEFAULTS = json.loads((HF / "config_defaults.json").read_text())


def test_the_defaults_table_is_transformers():
    from scratchllm.hub.families.defaults import NESTED_DEFAULTS
    for model_type, table in NESTED_DEFAULTS.items():
        assert {k: DEFAULTS[model_type][k] for k in table} == table, model_type


def _sparse(sub, model_type):
    """A sub-config as transformers 4 wrote it: the fields equal to its class's default
    left out."""
    return {k: v for k, v in sub.items()
            if k == "model_type" or DEFAULTS[model_type].get(k, object()) != v}


@pytest.mark.parametrize("name, vision, text", [
    ("llava_clip", "clip_vision_model", "llama"), ("llava", "siglip_vision_model", "llama"),
    ("gemma3_vl", "siglip_vision_model", "gemma3_text")])
def test_sub_configs_that_leave_out_their_defaults_read_the_same(name, vision, text):
    hf = json.loads((HF / name / "config.json").read_text())
    sparse = dict(hf, vision_config=_sparse(hf["vision_config"], vision),
                  text_config=_sparse(hf["text_config"], text))
    assert len(json.dumps(sparse)) < len(json.dumps(hf))
    family = family_named(hf["model_type"])
    assert family.from_hf(sparse) == family.from_hf(hf)


@pytest.mark.parametrize("name", ["qwen2_vl", "gemma3_vl"])
def test_bfloat16_checkpoints_save_and_load(name, tmp_path):
    """Saved in bfloat16, each vision-language fixture loads (cast to float64) and gives its
    float64 logits to bfloat16's rounding."""
    from scratchllm.hub import save_pretrained
    ref = expected(name)
    save_pretrained(load_pretrained(HF / name), tmp_path, dtype="bfloat16")
    assert {str(t.dtype) for t in load_file(tmp_path / "model.safetensors").values()} == \
        {"bfloat16"}
    keys = ("input_ids", "pixel_values", "image_grid_thw")
    logits, _ = load_pretrained(tmp_path, dtype=np.float64).forward(
        **{k: ref[k] for k in keys if k in ref})
    assert np.abs(logits - ref["logits"]).max() < 5e-2 * np.abs(ref["logits"]).max()


GEMMA3_4B = {  # the shape of google/gemma-3-4b-it's config.json (transformers 4.50)
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                    "model_type": "gemma3_text", "num_hidden_layers": 34,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}}
QWEN2_VL_2B = {  # the shape of Qwen/Qwen2-VL-2B-Instruct's config.json (transformers 4.41)
    "architectures": ["Qwen2VLForConditionalGeneration"], "model_type": "qwen2_vl",
    "vision_start_token_id": 151652, "vision_end_token_id": 151653, "image_token_id": 151655,
    "video_token_id": 151656, "hidden_act": "silu", "hidden_size": 1536,
    "intermediate_size": 8960, "max_position_embeddings": 32768, "max_window_layers": 28,
    "num_attention_heads": 12, "num_hidden_layers": 28, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
    "tie_word_embeddings": True, "use_sliding_window": False, "vocab_size": 151936,
    "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
                      "in_chans": 3, "hidden_size": 1536, "patch_size": 14,
                      "spatial_merge_size": 2, "spatial_patch_size": 14,
                      "temporal_patch_size": 2}}


def test_published_configs_read_as_their_models():
    """Gemma 3 4B: 34 layers, five sliding (window 1024) to one full (linear scaling 8),
    the class defaults for what its text_config leaves out (vocab, heads, head_dim 256), a
    SigLIP-so400m tower (tanh GELU) of 64 x 64 patches pooled to 16 x 16. Qwen2-VL 2B: a
    tower of 32 blocks with 80-wide heads (axial sections (20, 20)), M-RoPE (16, 24, 24)."""
    g = family_named("gemma3").from_hf(GEMMA3_4B)
    assert (g.text.n_layers, g.text.vocab_size, g.image_token_id) == (34, 262208, 262144)
    a = g.text.layers[0].mixer
    assert (a.n_heads, a.n_kv_heads, a.head_dim, a.mask.window) == (8, 4, 256, 1024)
    assert [s.mixer.mask.window for s in g.text.layers[:6]] == [1024] * 5 + [None]
    assert g.text.layers[5].mixer.rope.scaling == {"rope_type": "linear", "factor": 8.0}
    assert g.vision.layers[0].ffn.gelu_approx == "tanh" and g.vision.patch.grid == (64, 64)
    q = family_named("qwen2_vl").from_hf(QWEN2_VL_2B)
    assert (q.d_vision, len(q.layers), q.patch_dim, q.text.tie_embeddings) == (
        1280, 32, 1176, True)
    assert q.layers[0].mixer.rope.mrope_section == (20, 20)
    assert q.text.layers[0].mixer.rope.mrope_section == (16, 24, 24)
    assert q.layers[0].ffn.gelu_approx == "quick"
