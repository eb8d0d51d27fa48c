"""Write the vision-language fixtures beside tools/make_hf_fixtures_vision.py's llava: tiny
random checkpoints and what transformers computes with them, in float64.

    pip install ".[ref]"
    PYTHONPATH=$PWD python tools/make_hf_fixtures_vlm.py

tests/fixtures/hf/qwen2_vl (Qwen2VLForConditionalGeneration): a tower of 2 blocks (width 16,
2 heads of 8: the axial RoPE turns 2 + 2 pairs), patches 4 x 4 x 2 frames, merge 2, and a
qwen2 LM (vocab 64, width 32, 2 layers, 4 heads of 8 with 2 KV heads, mrope_section [1, 1, 2],
rope_theta 100 so that positions matter). Two images: grids (1, 4, 6) (24 patches, 6 merged
tokens) and (1, 2, 4) (8 patches, 2 tokens), random pixel_values rows (32, 96); sequence 0
holds image 0's tokens, sequence 1 image 1's, text around them.
tests/fixtures/hf/gemma3_vl (Gemma3ForConditionalGeneration, model_type gemma3): a SigLIP
tower (16 x 16 images in 4 x 4 patches, width 16, 2 blocks), the projector pooling each image
to 4 tokens (2 x 2 patches each), and a Gemma 3 LM (vocab 64, width 32, a sliding layer of
window 4 then a full layer, 4 heads of 8 with 2 KV heads, rope_theta 100 and 10). Sequence 0
holds image 0's 4 tokens between <boi> and <eoi>, sequence 1 image 1's; token_type_ids mark
them, so that they attend each other both ways.
tests/fixtures/hf/config_defaults.json: the defaults of the sub-configs' classes (what
transformers reads for a field a transformers 4 checkpoint's nested config leaves out).
Beside them their image processors' preprocessor_config.json (Qwen2VLImageProcessor: patch 4,
merge 2, 128..576 pixels; Gemma3ImageProcessor: 16 x 16, bilinear) and gemma3_vl/processed.npz:
the pixel_values of the five PNGs of tests/fixtures/images/ (transformers' PIL backend).
qwen2_vl/expected_frames.npz: its logits on a grid of t = 2 frames beside a still image.
Each expected.npz: input_ids (2, T), pixel_values [, image_grid_thw], logits, G_seed (G =
default_rng(G_seed).standard_normal(logits.shape)), grad/<checkpoint name> = d sum(logits G)
/ d param, greedy (8 ids transformers' generate gives after sequence 0 and its image; Qwen2-VL
with M-RoPE's rope_deltas), saved_by_scratchllm_rel_err (scratchllm's save_pretrained, loaded
by from_pretrained in float32: the logits' largest relative difference).
float64 everywhere (make_hf_fixtures.float64_everywhere): the eager softmax, Gemma's embedding
scale and the rotary angles too.
Reference: huggingface/transformers src/transformers/models/qwen2_vl/modeling_qwen2_vl.py;
huggingface/transformers src/transformers/models/gemma3/modeling_gemma3.py.
"""
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_hf_fixtures import OUT, ROOT, float64_everywhere  # noqa: E402
from make_hf_fixtures_vision import G_SEED, checkpoint_names, randomize  # noqa: E402


IMAGE, VIDEO, START, END = 60, 61, 62, 63
GRID = [[1, 4, 6], [1, 2, 4]]
PATCH_DIM = 3 * 2 * 4 * 4


def qwen2_vl_config():
    return transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, intermediate_size=48,
                         rms_norm_eps=1e-6, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=2, pad_token_id=None,
                         rope_parameters={"rope_type": "default", "rope_theta": 100.0,
                                          "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=2, embed_dim=16, hidden_size=32, num_heads=2, patch_size=4,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=IMAGE, video_token_id=VIDEO, vision_start_token_id=START,
        vision_end_token_id=END, tie_word_embeddings=False)


def qwen2_vl_inputs(rng):
    ids = rng.integers(3, IMAGE, (2, 14))
    ids[0, 2], ids[0, 3:9], ids[0, 9] = START, IMAGE, END
    ids[1, 5], ids[1, 6:8], ids[1, 8] = START, IMAGE, END
    pixel_values = rng.standard_normal((sum(t * h * w for t, h, w in GRID), PATCH_DIM))
    return ids, pixel_values, np.array(GRID)


