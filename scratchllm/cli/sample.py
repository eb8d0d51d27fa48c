"""python -m scratchllm sample: generate text from a checkpoint, one token at a time, through
the per-layer decoding states (KVState for GQA, RollingKVState for sliding-window attention,
LatentKVState for MLA in the absorbed form, MambaState for Mamba). Text streams as it is
produced. The sampling itself (temperature, top-k, top-p) is scratchllm/lm/sampling.py.
--hf DIR samples a Hugging Face checkpoint directory (config.json, model.safetensors,
tokenizer.json) of a family scratchllm.hub reads (listed below, from its registry); it
stops at the checkpoint's eos_token_id (generation_config.json, else config.json). An
encoder-decoder (t5, switch_transformers) reads the prompt as its source and prints what its
decoder writes.
--chat "question" sends the question as a conversation through the directory's chat template
(chat_template.jinja or tokenizer_config.json): the ids transformers' apply_chat_template(...,
add_generation_prompt=True) gives, BOS included; what an instruct model expects. The question
stays text: a typed special-token string cannot forge a turn. --prompt sends text as it is.
"""
import sys

import numpy as np

from scratchllm.cli.common import Parser, float_in, int_at_least, run
from scratchllm.cli.images import add_image_argument, bind_images
from scratchllm.hub import FAMILIES, eos_ids, load_pretrained, load_tokenizer
from scratchllm.lm import (Seq2SeqLM, encode_prompt, generate, generate_batch_ids,
                          generate_ids, generates_padded, pad_rows, stream_text)
from scratchllm.tokenizer import EOT, chat_template_of, encode_chat, token_bytes
from scratchllm.train import load_model


def build_parser():
    p = Parser("sample", f"{__doc__}Hugging Face model_types: "
                         f"{', '.join(f.model_type for f in FAMILIES)}.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="directory written by train")
    src.add_argument("--hf", help="Hugging Face checkpoint directory (config.json, "
                     "model.safetensors, tokenizer.json)")
    p.add_argument("--prompt", action="append", default=None,
                   help="text to continue (default: a new document); give it again for more "
                        "prompts: they run as one padded batch (attention_mask), each "
                        "printed after its number, each what it would give alone")
    p.add_argument("--chat", default=None, metavar="TEXT",
                   help="with --hf: send TEXT as a user turn through the checkpoint's chat "
                        "template and print the reply (instruct models)")
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="with --chat: a system turn before the question")
    p.add_argument("--heal", action="store_true",
                   help="token healing: back up over the prompt's last token and let the first "
                        "sampled token be any token that extends it (byte-level and "
                        "SentencePiece tokenizers)")
    p.add_argument("--allow-special", action="store_true",
                   help="encode special-token strings in the prompt (e.g. <|endoftext|>) as "
                        "their ids; by default the prompt is ordinary text")
    p.add_argument("--max-tokens", type=int_at_least(0), default=200,
                   help="tokens to generate (200)")
    p.add_argument("--temperature", type=float_in(0, 1e6), default=0.8, help="0 = greedy (0.8)")
    p.add_argument("--top-k", type=int_at_least(1), default=None,
                   help="keep the k most likely tokens")
    p.add_argument("--top-p", type=float_in(0, 1, open_low=True), default=0.95,
                   help="nucleus mass (0.95)")
    p.add_argument("--seed", type=int_at_least(0), default=None, help="sampling seed")
    add_image_argument(p)
    return p


def main(argv=None):
    return run("sample", _sample, build_parser().parse_args(argv))


def _chat_prompt(args, tok, template, specials):
    if not template:
        raise ValueError(f"--chat: {args.hf} has no chat template (neither chat_template.jinja "
                         f"nor a chat_template in tokenizer_config.json); use --prompt")
    messages = [{"role": "system", "content": args.system}] if args.system else []
    return encode_chat(tok, template, messages + [{"role": "user", "content": args.chat}],
                       specials=specials)


