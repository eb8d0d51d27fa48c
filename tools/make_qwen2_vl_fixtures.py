"""Write the Qwen2-VL fixtures: what transformers' Qwen2-VL image processor and M-RoPE compute.

    pip install ".[ref]"
    PYTHONPATH=$PWD python tools/make_hf_fixtures_vision.py   # the five PNGs (run once)
    PYTHONPATH=$PWD python tools/make_qwen2_vl_fixtures.py

Writes
    tests/fixtures/hf/qwen2_vl_processor/preprocessor_config.json
        Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
        min_pixels=128, max_pixels=576) saved by transformers: factor 8, so the 37 x 29 image
        takes smart_resize's shrinking branch and the small ones its growing branch;
    tests/fixtures/images/qwen2_vl.npz
        pixel_values (N, C*T*P*P) float32 and image_grid_thw (n_images, 3) of that processor on
        the five PNGs of tests/fixtures/images/ (rgb, rgb_large, rgba, gray, palette);
    tests/fixtures/hf/qwen2_vl_mrope.npz
        M-RoPE of a tiny Qwen2VLModel (built under make_hf_fixtures' float64_everywhere, so
        that the rotary angles are float64 too) (head_dim 16, mrope_section [2, 3, 3], rope_theta 100,
        image_token_id 7, spatial_merge_size 2), in float64:
        input_ids (2, T) with the image placeholders, image_grid_thw, mm_token_type_ids,
        position_ids (3, 2, T) and rope_deltas (2, 1) from get_rope_index, q (2, H, T, 16)
        and q_embed = apply_rotary_pos_emb(q, ...) with Qwen2VLRotaryEmbedding's cos, sin;
        the vision tower's 2-D RoPE (head_dim 8, theta 10000): vision_grid_thw,
        vision_position_ids (N, 2) (h, w) from get_vision_position_ids, vision_q (N, 2, 8)
        and vision_q_embed (apply_rotary_pos_emb_vision with
        Qwen2VLVisionRotaryEmbedding's cos, sin).
    tests/fixtures/hf/qwen2_vl_merger.npz
        a PatchMerger (dim 5, context_dim 4, merge 2) in float64: its weights under their
        module names, x (12, 4), y (3, 5), G and grad/<name> = d sum(y * G) / d name.
    tests/fixtures/hf/qwen2_vl_vision_attention.npz
        the tower's VisionAttention (eager) on two images' 20 patch rows with its 2-D RoPE,
        float64: weights, x, y, G and grad/<name>.
Reference: huggingface/transformers src/transformers/models/qwen2_vl/image_processing_pil_qwen2_vl.py;
huggingface/transformers src/transformers/models/qwen2_vl/modeling_qwen2_vl.py.
"""
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers.models.qwen2_vl import modeling_qwen2_vl as mq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from make_hf_fixtures import float64_everywhere  # noqa: E402
IMAGES = ROOT / "tests" / "fixtures" / "images"
HF = ROOT / "tests" / "fixtures" / "hf"
NAMES = ["rgb", "rgb_large", "rgba", "gray", "palette"]
IMAGE_TOKEN = 7


def processor_fixture():
    from PIL import Image
    out = HF / "qwen2_vl_processor"
    transformers.Qwen2VLImageProcessorPil(patch_size=4, merge_size=2, temporal_patch_size=2,
                                          min_pixels=128, max_pixels=576).save_pretrained(out)
    processor = transformers.Qwen2VLImageProcessorPil.from_pretrained(out)
    got = processor(images=[Image.open(IMAGES / f"{n}.png") for n in NAMES],
                    return_tensors="np")
    np.savez_compressed(IMAGES / "qwen2_vl.npz", pixel_values=got["pixel_values"],
                        image_grid_thw=got["image_grid_thw"])
    print("qwen2_vl processor:", got["pixel_values"].shape, got["image_grid_thw"].tolist())