def qwen2_vl_torch(ids, pixel_values, grid, dtype=torch.float64):
    ids = torch.tensor(ids)
    return dict(input_ids=ids, pixel_values=torch.tensor(pixel_values, dtype=dtype),
                image_grid_thw=torch.tensor(grid), mm_token_type_ids=(ids == IMAGE).int())


BOI, EOI = 61, 62  # Gemma 3's image brackets; its image token is IMAGE too


def gemma3_config():
    return transformers.Gemma3Config(
        text_config=dict(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         intermediate_size=48, sliding_window=4, query_pre_attn_scalar=8,
                         max_position_embeddings=128,
                         layer_types=["sliding_attention", "full_attention"],
                         rope_parameters={
                             "full_attention": {"rope_type": "default", "rope_theta": 100.0},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 10.0}}),
        vision_config=dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=24, image_size=16, patch_size=4,
                           vision_use_head=False),
        mm_tokens_per_image=4, image_token_index=IMAGE, boi_token_index=BOI,
        eoi_token_index=EOI)


def gemma3_inputs(rng):
    ids = rng.integers(3, IMAGE, (2, 12))
    ids[:, 0] = 2  # <bos>
    ids[0, 2], ids[0, 3:7], ids[0, 7] = BOI, IMAGE, EOI
    ids[1, 4], ids[1, 5:9], ids[1, 9] = BOI, IMAGE, EOI
    return ids, rng.standard_normal((2, 3, 16, 16))


def gemma3_torch(ids, pixel_values, dtype=torch.float64):
    ids = torch.tensor(ids)
    return dict(input_ids=ids, pixel_values=torch.tensor(pixel_values, dtype=dtype),
                token_type_ids=(ids == IMAGE).long())


def write(cls, config, directory, seed, inputs):
    """Save a randomized cls(config) to directory and its expected.npz: inputs(np.float64
    arrays or torch dtype) -> (numpy arrays to save, torch kwargs of sequence 0 and its image,
    torch kwargs of the batch in a dtype)."""
    model = cls(config).to(torch.float32)
    randomize(model, seed)
    model.save_pretrained(directory)
    arrays, first, batch = inputs
    loaded = cls.from_pretrained(directory, dtype=torch.float32)
    with float64_everywhere():
        model = cls._from_config(loaded.config, dtype=torch.float64,
                                 attn_implementation="eager")
    model.load_state_dict({k: v.double() for k, v in loaded.state_dict().items()})
    model.eval()
    with float64_everywhere():
        logits = model(**batch(torch.float64)).logits
        G = np.random.default_rng(G_SEED).standard_normal(tuple(logits.shape))
        (logits * torch.tensor(G)).sum().backward()
        grads = {n: torch.zeros_like(p) if p.grad is None else p.grad.clone()
                 for n, p in model.named_parameters()}
        with torch.no_grad():  # greedy ids after sequence 0 and its image
            greedy = model.generate(**first, max_new_tokens=8, min_new_tokens=8,
                                    do_sample=False)
    with tempfile.TemporaryDirectory() as tmp:
        named = checkpoint_names(model, grads, tmp)
    T = arrays["input_ids"].shape[1]
    expected = dict(arrays, greedy=greedy[0, T:].numpy(), logits=logits.detach().numpy(),
                    G_seed=G_SEED, **{f"grad/{n}": g for n, g in named.items()})
    sys.path.insert(0, str(ROOT))
    from scratchllm.hub import load_pretrained, save_pretrained
    with tempfile.TemporaryDirectory() as saved:
        save_pretrained(load_pretrained(directory), saved)
        again, info = cls.from_pretrained(saved, dtype=torch.float32,
                                          attn_implementation="eager", output_loading_info=True)
        assert not any(info.values()), info
        with torch.no_grad():
            out = again.eval()(**batch(torch.float32)).logits.numpy()
    err = float(np.abs(out - expected["logits"]).max() / np.abs(expected["logits"]).max())
    assert err < 1e-5, err
    np.savez_compressed(directory / "expected.npz", saved_by_scratchllm_rel_err=err, **expected)
    print(directory.name, "written; saved_by_scratchllm_rel_err", err, "greedy",
          expected["greedy"].tolist())


