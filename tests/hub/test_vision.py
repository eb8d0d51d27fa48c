"""The vision families against transformers: tests/fixtures/hf/vit (ViTForImageClassification),
siglip_vision and siglip_vision_head (SiglipVisionModel without and with its attention-pooling
head) and clip_vision (CLIPVisionModel) were computed by transformers in float64
(tools/make_hf_fixtures_vision.py); here scratchllm gives the same output (logits,
last_hidden_state, pooler_output) to 1e-9, every parameter's gradient to 1e-8, bit-identical
save/load, and a saved directory transformers loads. Their records round-trip config and
tensor names as test_registry asks of the LM families. No torch here."""
import dataclasses
import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from scratchllm.hub import (FAMILIES, family_named, grad_dict, load_pretrained,
                            save_pretrained, state_dict)
from scratchllm.hub.families.modules import ModuleFamily
from scratchllm.hub.registry import module_family_for
from scratchllm.vision import VisionTransformer
from hub_fixtures import HF, assert_names_round_trip, expected, rel_err

VISION = ["vit", "siglip_vision", "siglip_vision_head", "clip_vision"]


def run(model, ref):
    """(out, cache) of the output the fixture recorded: the pooler_output when the model
    has a pooling head or CLIP's [CLS] norm, else forward's own (logits, last_hidden_state)."""
    return model.forward(pixel_values=ref["pixel_values"],
                         pooled=model.pool is not None or model.cfg.norm_cls)


@pytest.mark.parametrize("name", VISION)
def test_output_matches_transformers(name):
    ref = expected(name)
    model = load_pretrained(HF / name, dtype=np.float64)
    assert isinstance(model, VisionTransformer)
    out, _ = run(model, ref)
    assert out.shape == ref["out"].shape
    assert rel_err(out, ref["out"]) < 1e-9
    out, _ = model.forward(pixel_values=ref["pixel_values"])
    assert rel_err(out, ref["last_hidden_state"]) < 1e-9


@pytest.mark.parametrize("name", VISION)
def test_every_gradient_matches_transformers(name):
    """d sum(out * G) / d every parameter, in the checkpoint's names and layouts. A key bias
    has gradient 0 in exact arithmetic (softmax ignores the q . bk it adds to a whole row):
    both are round-off, so both must be tiny on the scale of the key weight's gradient (the
    pooling head's key bias is the middle third of its fused in_proj_bias)."""
    ref = expected(name)
    model = load_pretrained(HF / name, dtype=np.float64)
    model.zero_grad()
    out, cache = run(model, ref)
    G = np.random.default_rng(int(ref["G_seed"])).standard_normal(out.shape)
    model.backward(G, cache)
    grads = grad_dict(model)
    want = {k.removeprefix("grad/"): v for k, v in ref.items() if k.startswith("grad/")}
    assert sorted(grads) == sorted(want)
    for n, g in want.items():
        assert grads[n].shape == g.shape, n
        key = slice(None)  # the key bias's entries, for the key biases
        if n == "head.attention.in_proj_bias":  # [q | k | v]
            D = g.shape[0] // 3
            key = slice(D, 2 * D)
            assert rel_err(np.delete(grads[n], key), np.delete(g, key)) < 1e-8, n
        elif not n.endswith(("key.bias", "k_proj.bias")):
            assert rel_err(grads[n], g) < 1e-8, n
            continue
        weight = n.replace("_bias", "_weight").replace(".bias", ".weight")
        scale = np.abs(want[weight][key]).max()
        assert max(np.abs(grads[n][key]).max(), np.abs(g[key]).max()) < 1e-12 * scale, n


@pytest.mark.parametrize("name", VISION)
def test_backward_accumulates(name):
    """backward adds into the gradients: two calls give twice one; zero_grad clears them."""
    ref = expected(name)
    model = load_pretrained(HF / name, dtype=np.float64)
    out, cache = run(model, ref)
    G = np.random.default_rng(0).standard_normal(out.shape)
    model.backward(G, cache)
    once = {n: g.copy() for n, g in grad_dict(model).items()}
    model.backward(G, cache)
    for n, g in grad_dict(model).items():
        np.testing.assert_allclose(g, 2 * once[n], rtol=1e-13, atol=1e-300)
    model.zero_grad()
    assert all(not g.any() for g in grad_dict(model).values())


@pytest.mark.parametrize("name", VISION)
def test_save_load_is_bit_identical(name, tmp_path):
    model = load_pretrained(HF / name)
    save_pretrained(model, tmp_path)
    original, saved = load_file(HF / name / "model.safetensors"), load_file(
        tmp_path / "model.safetensors")
    assert sorted(saved) == sorted(original)
    for n in original:
        assert saved[n].dtype == original[n].dtype and np.array_equal(saved[n], original[n]), n
    again = state_dict(load_pretrained(tmp_path))
    for n, array in state_dict(model).items():
        assert np.array_equal(again[n], array), n
    written = json.loads((tmp_path / "config.json").read_text())
    given = json.loads((HF / name / "config.json").read_text())
    assert {k: v for k, v in written.items() if k != "transformers_version"} == {
        k: v for k, v in given.items() if k != "transformers_version"}


