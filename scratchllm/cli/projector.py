"""`finetune --hf DIR --projector-only --data CAPTIONS.jsonl`: LLaVA's stage 1, feature
alignment (Liu et al. 2023, arXiv 2304.08485, section 4.2): the image encoder and the LM stay
frozen and only the projector between them trains (a vision-language checkpoint's
projector_parameters: LLaVA's two linear layers, Gemma 3's pooled projector, Qwen2-VL's patch
merger), on image-caption pairs.

    CAPTIONS.jsonl    one {"image": PATH, "text": CAPTION} per line (PATH relative to the file),
                      or LLaVA's JSON list of {"image", "conversations"} (the "gpt" turn)
    ids               the image's block of ids (cli/images.py), then the caption's, then eos
    loss              mean next-token cross-entropy over the caption's tokens and eos only
One step: --batch-size pairs drawn at random, each its own forward and backward (rows of one
batch need not be equally long), gradients summed, clipped to norm 1, AdamW (no weight decay)
at --lr with warmup and cosine decay. The images are preprocessed once.
"""
import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from scratchllm.core.ops import cross_entropy_backward, cross_entropy_forward
from scratchllm.core.optim import AdamW, clip_grad_norm, cosine_schedule
from scratchllm.hub import eos_ids, load_pretrained, load_tokenizer, read_hf_config
from scratchllm.vision import load_image_processor
from scratchllm.vision.vlm import image_block

IGNORE_ID = -100


def read_captions(path):
    """[(image path, caption)] of a JSON-lines file of {"image", "text"}, or of LLaVA's own
    JSON list (blip_laion_cc_sbu_558k.json: {"image", "conversations": [{"from": "human",
    ...}, {"from": "gpt", "value": CAPTION}]}; stage 1's "plain" template keeps the image
    and the caption only); image paths relative to the file. ValueError naming the bad
    entry."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        rows = [(k, row) for k, row in enumerate(json.loads(text), start=1)]
    else:
        rows = [(k, line) for k, line in enumerate(text.splitlines(), start=1) if line.strip()]
    pairs = []
    for k, row in rows:
        try:
            row = json.loads(row) if isinstance(row, str) else row
            caption = row["text"] if "text" in row else next(
                t["value"] for t in reversed(row["conversations"]) if t["from"] == "gpt")
            image = path.parent / row["image"]
        except (ValueError, KeyError, TypeError, StopIteration):
            raise ValueError(f"--data {path}: entry {k} must be a JSON object with \"image\" "
                             f"(a path) and \"text\" (its caption), or LLaVA's \"image\" and "
                             f"\"conversations\" with a \"gpt\" turn; got {str(row)[:60]!r}"
                             ) from None
        if not image.is_file():
            raise ValueError(f"--data {path}: entry {k}: no image file {image}")
        pairs.append((image, caption))
    if not pairs:
        raise ValueError(f"--data {path} holds no image-caption pairs")
    return pairs


def caption_example(model, tok, image, caption, context):
    """(forward's keywords for the image, input_ids (1, T), targets (1, T): the next id where
    it is a caption token or eos, IGNORE_ID elsewhere). context: (processor spec, (start, end)
    ids around an image, eos id or None)."""
    spec, brackets, eos = context
    inputs, (n,) = model.image_inputs([image], spec)
    block = image_block(model.cfg.image_token_id, n, brackets,
                        [tok.encode_ordinary(t) if t else [] for t in model.IMAGE_AROUND])
    text = list(tok.encode_ordinary(caption)) + ([] if eos is None else [eos])
    ids = np.array([block + text])  # (1, T)
    targets = np.full(ids.shape, IGNORE_ID)
    targets[0, len(block) - 1:-1] = text  # position t predicts ids[t + 1]
    return inputs, ids, targets


def projector_finetune(args, s):
    """Train the projector of args.hf on args.data's pairs with the Settings s; returns the
    model (everything but the projector as loaded)."""
    if args.resume or args.keep_state or args.param_group or args.freeze_router:
        raise ValueError("--projector-only trains the projector alone in one run: "
                         "--resume, --keep-state, --param-group and --freeze-router do not "
                         "apply")
    model, tok = load_pretrained(args.hf), load_tokenizer(args.hf)
    if not hasattr(model, "projector_parameters"):
        raise ValueError(f"--projector-only: {args.hf} ({model.cfg.name}) is not a "
                         f"vision-language checkpoint (it has no projector)")
    hf, eos = read_hf_config(args.hf), sorted(eos_ids(args.hf))
    context = (load_image_processor(args.hf),
               (hf.get("vision_start_token_id", hf.get("boi_token_index")),
                hf.get("vision_end_token_id", hf.get("eoi_token_index"))),
               eos[0] if eos else None)
    examples = [caption_example(model, tok, image, text, context)
                for image, text in read_captions(args.data)]
    named = model.projector_parameters()
    params = [p for _, p in named]
    opt = AdamW(params, lr=s.lr, weight_decay=0.0)
    rng = np.random.default_rng(s.seed)
    print(f"model: {args.hf} ({model.cfg.name}); training the projector only: "
          f"{sum(p.data.size for p in params):,} parameters ({', '.join(n for n, _ in named)})"
          f"; {len(examples)} image-caption pairs; {s.steps} steps of {s.batch_size}")
    bar = tqdm(range(s.steps), disable=args.no_progress, desc="finetune --projector-only")
    for step in bar:
        model.zero_grad()
        loss = 0.0
        for i in rng.integers(0, len(examples), s.batch_size):
            inputs, ids, targets = examples[i]
            logits, cache = model.forward(input_ids=ids, **inputs)  # (1, T, V)
            ce, c_ce = cross_entropy_forward(logits, targets, IGNORE_ID)
            dlogits = cross_entropy_backward(np.asarray(1 / s.batch_size, logits.dtype), c_ce)
            model.backward(dlogits["logits"], cache, encoder=False)  # the tower is frozen
            loss += float(ce) / s.batch_size
        clip_grad_norm(params, s.clip)
        opt.lr = cosine_schedule(step + 1, s.lr, s.lr / 10, s.warmup, s.steps)
        opt.step()
        bar.set_postfix(loss=f"{loss:.3f}")
    print(f"last step's caption loss {loss:.3f} nats/token")
    return model