IMAGES = ROOT / "tests" / "fixtures" / "images"
PNGS = ["rgb", "rgb_large", "rgba", "gray", "palette"]


def processor(proc, directory, images=True):
    """Save the image processor beside the checkpoint; images: also its pixel_values of the
    five PNGs of tests/fixtures/images/ as directory/processed.npz."""
    from PIL import Image
    proc.save_pretrained(directory)
    if images:
        got = type(proc).from_pretrained(directory)(
            images=[Image.open(IMAGES / f"{n}.png") for n in PNGS], return_tensors="np")
        np.savez_compressed(directory / "processed.npz", pixel_values=got["pixel_values"])


def config_defaults():
    """tests/fixtures/hf/config_defaults.json: each sub-config class's defaults of the fields
    scratchllm/hub/families/defaults.py fills in."""
    import json
    from transformers.models.qwen2_vl import configuration_qwen2_vl as q
    classes = {"llama": transformers.LlamaConfig, "mistral": transformers.MistralConfig,
               "qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config,
               "gemma3_text": transformers.Gemma3TextConfig,
               "siglip_vision_model": transformers.SiglipVisionConfig,
               "clip_vision_model": transformers.CLIPVisionConfig,
               "qwen2_vl_vision": q.Qwen2VLVisionConfig, "qwen2_vl_text": q.Qwen2VLTextConfig}
    out = {name: {k: v for k, v in cls().to_dict().items()
                  if isinstance(v, (int, float, str, bool)) and v is not None}
           for name, cls in classes.items()}
    (OUT / "config_defaults.json").write_text(json.dumps(out, indent=1, sort_keys=True))


def frames_fixture(directory):
    """directory/expected_frames.npz: the qwen2_vl fixture's logits on a grid of two frames
    (t = 2: each frame attends itself in the tower) and a still image, float64."""
    cls = transformers.Qwen2VLForConditionalGeneration
    loaded = cls.from_pretrained(directory, dtype=torch.float32)
    with float64_everywhere():
        model = cls._from_config(loaded.config, dtype=torch.float64,
                                 attn_implementation="eager")
    model.load_state_dict({k: v.double() for k, v in loaded.state_dict().items()})
    rng = np.random.default_rng(501)
    grid = np.array([[2, 2, 4], [1, 4, 2]])  # 2 frames x 2 merged tokens, then 2 tokens
    ids = rng.integers(3, IMAGE, (1, 12))
    ids[0, 2:6], ids[0, 7:9] = IMAGE, IMAGE
    pixel_values = rng.standard_normal((24, PATCH_DIM))
    with float64_everywhere(), torch.no_grad():
        logits = model.eval()(**qwen2_vl_torch(ids, pixel_values, grid)).logits.numpy()
    np.savez_compressed(directory / "expected_frames.npz", input_ids=ids,
                        pixel_values=pixel_values, image_grid_thw=grid, logits=logits)


def main():
    config_defaults()
    processor(transformers.Qwen2VLImageProcessorPil(
        patch_size=4, merge_size=2, temporal_patch_size=2, min_pixels=128, max_pixels=576),
        OUT / "qwen2_vl", images=False)  # its pixel_values: make_qwen2_vl_fixtures.py's
    processor(transformers.Gemma3ImageProcessorPil(size={"height": 16, "width": 16}),
              OUT / "gemma3_vl")
    ids, pixel_values, grid = qwen2_vl_inputs(np.random.default_rng(500))
    write(transformers.Qwen2VLForConditionalGeneration, qwen2_vl_config(), OUT / "qwen2_vl",
          108, (dict(input_ids=ids, pixel_values=pixel_values, image_grid_thw=grid),
                qwen2_vl_torch(ids[:1], pixel_values[:24], grid[:1]),
                lambda dtype: qwen2_vl_torch(ids, pixel_values, grid, dtype)))
    frames_fixture(OUT / "qwen2_vl")
    ids, pixel_values = gemma3_inputs(np.random.default_rng(600))
    write(transformers.Gemma3ForConditionalGeneration, gemma3_config(), OUT / "gemma3_vl",
          109, (dict(input_ids=ids, pixel_values=pixel_values),
                gemma3_torch(ids[:1], pixel_values[:1]),
                lambda dtype: gemma3_torch(ids, pixel_values, dtype)))


if __name__ == "__main__":
    main()
