"""Images -> Qwen2-VL's pixel_values and image_grid_thw (transformers' Qwen2VLImageProcessor,
PIL backend), in NumPy and Pillow:

    RGB, rescale, normalise   as preprocess.py does them (the spec's `image`)
    smart resize  to (h, w), each a multiple of f = patch_size * merge_size:
                  h = round(H / f) f, w = round(W / f) f; if h w > max_pixels,
                  b = sqrt(H W / max_pixels), h = max(f, floor(H / b / f) f) (w likewise);
                  if h w < min_pixels, b = sqrt(min_pixels / (H W)), h = ceil(H b / f) f
    patches       (C, h, w) -> (gh/m, gw/m, m, m, C, T, P, P) rows of C*T*P*P, gh = h/P,
                  the frame repeated T = temporal_patch_size times (a still image is a video
                  of T equal frames; Conv3d then sees T copies), each merge_size x merge_size
                  group of patches consecutive (the order the patch merger gathers them)
giving pixel_values (sum of gh*gw, C*T*P*P) float32 and image_grid_thw (n_images, 3) int64,
rows (1, gh, gw). Python's round() halves to even, as transformers' does.
Reference: huggingface/transformers
src/transformers/models/qwen2_vl/image_processing_pil_qwen2_vl.py (smart_resize, patchify).

Glossary: H, W the image's size, h, w resized, f factor, P patch side, m merge size,
T temporal patch size, C channels, gh, gw the patch grid.
"""
import math
from dataclasses import replace

import numpy as np

from scratchllm.specs.vision import SmartResizeSpec
from scratchllm.vision.preprocess import open_image, preprocess_image, to_rgb


def smart_resize(height, width, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280):
    """(h, w): multiples of factor, min_pixels <= h w <= max_pixels, near height / width."""
    if min(height, width) < 1 or max(height, width) / min(height, width) > 200:
        raise ValueError(f"smart_resize: an image of {height} x {width} pixels has an aspect "
                         f"ratio over 200 (or no pixels); expected at most 200")
    h, w = round(height / factor) * factor, round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def flatten_patches(x, spec):
    """(C, h, w) float -> (rows (gh*gw, C*T*P*P) float32, (1, gh, gw)), h, w multiples of
    P*m: each patch repeated T times, merge groups consecutive."""
    P, m, T = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    C, h, w = x.shape
    if h % (P * m) or w % (P * m):
        raise ValueError(f"flatten_patches: the image is {h} x {w}, expected multiples of "
                         f"patch_size * merge_size = {P * m}")
    gh, gw = h // P, w // P
    p = np.asarray(x, np.float32).reshape(C, gh // m, m, P, gw // m, m, P)
    p = p.transpose(1, 4, 2, 5, 0, 3, 6)  # (gh/m, gw/m, m, m, C, P, P)
    p = np.broadcast_to(p[:, :, :, :, :, None], p.shape[:5] + (T,) + p.shape[5:])
    return p.reshape(gh * gw, C * T * P * P), (1, gh, gw)  # (N, C*T*P*P)


def preprocess_patches(images, spec):
    """images (PIL images or paths, any sizes) -> (pixel_values (N, C*T*P*P) float32,
    image_grid_thw (n_images, 3) int64), the inputs a Qwen2-VL model's forward takes."""
    # optional dependency: Pillow (matplotlib's, and the test extra's)
    from PIL import Image
    if not isinstance(spec, SmartResizeSpec):
        raise TypeError(f"preprocess_patches: spec must be a SmartResizeSpec, got "
                        f"{type(spec).__name__}")
    plain = replace(spec.image, do_resize=False, do_convert_rgb=False)
    rows, grids = [], []
    for image in images:
        im = open_image(image)
        x = np.array(to_rgb(im) if spec.image.do_convert_rgb else im)  # (H, W[, C]) uint8
        if spec.image.do_resize:
            factor = spec.patch_size * spec.merge_size
            h, w = smart_resize(x.shape[0], x.shape[1], factor, spec.min_pixels,
                                spec.max_pixels)
            x = np.array(Image.fromarray(x).resize((w, h), resample=spec.image.resample))
        r, grid = flatten_patches(preprocess_image(Image.fromarray(x), plain), spec)
        rows.append(r)  # (gh*gw, C*T*P*P)
        grids.append(grid)
    return np.concatenate(rows), np.array(grids, dtype=np.int64)
