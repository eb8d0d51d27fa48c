"""Images in a prompt: `sample --hf DIR --image PNG [--image PNG2 ...] --prompt TEXT` for a
vision-language checkpoint (llava, qwen2_vl, gemma3). Each image is preprocessed as the
directory's preprocessor_config.json says (vision/preprocess.py; Qwen2-VL's smart resize,
vision/dynamic.py) and stands in the prompt for its image tokens, between the checkpoint's
image start and end ids where config.json names them (vision_start/end_token_id,
boi/eoi_token_index), before the prompt's text; the model's prefill reads the pixels.
"""
from scratchllm.hub import FAMILIES, read_hf_config
from scratchllm.vision import load_image_processor
from scratchllm.vision.vlm import ImageBound, image_block


def add_image_argument(parser):
    parser.add_argument("--image", action="append", default=None, metavar="PNG",
                        help="with --hf DIR of a vision-language checkpoint: an image before "
                             "the prompt's text (repeatable)")


def _image_families():
    return [f.model_type for f in FAMILIES if hasattr(getattr(f, "build", None), "image_inputs")]


def bind_images(args, model, tok):
    """(the model with the images of args.image bound to its prefill, the prompt ids: each
    image's block of ids, then args.prompt's). ValueError naming what does not fit."""
    if not args.hf:
        raise ValueError("--image goes with --hf DIR (a vision-language checkpoint)")
    if not hasattr(model, "image_inputs"):
        raise ValueError(f"--image: {args.hf} ({model.cfg.name}) does not read images; the "
                         f"families that do: {', '.join(_image_families())}")
    if args.chat is not None or args.heal:
        raise ValueError("--image goes with --prompt (the images come before its text); "
                         "--chat and --heal with images are not implemented")
    inputs, counts = model.image_inputs(args.image, load_image_processor(args.hf))
    hf = read_hf_config(args.hf)
    brackets = (hf.get("vision_start_token_id", hf.get("boi_token_index")),
                hf.get("vision_end_token_id", hf.get("eoi_token_index")))
    ids = [i for n in counts for i in image_block(model.cfg.image_token_id, n, brackets)]
    text = tok.encode(args.prompt, allowed_special="all") if args.allow_special else \
        tok.encode_ordinary(args.prompt)
    return ImageBound(model, inputs), ids + list(text)
