"""Images in a prompt: `sample --hf DIR --image PNG [--image PNG2 ...] --prompt TEXT` (or
`--chat TEXT`) for a vision-language checkpoint (llava, qwen2_vl, gemma3). Each image is
preprocessed as the directory's preprocessor_config.json says (vision/preprocess.py; Qwen2-VL's
smart resize, vision/dynamic.py) and stands in the prompt for its image tokens, between the
checkpoint's image start and end ids where config.json names them (vision_start/end_token_id,
boi/eoi_token_index); the model's prefill reads the pixels.
--prompt: the images' blocks, then the text. --chat: the user turn's content is the images
then the text ([{"type": "image"}, ..., {"type": "text", "text": TEXT}], as transformers'
processors send it), rendered by the chat template; the one image token (or image start id)
the template writes per image is expanded to that image's block.
"""
from scratchllm.hub import FAMILIES, read_hf_config
from scratchllm.tokenizer import encode_chat
from scratchllm.vision import load_image_processor
from scratchllm.vision.vlm import ImageBound, image_block


def add_image_argument(parser):
    parser.add_argument("--image", action="append", default=None, metavar="PNG",
                        help="with --hf DIR of a vision-language checkpoint: an image before "
                             "the prompt's text (repeatable)")


def _image_families():
    return [f.model_type for f in FAMILIES if hasattr(getattr(f, "build", None), "image_inputs")]


def bind_images(args, model, tok, chat=None):
    """(the model with the images of args.image bound to its prefill, the prompt ids: each
    image's block of ids, then args.prompt's; or with args.chat the chat template's ids,
    each image's placeholder expanded). chat: (template, specials) of the directory.
    ValueError naming what does not fit."""
    if not args.hf:
        raise ValueError("--image goes with --hf DIR (a vision-language checkpoint)")
    if not hasattr(model, "image_inputs"):
        raise ValueError(f"--image: {args.hf} ({model.cfg.name}) does not read images; the "
                         f"families that do: {', '.join(_image_families())}")
    if args.heal:
        raise ValueError("--image with --heal is not implemented")
    inputs, counts = model.image_inputs(args.image, load_image_processor(args.hf))
    hf = read_hf_config(args.hf)
    brackets = (hf.get("vision_start_token_id", hf.get("boi_token_index")),
                hf.get("vision_end_token_id", hf.get("eoi_token_index")))
    around = [tok.encode_ordinary(t) if t else [] for t in model.IMAGE_AROUND]
    blocks = [image_block(model.cfg.image_token_id, n, brackets, around) for n in counts]
    if args.chat is not None:  # the template writes the image token (between its own
        image = model.cfg.image_token_id  # brackets: Qwen2-VL, LLaVA), or the start id alone
        expand = [(image, [[image] * n for n in counts]), (brackets[0], blocks)]  # (Gemma 3)
        return ImageBound(model, inputs), _chat_ids(args, tok, chat, expand)
    text = tok.encode(args.prompt, allowed_special="all") if args.allow_special else \
        tok.encode_ordinary(args.prompt)
    return ImageBound(model, inputs), [i for b in blocks for i in b] + list(text)


def _chat_ids(args, tok, chat, expand):
    """The chat template's ids of a user turn [images..., text], each image's placeholder
    replaced: expand [(placeholder id, [its ids per image])], tried in order (the image
    token id, whose brackets the template wrote, else the image start id)."""
    template, specials = chat or (None, {})
    if not template:
        raise ValueError(f"--chat: {args.hf} has no chat template (neither chat_template.jinja "
                         f"nor a chat_template in tokenizer_config.json); use --prompt")
    n_images = len(expand[0][1])
    content = [{"type": "image"}] * n_images + [{"type": "text", "text": args.chat}]
    messages = [{"role": "system", "content": args.system}] if args.system else []
    ids = encode_chat(tok, template, messages + [{"role": "user", "content": content}],
                      specials=specials)
    for mark, blocks in expand:
        if mark is not None and ids.count(mark) == n_images:
            out, k = [], 0
            for i in ids:
                out += blocks[k] if i == mark else [i]
                k += i == mark
            return out
    raise ValueError(f"--chat --image: the chat template of {args.hf} did not write one image "
                     f"placeholder (id {expand[0][0]}, or start id {expand[1][0]}) per image "
                     f"({n_images})")
