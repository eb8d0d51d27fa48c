"""Write tests/fixtures/hf/vit and tests/fixtures/hf/siglip_vision: tiny random vision
checkpoints and what transformers computes with them (the format of make_hf_fixtures.py).

    pip install ".[ref]"
    PYTHONPATH=$PWD python tools/make_hf_fixtures_vision.py

Per family a directory holds:
    config.json, model.safetensors   transformers' own save_pretrained (float32 weights)
    expected.npz                     computed by transformers in float64 from those weights:
        pixel_values (B, C, H, W), out (B, n_labels) logits (vit), (B, N, D)
        last_hidden_state (siglip_vision) or (B, D) pooler_output (siglip_vision_head: with
        the attention-pooling head; clip_vision: the post-norm of [CLS]), last_hidden_state
        (the logits for vit), G_seed
        (G = default_rng(G_seed).standard_normal(out.shape)), grad/<checkpoint name> =
        d sum(out * G) / d param for every parameter, under the names transformers writes
        in model.safetensors,
        saved_by_scratchllm_rel_err (scratchllm's save_pretrained of the checkpoint, loaded
        by from_pretrained: the float32 outputs' largest relative difference from `out`)
Beside them, each directory's preprocessor_config.json (ViTImageProcessor, size 8 x 12,
bilinear; SiglipImageProcessor, 12 x 12, bicubic; CLIPImageProcessor, shortest edge 14 and
the centre 12 x 12, bicubic), and tests/fixtures/images/: five small
PNGs drawn from a seed (RGB 13 x 17 and 37 x 29, RGBA, grayscale, a palette image) and
expected.npz with what the PIL backend of transformers' image processors makes of them:
vit (the two RGB images: ViT's processor does not convert to RGB), siglip_vision and
clip_vision (all five).
ViT's image is 8 x 12 pixels in 4 x 4 patches (a 2 x 3 grid: a transposed grid cannot hide),
SigLIP's 12 x 12 (transformers' SigLIP takes square images only).

float64: transformers' eager attention takes its softmax in float32; make_hf_fixtures'
float64_everywhere points float32 at float64 while the references are computed.
Reference: huggingface/transformers src/transformers/image_transforms.py;
huggingface/transformers src/transformers/models/vit/modeling_vit.py;
huggingface/transformers src/transformers/models/siglip/modeling_siglip.py.
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_hf_fixtures import OUT, ROOT, float64_everywhere  # noqa: E402

B, G_SEED = 2, 5
GEOMETRY = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=24, num_channels=3, patch_size=4)
FAMILIES = {  # directory -> (transformers class, config fields)
    "vit": (transformers.ViTForImageClassification, transformers.ViTConfig(
        **GEOMETRY, image_size=[8, 12], num_labels=5, hidden_act="gelu",
        layer_norm_eps=1e-12, qkv_bias=True)),
    "siglip_vision": (transformers.SiglipVisionModel, transformers.SiglipVisionConfig(
        **GEOMETRY, image_size=12, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
        vision_use_head=False)),
    "siglip_vision_head": (transformers.SiglipVisionModel, transformers.SiglipVisionConfig(
        **GEOMETRY, image_size=12, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6,
        vision_use_head=True)),
    "clip_vision": (transformers.CLIPVisionModel, transformers.CLIPVisionConfig(
        **GEOMETRY, image_size=12, hidden_act="quick_gelu", layer_norm_eps=1e-5)),
}


def randomize(model, seed):
    """Weights that make every path matter: matrices N(0, 1/fan_in) (the patch kernel's fan
    in C P P), norm gains 1 + N(0, 0.1^2), [CLS] and positions N(0, 0.5^2), biases
    N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "position" in name or "cls_token" in name:
                value = 0.5 * noise
            elif p.ndim >= 2:
                value = noise * p[0].numel() ** -0.5
            elif "norm" in name:
                value = 1 + 0.1 * noise
            else:
                value = 0.1 * noise
            p.copy_(value.to(p.dtype))


def output(model, pixel_values):
    """logits (ViT), pooler_output (SigLIP with its pooling head), else last_hidden_state."""
    out = model(pixel_values=pixel_values)
    if hasattr(out, "logits"):
        return out.logits
    return out.last_hidden_state if out.pooler_output is None else out.pooler_output


