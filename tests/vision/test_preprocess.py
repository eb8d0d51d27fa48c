"""Images -> pixel_values as transformers' image processors (PIL backend) make them:
tests/fixtures/images/ holds five small PNGs and what ViTImageProcessor (bilinear, 8 x 12, no
RGB conversion), SiglipImageProcessor (bicubic, 12 x 12, RGB over white) and
CLIPImageProcessor (bicubic, shorter side 14, the centre 12 x 12, CLIP's mean and std) gave
for them (tools/make_hf_fixtures_vision.py, with each checkpoint's preprocessor_config.json); the
library's NumPy + Pillow steps give the same float32 arrays, bit for bit."""
import json
from pathlib import Path

import numpy as np
import pytest

from scratchllm.hub import load_pretrained
from scratchllm.specs.vision import ImageProcessorSpec
from scratchllm.vision.preprocess import image_processor_spec, load_image_processor, preprocess

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
IMAGES = FIXTURES / "images"
NAMES = {"vit": ["rgb", "rgb_large"],
         "siglip_vision": ["rgb", "rgb_large", "rgba", "gray", "palette"],
         "clip_vision": ["rgb", "rgb_large", "rgba", "gray", "palette"]}


@pytest.mark.parametrize("family", sorted(NAMES))
def test_pixel_values_equal_transformers(family):
    spec = load_image_processor(FIXTURES / "hf" / family)
    pixel_values = preprocess([IMAGES / f"{n}.png" for n in NAMES[family]], spec)
    want = np.load(IMAGES / "expected.npz")[family]
    assert pixel_values.dtype == np.float32 and pixel_values.shape == want.shape
    assert np.array_equal(pixel_values, want)


def test_the_preprocessed_images_run_through_the_model():
    """A ViT checkpoint and its processor: PNGs in, one row of logits per image out."""
    model = load_pretrained(FIXTURES / "hf" / "vit")
    spec = load_image_processor(FIXTURES / "hf" / "vit")
    logits, _ = model.forward(pixel_values=preprocess(
        [IMAGES / "rgb.png", IMAGES / "rgb_large.png"], spec))
    assert logits.shape == (2, model.cfg.n_labels) and np.isfinite(logits).all()


def test_the_specs_follow_the_config_and_the_class_defaults():
    config = json.loads((FIXTURES / "hf" / "siglip_vision" / "preprocessor_config.json")
                        .read_text())
    assert image_processor_spec(config) == ImageProcessorSpec(
        size=(12, 12), resample=3, do_convert_rgb=True)
    assert image_processor_spec({"image_processor_type": "ViTImageProcessor"}) == \
        ImageProcessorSpec()
    clip = image_processor_spec({"image_processor_type": "CLIPImageProcessor"})
    assert (clip.size, clip.shortest_edge, clip.crop_size, clip.resample) == (
        None, 224, (224, 224), 3)


@pytest.mark.parametrize("config, match", [
    ({"image_processor_type": "BlipImageProcessor"}, "BlipImageProcessor' is not implemented"),
    ({"do_pad": True}, r"\['do_pad'\] = True is not implemented"),
    ({"do_center_crop": True}, "crop_size = None is not implemented"),
    ({"size": {"longest_edge": 224}}, "size = .*longest_edge.* is not implemented"),
    ({"resample": 9}, "resample must be one of")])
def test_what_the_library_does_not_implement_is_named(config, match):
    with pytest.raises(ValueError, match=match):
        image_processor_spec(config)


def test_channels_that_do_not_match_the_mean_are_an_error():
    spec = ImageProcessorSpec(size=(4, 4))  # ViT's: no RGB conversion
    with pytest.raises(ValueError, match="the image has 4 channels"):
        preprocess([IMAGES / "rgba.png"], spec)