def mrope_fixture():
    torch.manual_seed(0)
    cfg = transformers.Qwen2VLConfig(
        text_config=dict(vocab_size=32, hidden_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, intermediate_size=16,
                         rope_parameters={"rope_type": "default", "rope_theta": 100.0,
                                          "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=1, embed_dim=16, hidden_size=32, num_heads=2, patch_size=4,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=IMAGE_TOKEN, video_token_id=8, vision_start_token_id=5)
    model = mq.Qwen2VLModel(cfg).double()
    grid = torch.tensor([[1, 4, 6], [1, 2, 2], [1, 6, 2]])  # 6, 1 and 3 merged tokens
    text = [[1, 2, 5] + [IMAGE_TOKEN] * 6 + [3, 4, 5] + [IMAGE_TOKEN] + [9, 10, 11],
            [12, 5] + [IMAGE_TOKEN] * 3 + [13] * 11]
    ids = torch.tensor(text)
    types = (ids == IMAGE_TOKEN).int()
    pos, deltas = model.get_rope_index(ids, image_grid_thw=grid, mm_token_type_ids=types)
    rotary = mq.Qwen2VLRotaryEmbedding(cfg.text_config).double()
    q = torch.randn(2, 2, ids.shape[1], 16, dtype=torch.float64)
    cos, sin = rotary(q, pos)
    q_embed, _ = mq.apply_rotary_pos_emb(q, q, cos, sin)
    vcfg = cfg.vision_config  # head_dim 8: 2 frequencies for h, 2 for w
    vgrid = torch.tensor([[1, 4, 6], [1, 2, 2]])
    vpos = mq.get_vision_position_ids(vgrid, 2)  # (N, 2) rows (h, w)
    vrot = mq.Qwen2VLVisionRotaryEmbedding(vcfg).double()
    vq = torch.randn(int(vgrid.prod(-1).sum()), 2, 8, dtype=torch.float64)  # (N, H, Dh)
    vcos, vsin = vrot(vq, vpos)
    vq_embed, _ = mq.apply_rotary_pos_emb_vision(vq, vq, vcos, vsin)
    np.savez_compressed(HF / "qwen2_vl_mrope.npz", input_ids=ids.numpy(),
                        vision_grid_thw=vgrid.numpy(), vision_position_ids=vpos.numpy(),
                        vision_q=vq.numpy(), vision_q_embed=vq_embed.numpy(),
                        image_grid_thw=grid.numpy(), mm_token_type_ids=types.numpy(),
                        position_ids=pos.numpy(), rope_deltas=deltas.numpy(), q=q.numpy(),
                        q_embed=q_embed.numpy())
    print("qwen2_vl mrope:", pos.shape, deltas.ravel().tolist())


def merger_fixture():
    """PatchMerger(dim=5, context_dim=4, spatial_merge_size=2) with random weights on 12 patch
    rows: x, y, G, and d sum(y * G) / d (x and every parameter, named as in the module)."""
    torch.manual_seed(1)
    merger = mq.PatchMerger(dim=5, context_dim=4, spatial_merge_size=2).double()
    for p in merger.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(12, 4, dtype=torch.float64, requires_grad=True)
    y = merger(x)
    G = torch.randn(y.shape, dtype=torch.float64)
    (y * G).sum().backward()
    out = {"x": x.detach().numpy(), "y": y.detach().numpy(), "G": G.numpy(),
           "grad/x": x.grad.numpy()}
    for name, p in merger.named_parameters():
        out[name] = p.detach().numpy()
        out["grad/" + name] = p.grad.numpy()
    np.savez_compressed(HF / "qwen2_vl_merger.npz", **out)
    print("qwen2_vl merger:", sorted(out))


def attention_fixture():
    """VisionAttention (embed_dim 16, 2 heads, head_dim 8) on two images' patches (grids
    (1, 4, 4) and (1, 2, 2): 20 rows), each attending only its own image (cu_seqlens), with
    the 2-D RoPE: x, y, G, grad/x and grad/<name> of qkv.weight, qkv.bias, proj.weight,
    proj.bias, and the weights."""
    torch.manual_seed(2)
    cfg = transformers.Qwen2VLConfig(vision_config=dict(depth=1, embed_dim=16, num_heads=2))
    vcfg = cfg.vision_config
    vcfg._attn_implementation = "eager"
    attn = mq.VisionAttention(vcfg).double()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.3)
    grid = torch.tensor([[1, 4, 4], [1, 2, 2]])
    rot = mq.Qwen2VLVisionRotaryEmbedding(vcfg).double()
    x = torch.randn(20, 16, dtype=torch.float64, requires_grad=True)
    cos, sin = rot(x, mq.get_vision_position_ids(grid, 2))
    cu = torch.tensor([0, 16, 20], dtype=torch.int32)
    y = attn(x, cu_seqlens=cu, position_embeddings=(cos, sin))
    G = torch.randn(y.shape, dtype=torch.float64)
    (y * G).sum().backward()
    out = {"x": x.detach().numpy(), "y": y.detach().numpy(), "G": G.numpy(),
           "grid": grid.numpy(), "grad/x": x.grad.numpy()}
    for name, p in attn.named_parameters():
        out[name] = p.detach().numpy()
        out["grad/" + name] = p.grad.numpy()
    np.savez_compressed(HF / "qwen2_vl_vision_attention.npz", **out)
    print("qwen2_vl vision attention:", sorted(out))


if __name__ == "__main__":
    processor_fixture()
    with float64_everywhere():
        mrope_fixture()
        merger_fixture()
        attention_fixture()