def checkpoint_names(model, grads, directory):
    """{name in model.safetensors: gradient}: the gradients saved in the parameters' place by
    transformers' save_pretrained, which writes its own checkpoint names."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(grads[name])
    model.save_pretrained(directory)
    return load_file(Path(directory) / "model.safetensors")


def reference(directory, cls, rng):
    model = cls.from_pretrained(directory, dtype=torch.float32,
                                attn_implementation="eager").double().eval()  # exact: f32 -> f64
    with float64_everywhere():
        size = model.config.image_size
        H, W = (size, size) if isinstance(size, int) else size
        pixel_values = rng.standard_normal((B, model.config.num_channels, H, W))
        out = output(model, torch.tensor(pixel_values))
        hidden = getattr(model(pixel_values=torch.tensor(pixel_values)), "last_hidden_state",
                         out)
        G = np.random.default_rng(G_SEED).standard_normal(tuple(out.shape))
        (out * torch.tensor(G)).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=False)
        states = getattr(model, "vit", model)(pixel_values=torch.tensor(pixel_values),
                                              output_hidden_states=True).hidden_states
        G2 = np.random.default_rng(G_SEED + 1).standard_normal(tuple(states[-2].shape))
        (states[-2] * torch.tensor(G2)).sum().backward()
        hidden_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    with tempfile.TemporaryDirectory() as tmp:
        named = checkpoint_names(model, grads, tmp)
    with tempfile.TemporaryDirectory() as tmp:
        hidden_named = checkpoint_names(model, hidden_grads, tmp)
    return dict(pixel_values=pixel_values, out=out.detach().numpy(), G_seed=G_SEED,
                last_hidden_state=hidden.detach().numpy(),
                hidden_states=np.stack([h.detach().numpy() for h in states]),
                **{f"hidden_grad/{n}": g for n, g in hidden_named.items()},
                **{f"grad/{n}": g for n, g in named.items()})


def saved_by_scratchllm(directory, cls, expected):
    """scratchllm's save_pretrained of the loaded checkpoint, read back by transformers
    (float32, no missing or unexpected tensors): the largest relative output difference."""
    sys.path.insert(0, str(ROOT))
    from scratchllm.hub import load_pretrained, save_pretrained
    with tempfile.TemporaryDirectory() as saved:
        save_pretrained(load_pretrained(directory), saved)
        model, info = cls.from_pretrained(saved, dtype=torch.float32,
                                          attn_implementation="eager",
                                          output_loading_info=True)
        assert not any(info.values()), info
        with torch.no_grad():
            out = output(model.eval(), torch.tensor(expected["pixel_values"],
                                                    dtype=torch.float32)).numpy()
    err = float(np.abs(out - expected["out"]).max() / np.abs(expected["out"]).max())
    assert err < 1e-5, err
    return err


PROCESSORS = {"vit": (transformers.ViTImageProcessorPil, dict(size={"height": 8, "width": 12})),
              "siglip_vision": (transformers.SiglipImageProcessorPil,
                                dict(size={"height": 12, "width": 12})),
              "clip_vision": (transformers.CLIPImageProcessorPil,
                              dict(size={"shortest_edge": 14},
                                   crop_size={"height": 12, "width": 12}))}
IMAGES = ROOT / "tests" / "fixtures" / "images"


def write_images(rng):
    """Five small PNGs: {name: path}."""
    from PIL import Image
    IMAGES.mkdir(parents=True, exist_ok=True)
    arrays = {"rgb": (rng.integers(0, 256, (13, 17, 3)), "RGB"),
              "rgb_large": (rng.integers(0, 256, (37, 29, 3)), "RGB"),
              "rgba": (rng.integers(0, 256, (10, 7, 4)), "RGBA"),
              "gray": (rng.integers(0, 256, (9, 14)), "L")}
    paths = {}
    for name, (a, mode) in arrays.items():
        paths[name] = IMAGES / f"{name}.png"
        Image.fromarray(a.astype(np.uint8), mode).save(paths[name])
    palette = Image.fromarray(rng.integers(0, 256, (11, 8, 3)).astype(np.uint8), "RGB")
    paths["palette"] = IMAGES / "palette.png"
    palette.convert("P", palette=Image.Palette.ADAPTIVE, colors=6).save(paths["palette"])
    return paths


def processed(paths):
    """{family: pixel_values} of transformers' image processors (PIL backend) on the PNGs,
    each processor saved beside its checkpoint as preprocessor_config.json."""
    from PIL import Image
    out = {}
    for name, (cls, kwargs) in PROCESSORS.items():
        cls(**kwargs).save_pretrained(OUT / name)
        processor = cls.from_pretrained(OUT / name)
        names = ["rgb", "rgb_large"] if name == "vit" else list(paths)
        images = [Image.open(paths[n]) for n in names]
        out[name] = processor(images=images, return_tensors="np")["pixel_values"]
    return out


def main():
    for seed, (name, (cls, cfg)) in enumerate(FAMILIES.items()):
        directory = OUT / name
        directory.mkdir(parents=True, exist_ok=True)
        model = cls(cfg).to(torch.float32)
        randomize(model, 100 + seed)
        model.save_pretrained(directory)
        expected = reference(directory, cls, np.random.default_rng(200 + seed))
        expected["saved_by_scratchllm_rel_err"] = saved_by_scratchllm(directory, cls, expected)
        np.savez_compressed(directory / "expected.npz", **expected)
        print(name, "written; saved_by_scratchllm_rel_err",
              expected["saved_by_scratchllm_rel_err"])
    np.savez_compressed(IMAGES / "expected.npz",
                        **processed(write_images(np.random.default_rng(300))))




# ---------------------------------------------------------------------------- llava
LLAVA_T, LLAVA_IMAGE = 14, 299  # tokens per sequence; the image token id (vocab 300)


def llava_fixture(rng, tower="siglip"):
    """tests/fixtures/hf/llava: a SigLIP tower (12 x 12 images, 9 patches) and a llama LM
    (vocab 300); sequence 0 holds one image's 9 tokens, sequence 1 the other's, text around.
    tower "clip": tests/fixtures/hf/llava_clip, LLaVA-1.5's shape: a CLIP tower whose [CLS]
    the "default" feature strategy drops.
    expected.npz: input_ids, pixel_values, logits, G_seed, grad/<name>, greedy (8 ids
    transformers' generate gives after sequence 0 and its image), saved_by_scratchllm_rel_err."""
    if tower == "clip":
        vision = transformers.CLIPVisionConfig(**GEOMETRY, image_size=12,
                                               hidden_act="quick_gelu")
    else:
        vision = transformers.SiglipVisionConfig(**GEOMETRY, image_size=12,
                                                 vision_use_head=False,
                                                 hidden_act="gelu_pytorch_tanh")
    text = transformers.LlamaConfig(vocab_size=300, hidden_size=24, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    intermediate_size=40, max_position_embeddings=64)
    cfg = transformers.LlavaConfig(vision_config=vision, text_config=text,
                                   image_token_id=LLAVA_IMAGE, vision_feature_layer=-2,
                                   vision_feature_select_strategy="full" if tower == "siglip"
                                   else "default", image_seq_length=9)
    cls = transformers.LlavaForConditionalGeneration
    directory = OUT / ("llava" if tower == "siglip" else "llava_clip")
    model = cls(cfg).to(torch.float32)
    randomize(model, 107)
    model.save_pretrained(directory)
    ids = rng.integers(0, LLAVA_IMAGE, (B, LLAVA_T))
    ids[0, 2:11] = LLAVA_IMAGE
    ids[1, 4:13] = LLAVA_IMAGE
    pixel_values = rng.standard_normal((B, 3, 12, 12))
    loaded = cls.from_pretrained(directory, dtype=torch.float32)
    with float64_everywhere():  # the rotary frequencies in float64 too
        model = cls._from_config(loaded.config, dtype=torch.float64,
                                 attn_implementation="eager")
    model.load_state_dict({k: v.double() for k, v in loaded.state_dict().items()})
    model.eval()
    with float64_everywhere():
        logits = model(input_ids=torch.tensor(ids), pixel_values=torch.tensor(pixel_values)
                       ).logits
        G = np.random.default_rng(G_SEED).standard_normal(tuple(logits.shape))
        (logits * torch.tensor(G)).sum().backward()
        grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone()
                 for n, p in model.named_parameters()}
        with torch.no_grad():  # greedy ids after sequence 0 (its image included)
            greedy = model.generate(input_ids=torch.tensor(ids[:1]),
                                    pixel_values=torch.tensor(pixel_values[:1]),
                                    max_new_tokens=8, min_new_tokens=8, do_sample=False)
    with tempfile.TemporaryDirectory() as tmp:
        named = checkpoint_names(model, grads, tmp)
    expected = dict(input_ids=ids, pixel_values=pixel_values,
                    greedy=greedy[0, LLAVA_T:].numpy(),
                    logits=logits.detach().numpy(), G_seed=G_SEED,
                    **{f"grad/{n}": g for n, g in named.items()})
    sys.path.insert(0, str(ROOT))
    from scratchllm.hub import load_pretrained, save_pretrained
    with tempfile.TemporaryDirectory() as saved:
        save_pretrained(load_pretrained(directory), saved)
        again, info = cls.from_pretrained(saved, dtype=torch.float32,
                                          attn_implementation="eager", output_loading_info=True)
        assert not any(info.values()), info
        with torch.no_grad():
            out = again.eval()(input_ids=torch.tensor(ids), pixel_values=torch.tensor(
                pixel_values, dtype=torch.float32)).logits.numpy()
    err = float(np.abs(out - expected["logits"]).max() / np.abs(expected["logits"]).max())
    assert err < 1e-5, err
    np.savez_compressed(directory / "expected.npz", saved_by_scratchllm_rel_err=err, **expected)
    print(directory.name, "written; saved_by_scratchllm_rel_err", err)


if __name__ == "__main__":
    if "--llava" not in sys.argv:
        main()
    llava_fixture(np.random.default_rng(400))
    llava_fixture(np.random.default_rng(401), tower="clip")
