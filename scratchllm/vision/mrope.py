"""M-RoPE positions (Qwen2-VL, Wang et al. 2024, arXiv 2409.12191, section 2.1): each token
gets three positions (temporal, height, width); RopeSpec.mrope_section says which rotary pairs
each of them turns (attention/rope.py).

    text token     all three = p, the running position; p += 1
    image of grid (t, gh, gw), m = merge_size, tokens in row-major (t, gh/m, gw/m) order:
                   (p + ti, p + hi, p + wi) for ti < t, hi < gh/m, wi < gw/m;
                   then p += max(gh, gw) / m
The image's tokens are the (t gh gw / m^2) consecutive image_token_id tokens, images in the
order of image_grid_thw (over the batch, row by row). delta = max position + 1 - T per row:
decoding step T + k of that row is at position T + k + delta in all three rows.
The vision tower's own RoPE is 2-D (vision_rope): a patch at grid (h, w) turns its first
Dh/4 pairs by h * f_j, the next Dh/4 by w * f_j, f_j = theta^(-2j / (Dh/2)), j < Dh/4 (the
same frequencies for both axes); the patches in merge-group order, as dynamic.py lays them.
It is M-RoPE with sections (Dh/4, Dh/4), RopeSpec.axial, over the rows (h, w, h)
(vision_positions; the third row turns nothing).
In the tower each patch attends the patches of its own frame only (frame_ids; one frame per
still image; image_attention_mask: transformers' cu_seqlens as a block-diagonal Mask).
Reference: huggingface/transformers src/transformers/models/qwen2_vl/modeling_qwen2_vl.py
(Qwen2VLModel.get_rope_index, get_vision_position_ids, Qwen2VLVisionRotaryEmbedding);
huggingface/transformers src/transformers/vision_utils.py (get_vision_position_ids).

Glossary: B batch, T tokens, p running position, m spatial merge size.
"""
import numpy as np

from scratchllm.attention.rope import make_rope
from scratchllm.specs.attention import Mask, RopeSpec
from scratchllm.core.validate import expect_int


def mrope_positions(input_ids, image_grid_thw, image_token_id, merge_size=2):
    """input_ids (B, T) ints with the images' placeholder tokens, image_grid_thw
    (n_images, 3) or None -> (positions (3, B, T) int64, deltas (B, 1) int64)."""
    expect_int("mrope_positions", "input_ids", input_ids)
    ids = np.asarray(input_ids)
    if ids.ndim != 2:
        raise ValueError(f"mrope_positions: input_ids has shape {ids.shape}, expected (B, T)")
    grids = _grids("mrope_positions", image_grid_thw, merge_size)
    B, T = ids.shape
    out = np.zeros((3, B, T), np.int64)
    deltas = np.zeros((B, 1), np.int64)
    image = 0
    for b in range(B):
        p, i = 0, 0
        while i < T:
            if ids[b, i] != image_token_id:
                out[:, b, i] = p
                p, i = p + 1, i + 1
                continue
            if image >= len(grids):
                raise ValueError(f"mrope_positions: row {b} has image tokens at {i} beyond the "
                                 f"{len(grids)} images of image_grid_thw")
            t, gh, gw = (int(v) for v in grids[image])
            gh, gw = gh // merge_size, gw // merge_size
            n = t * gh * gw
            if not (ids[b, i:i + n] == image_token_id).all() or i + n > T:
                raise ValueError(f"mrope_positions: image {image} (grid {grids[image].tolist()}) "
                                 f"needs {n} image tokens from row {b}, position {i}")
            ti, hi, wi = np.meshgrid(np.arange(t), np.arange(gh), np.arange(gw), indexing="ij")
            out[:, b, i:i + n] = p + np.stack([ti.ravel(), hi.ravel(), wi.ravel()])  # (3, n)
            p, i, image = p + max(gh, gw), i + n, image + 1
        deltas[b, 0] = out[:, b].max() + 1 - T if T else 0
    if image != len(grids):
        raise ValueError(f"mrope_positions: image_grid_thw has {len(grids)} images, input_ids "
                         f"holds the tokens of {image}")
    return out, deltas


def _grids(fn, image_grid_thw, merge_size):
    grids = np.zeros((0, 3), np.int64) if image_grid_thw is None else np.asarray(image_grid_thw)
    if grids.ndim != 2 or grids.shape[1] != 3 or (grids[:, 1:] % merge_size).any():
        raise ValueError(f"{fn}: image_grid_thw must be (n_images, 3) rows (t, h, w) with h, w "
                         f"multiples of merge_size={merge_size}, got {grids.tolist()}")
    return grids


def vision_positions(image_grid_thw, merge_size=2):
    """The tower's positions of its N = sum(t h w) patches (merge-group order, image by image,
    each frame's (h, w) repeated over its t frames): (3, N) int64 rows (h, w, h), the rows
    axial M-RoPE with sections (Dh/4, Dh/4) reads (the third turns nothing)."""
    grids = _grids("vision_positions", image_grid_thw, merge_size)
    m, rows = merge_size, []
    for t, h, w in grids.tolist():
        hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")  # (h, w)
        hw = np.stack([hh, ww]).reshape(2, h // m, m, w // m, m).transpose(0, 1, 3, 2, 4)
        rows.append(np.tile(hw.reshape(2, h * w), t))  # (2, t h w) merge-group order
    hw = np.concatenate(rows, axis=1) if rows else np.zeros((2, 0), np.int64)  # (2, N)
    return np.concatenate([hw, hw[:1]]).astype(np.int64)  # (3, N)


def vision_rope(image_grid_thw, head_dim, theta=10000.0, merge_size=2):
    """The Rope of the vision tower's N = sum(t h w) patches (vision_positions) with the axial
    frequencies (RopeSpec(theta, mrope_section=(Dh/4, Dh/4), axial=True)); head_dim a
    multiple of 4."""
    if head_dim % 4:
        raise ValueError(f"vision_rope: head_dim must be a multiple of 4 (h and w each turn "
                         f"head_dim/4 pairs), got {head_dim}")
    q = head_dim // 4
    return make_rope(RopeSpec(theta, mrope_section=(q, q), axial=True), head_dim,
                     vision_positions(image_grid_thw, merge_size))


def frame_ids(image_grid_thw):
    """(N,) ints: the frame of each of the tower's N = sum(t h w) patches, counted over all
    images (image i's t frames of h w consecutive rows each): what a patch attends is its own
    frame (transformers' cu_seqlens, one segment per frame)."""
    grids = _grids("frame_ids", image_grid_thw, 1)
    frames = np.repeat(grids[:, 1] * grids[:, 2], grids[:, 0])  # (sum t,) patches per frame
    return np.repeat(np.arange(len(frames)), frames)  # (N,)


def image_attention_mask(image_grid_thw):
    """Mask(array=(1, 1, N, N)) (the whole pattern; no causal order): patch i may attend
    patch j when both belong to the same frame of the same image (frame_ids)."""
    frame = frame_ids(image_grid_thw)  # (N,)
    return Mask(array=(frame[:, None] == frame[None, :])[None, None])
