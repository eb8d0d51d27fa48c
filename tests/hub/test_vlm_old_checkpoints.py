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
