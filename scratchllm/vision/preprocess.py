"""Images -> pixel_values as a checkpoint's image processor does it (transformers'
ViTImageProcessor, SiglipImageProcessor and CLIPImageProcessor, PIL backend), in NumPy and Pillow:

    RGB       (do_convert_rgb) an image with transparency is composited onto white
    resize    Pillow's Image.resize((width, height), resample) on the uint8 image, to a
              size, or the shorter side to shortest_edge (CLIP)
    crop      (crop_size) the centre (height, width), top = (H - height) // 2
    rescale   x = uint8 * rescale_factor, computed in float64, stored float32
    normalise x = (x - mean_c) / std_c per channel, in float32
giving (B, C, H, W) float32, channels first. The spec comes from the checkpoint's
preprocessor_config.json (image_processor_spec); a step or option the library does not
implement (padding, a longest-edge size) is an error naming it.

Pillow is an optional dependency of this module only (matplotlib brings it; the test extra
names it): it is imported where an image is opened or resized.
Reference: huggingface/transformers src/transformers/image_transforms.py;
huggingface/transformers src/transformers/image_processing_backends.py.

Glossary: B images, C channels, H, W height and width.
"""
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from scratchllm.specs.vision import ImageProcessorSpec, SmartResizeSpec

# image_processor_type -> the class defaults of the fields its config.json may leave out
_CLIP_MEAN, _CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258,
                                                               0.27577711]
PROCESSORS = {
    "ViTImageProcessor": dict(resample=2, do_convert_rgb=False),
    "SiglipImageProcessor": dict(resample=3, do_convert_rgb=True),
    "CLIPImageProcessor": dict(resample=3, do_convert_rgb=True, image_mean=_CLIP_MEAN,
                               image_std=_CLIP_STD, size={"shortest_edge": 224},
                               do_center_crop=True, crop_size={"height": 224, "width": 224}),
    "Gemma3ImageProcessor": dict(resample=2, do_convert_rgb=True)}
_OFF = ("do_pad", "do_reduce_labels", "do_pan_and_scan")  # not implemented: must be off


def image_processor_spec(config):
    """The ImageProcessorSpec of a preprocessor_config.json dict; ValueError naming the
    image_processor_type or the field the library does not implement."""
    kind = config.get("image_processor_type", "ViTImageProcessor").removesuffix("Pil")
    kind = kind.removesuffix("Fast")
    if kind == "Qwen2VLImageProcessor":
        return _smart_resize_spec(config)
    if kind not in PROCESSORS:
        raise ValueError(f"preprocessor_config.json: image_processor_type {kind!r} is not "
                         f"implemented (only {sorted(PROCESSORS)})")
    on = [k for k in _OFF if config.get(k)]
    if on:
        raise ValueError(f"preprocessor_config.json: {on} = True is not implemented")
    config = {**PROCESSORS[kind], **{k: v for k, v in config.items() if v is not None}}
    size = config.get("size", {"height": 224, "width": 224})
    fields = {k: config[k] for k in ("do_resize", "do_rescale", "rescale_factor",
                                     "do_normalize", "resample", "do_convert_rgb")
              if k in config}
    if isinstance(size, dict) and set(size) == {"height", "width"}:
        fields["size"] = (size["height"], size["width"])
    elif isinstance(size, dict) and set(size) == {"shortest_edge"}:
        fields.update(size=None, shortest_edge=size["shortest_edge"])
    else:
        raise ValueError(f"preprocessor_config.json: size = {size!r} is not implemented (only "
                         f"{{'height': H, 'width': W}} or {{'shortest_edge': S}})")
    if config.get("do_center_crop"):
        crop = config.get("crop_size")
        if not isinstance(crop, dict) or set(crop) != {"height", "width"}:
            raise ValueError(f"preprocessor_config.json: crop_size = {crop!r} is not "
                             f"implemented (only {{'height': H, 'width': W}})")
        fields["crop_size"] = (crop["height"], crop["width"])
    for key in ("image_mean", "image_std"):
        if key in config:
            v = config[key]
            fields[key] = tuple(v) if isinstance(v, (list, tuple)) else (v, v, v)
    return ImageProcessorSpec(**fields)


def _smart_resize_spec(config):
    """Qwen2VLImageProcessor's config: min_pixels / max_pixels (or size's shortest_edge /
    longest_edge, which they override), the patch sizes, and the steps of `image`."""
    size = config.get("size") or {}
    default = SmartResizeSpec()
    on = [k for k in _OFF if config.get(k)]
    if on:
        raise ValueError(f"preprocessor_config.json: {on} = True is not implemented")
    fields = {k: config[k] for k in ("do_resize", "do_rescale", "rescale_factor",
                                     "do_normalize", "resample", "do_convert_rgb")
              if config.get(k) is not None}
    for key in ("image_mean", "image_std"):
        if config.get(key) is not None:
            v = config[key]
            fields[key] = tuple(v) if isinstance(v, (list, tuple)) else (v, v, v)
    pixels = {"min_pixels": config.get("min_pixels") or size.get("shortest_edge"),
              "max_pixels": config.get("max_pixels") or size.get("longest_edge")}
    sizes = {k: config[k] for k in ("patch_size", "temporal_patch_size", "merge_size")
             if config.get(k) is not None}
    return replace(default, image=replace(default.image, **fields), **sizes,
                   **{k: v for k, v in pixels.items() if v is not None})