def _sample(args):
    prompts, args.prompt = args.prompt or [""], (args.prompt or [""])[0]
    if len(prompts) > 1 and (args.chat is not None or args.heal or args.image):
        raise ValueError("several --prompt values run as one batch, which takes neither "
                         "--chat, --heal nor --image; give one --prompt for those")
    if args.chat is not None and (not args.hf or args.prompt):
        raise ValueError("--chat needs --hf DIR and no --prompt (it sends the question through "
                         "the checkpoint's chat template)")
    if args.system is not None and args.chat is None:
        raise ValueError("--system goes with --chat")
    template, specials = None, {}
    if args.hf:
        model, tok, stop = load_pretrained(args.hf), load_tokenizer(args.hf), eos_ids(args.hf)
        template, specials = chat_template_of(args.hf)
        if not args.prompt and args.chat is None and EOT not in tok.special_tokens:
            raise ValueError(f"--prompt is needed: the tokenizer of {args.hf} has no {EOT} "
                             f"to start a document with")
    else:
        (model, tok, _), stop = load_model(args.checkpoint), ()
    if args.image:  # a vision-language checkpoint: the images' tokens, then the prompt's
        model, prompt = bind_images(args, model, tok, (template, specials))
    else:
        prompt = _chat_prompt(args, tok, template, specials) if args.chat is not None else \
            args.prompt
    if len(prompts) > 1:
        return _sample_batch(args, model, tok, prompts, stop)
    if args.heal and token_bytes(tok) is None:
        raise ValueError(f"--heal: the {type(getattr(tok, 'inner', tok)).__name__} tokenizer "
                         f"does not expose its tokens' bytes (byte-level and SentencePiece "
                         f"tokenizers do)")
    if args.chat is None and not isinstance(model, Seq2SeqLM):  # a continuation follows
        sys.stdout.write(args.prompt)                             # its prompt
    pieces = 0
    for piece in generate(model, tok, prompt, args.max_tokens,
                          np.random.default_rng(args.seed), temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p, heal=args.heal,
                          allow_special=args.allow_special, stop_ids=stop):
        sys.stdout.write(piece)
        sys.stdout.flush()
        pieces += 1
    sys.stdout.write("\n")
    if pieces == 0 and args.max_tokens > 0:
        hint = (f" {args.hf} has a chat template: an instruct model answers a conversation, "
                f"so try --chat \"...\" instead of --prompt." if template and args.chat is None
                else "")
        print(f"sample: nothing was generated: the first sampled token was an end-of-sequence "
              f"id (stop ids {sorted(set(stop))}).{hint}", file=sys.stderr)
    return 0


def _sample_batch(args, model, tok, prompts, stop):
    """Several prompts as one padded batch (lm.generate_batch_ids: a decoder's rows padded
    on the left, an encoder-decoder's sources on the right, as transformers' tokenizers pad
    them; a model whose states take no padded batch, one prompt after another); every row
    draws from its own Generator seeded with --seed, so each prints what `sample` with that
    prompt alone prints."""
    rows = [encode_prompt(model, tok, text, args.allow_special) for text in prompts]
    seq2seq = isinstance(model, Seq2SeqLM)
    stop_ids = {tok.special_tokens.get(EOT), *stop} - {None}
    sampling = dict(stop_ids=stop_ids, temperature=args.temperature, top_k=args.top_k,
                    top_p=args.top_p)
    if seq2seq or generates_padded(model):
        ids, mask = pad_rows(rows, left=not seq2seq,
                             pad_id=getattr(model.cfg, "pad_id", None) or 0)
        out = generate_batch_ids(model, ids, mask, args.max_tokens,
                                 [np.random.default_rng(args.seed) for _ in rows], **sampling)
    else:  # a hybrid or another recurrence: one prompt after another
        out = [list(generate_ids(model, row, args.max_tokens,
                                 np.random.default_rng(args.seed), **sampling))
               for row in rows]
    for b, (text, row, new) in enumerate(zip(prompts, rows, out), 1):
        shown = "".join(stream_text(tok, new, () if seq2seq else row[-1:]))
        print(f"[{b}] {shown}" if seq2seq else f"[{b}] {text}{shown}")
    return 0