@pytest.mark.parametrize("name", VISION)
def test_saved_checkpoints_loaded_by_transformers(name):
    """The generator saved each checkpoint with scratchllm's save_pretrained and loaded it
    with transformers' from_pretrained (no missing or unexpected tensors): its float32 output
    was within float32 rounding of the float64 reference."""
    assert expected(name)["saved_by_scratchllm_rel_err"] < 1e-5


@pytest.mark.parametrize("name", VISION)
def test_config_and_tensor_names_round_trip(name):
    """from_hf(to_hf(cfg)) is cfg; the family is found by name and, renamed, by shape alone;
    every Param element is in exactly one HF tensor and comes back from it."""
    hf = json.loads((HF / name / "config.json").read_text())
    family = family_named(hf["model_type"])
    assert isinstance(family, ModuleFamily) and family in FAMILIES
    cfg = family.from_hf(hf)
    for base in (None, hf):
        written = family.to_hf(cfg, "float32", base)
        assert written["architectures"] == [family.architecture]
        assert family.from_hf(written) == cfg
    assert module_family_for(cfg) is family
    assert module_family_for(dataclasses.replace(cfg, name="custom")) is family
    assert_names_round_trip(family, VisionTransformer(cfg, rng=np.random.default_rng(0)))


def test_old_siglip_names_load(tmp_path):
    """SigLIP towers saved by transformers 4 put "vision_model." before every name."""
    shutil.copy(HF / "siglip_vision" / "config.json", tmp_path)
    tensors = load_file(HF / "siglip_vision" / "model.safetensors")
    save_file({f"vision_model.{n}": t for n, t in tensors.items()},
              tmp_path / "model.safetensors")
    ref = expected("siglip_vision")
    out, _ = load_pretrained(tmp_path, dtype=np.float64).forward(ref["pixel_values"])
    assert rel_err(out, ref["out"]) < 1e-9


def test_what_the_library_cannot_honour_is_named(tmp_path):
    hf = json.loads((HF / "siglip_vision" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(dict(hf, vision_use_head=True)))
    shutil.copy(HF / "siglip_vision" / "model.safetensors", tmp_path)
    with pytest.raises(ValueError, match=r"'head.attention.in_proj_bias'.* missing \(11 in all\)"):
        load_pretrained(tmp_path)
    with pytest.raises(ValueError, match="pooled=True needs the pooling head"):
        load_pretrained(HF / "siglip_vision").forward(np.zeros((1, 3, 12, 12)), pooled=True)
    (tmp_path / "config.json").write_text(json.dumps(dict(hf, hidden_act="relu")))
    with pytest.raises(ValueError, match="hidden_act = 'relu'"):
        load_pretrained(tmp_path)
    model = load_pretrained(HF / "vit")
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        model.forward(pixel_values=np.zeros((1, 3, 12, 8), np.float32))
    shutil.copy(HF / "vit" / "config.json", tmp_path)
    tensors = load_file(HF / "vit" / "model.safetensors")
    del tensors["vit.embeddings.cls_token"]
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="cls_token.* missing"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize("name", VISION)
def test_hidden_layers_and_their_gradients_match_transformers(name):
    """forward(hidden_layer=k) is transformers' hidden_states[k] (before any norm) for every
    k, and backward from hidden_states[-2] (a vision-language model's default features)
    gives transformers' gradients, zeros past that layer."""
    ref = expected(name)
    model = load_pretrained(HF / name, dtype=np.float64)
    states = ref["hidden_states"]  # (L + 1, B, N', D)
    for k in range(-len(states), len(states)):
        h, _ = model.forward(pixel_values=ref["pixel_values"], hidden_layer=k)
        assert rel_err(h, states[k]) < 1e-9, k
    model.zero_grad()
    h, cache = model.forward(pixel_values=ref["pixel_values"], hidden_layer=-2)
    model.backward(np.random.default_rng(int(ref["G_seed"]) + 1).standard_normal(h.shape),
                   cache)
    grads = grad_dict(model)
    want = {k.removeprefix("hidden_grad/"): v for k, v in ref.items()
            if k.startswith("hidden_grad/")}
    assert sorted(grads) == sorted(want)
    for n, g in want.items():
        if not np.abs(g).max() > 0:
            assert not grads[n].any(), n
        elif not n.endswith(("key.bias", "k_proj.bias")):
            assert rel_err(grads[n], g) < 1e-8, n
    with pytest.raises(ValueError, match="hidden_layer=9 must index the 3 hidden states"):
        model.forward(pixel_values=ref["pixel_values"], hidden_layer=9)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_checkpoints_load(dtype, tmp_path):
    """A checkpoint saved in float16 / bfloat16 loads (cast to the compute dtype) and gives
    the float64 reference's output to that format's rounding."""
    ref = expected("vit")
    save_pretrained(load_pretrained(HF / "vit"), tmp_path, dtype=dtype)
    assert {str(t.dtype) for t in load_file(tmp_path / "model.safetensors").values()} == {dtype}
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == dtype
    out, _ = load_pretrained(tmp_path, dtype=np.float64).forward(ref["pixel_values"])
    assert rel_err(out, ref["out"]) < (2e-3 if dtype == "float16" else 2e-2)