def load_image_processor(path):
    """The ImageProcessorSpec of a checkpoint directory's preprocessor_config.json (a
    SmartResizeSpec for Qwen2-VL's: dynamic.preprocess_patches takes it)."""
    file = Path(path) / "preprocessor_config.json"
    if not file.is_file():
        raise ValueError(f"load_image_processor: {path} has no preprocessor_config.json")
    return image_processor_spec(json.loads(file.read_text(encoding="utf-8")))


def open_image(image):
    """A PIL image from a PIL image or a file path."""
    # optional dependency: Pillow (matplotlib's, and the test extra's)
    from PIL import Image
    if isinstance(image, Image.Image):
        return image
    if isinstance(image, (str, Path)):
        with Image.open(image) as im:
            im.load()
            return im
    raise TypeError(f"preprocess: an image must be a PIL image or a file path, got "
                    f"{type(image).__name__}")


def to_rgb(im):
    """RGB, transparency composited onto white (transformers' convert_to_rgb)."""
    # optional dependency: Pillow (matplotlib's, and the test extra's)
    from PIL import Image
    if "A" in im.getbands() or im.info.get("transparency") is not None:
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, im.convert("RGBA")).convert("RGB")
    return im.convert("RGB")


def _shortest_edge(height, width, edge):
    """(height, width) with the shorter side `edge` and the longer scaled to keep the aspect,
    truncated (transformers' get_resize_output_image_size, default_to_square=False)."""
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(edge * long / short)
    return (new_long, edge) if width <= height else (edge, new_long)


def _center_crop(x, height, width):
    """The centre (height, width) of x (C, H, W): top = (H - height) // 2, left likewise."""
    H, W = x.shape[1:]
    top, left = (H - height) // 2, (W - width) // 2
    if top < 0 or left < 0:
        raise ValueError(f"preprocess: a {H} x {W} image is smaller than crop_size "
                         f"({height}, {width}); padding it is not implemented")
    return x[:, top:top + height, left:left + width]  # (C, height, width)


def preprocess_image(image, spec):
    """One image (a PIL image or a path) -> (C, H, W) float32 as the spec says. As in
    transformers, the image becomes an array first (a palette image: its indices, one
    channel) and is resized as the PIL image of that array."""
    # optional dependency: Pillow (matplotlib's, and the test extra's)
    from PIL import Image
    im = open_image(image)
    x = np.array(to_rgb(im) if spec.do_convert_rgb else im)  # (H, W) or (H, W, C)
    if spec.do_resize:
        height, width = spec.size or _shortest_edge(x.shape[0], x.shape[1], spec.shortest_edge)
        x = np.array(Image.fromarray(x).resize((width, height), resample=spec.resample))
    x = x[None] if x.ndim == 2 else np.moveaxis(x, -1, 0)  # (C, H, W)
    if spec.crop_size is not None:
        x = _center_crop(x, *spec.crop_size)  # (C, h, w)
    if spec.do_rescale:
        x = (x.astype(np.float64) * spec.rescale_factor).astype(np.float32)  # (C, H, W)
    if spec.do_normalize:
        if x.shape[0] != len(spec.image_mean):
            raise ValueError(f"preprocess: the image has {x.shape[0]} channels, image_mean "
                             f"{spec.image_mean} has {len(spec.image_mean)} (do_convert_rgb "
                             f"is {spec.do_convert_rgb})")
        x = x if np.issubdtype(x.dtype, np.floating) else x.astype(np.float32)
        mean = np.asarray(spec.image_mean, x.dtype)[:, None, None]  # (C, 1, 1)
        std = np.asarray(spec.image_std, x.dtype)[:, None, None]  # (C, 1, 1)
        x = (x - mean) / std  # (C, H, W)
    return x


def preprocess(images, spec):
    """images (PIL images or paths; all of one size after resizing) -> pixel_values
    (B, C, H, W), the batch a vision model's forward(pixel_values=...) takes."""
    if isinstance(spec, SmartResizeSpec):
        raise TypeError("preprocess: a SmartResizeSpec (Qwen2-VL) makes rows of patches of "
                        "images of any size: call vision.dynamic.preprocess_patches")
    return np.stack([preprocess_image(im, spec) for im in images])  # (B, C, H, W)
