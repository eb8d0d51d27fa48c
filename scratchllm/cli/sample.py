"""python -m scratchllm sample: generate text from a checkpoint, one token at a time, through
the per-layer decoding states (KVState for GQA, RollingKVState for sliding-window attention,
LatentKVState for MLA in the absorbed form, MambaState for Mamba). Text streams as it is
produced. The sampling itself (temperature, top-k, top-p) is scratchllm/lm/sampling.py.
--hf DIR samples a Hugging Face checkpoint directory (config.json, model.safetensors,
tokenizer.json) of a family scratchllm.hub reads (listed below, from its registry); it
stops at the checkpoint's eos_token_id (generation_config.json, else config.json). An
encoder-decoder (t5, switch_transformers) reads the prompt as its source and prints what its
decoder writes.
"""
import sys

import numpy as np

from scratchllm.cli.common import Parser, float_in, int_at_least, run
from scratchllm.hub import FAMILIES, eos_ids, load_pretrained, load_tokenizer
from scratchllm.lm import Seq2SeqLM, generate
from scratchllm.tokenizer import EOT
from scratchllm.train import load_model


def build_parser():
    p = Parser("sample", f"{__doc__}Hugging Face model_types: "
                         f"{', '.join(f.model_type for f in FAMILIES)}.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", help="directory written by train")
    src.add_argument("--hf", help="Hugging Face checkpoint directory (config.json, "
                     "model.safetensors, tokenizer.json)")
    p.add_argument("--prompt", default="", help="text to continue (default: a new document)")
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
    return p


def main(argv=None):
    return run("sample", _sample, build_parser().parse_args(argv))


def _sample(args):
    if args.hf:
        model, tok, stop = load_pretrained(args.hf), load_tokenizer(args.hf), eos_ids(args.hf)
        if not args.prompt and EOT not in tok.special_tokens:
            raise ValueError(f"--prompt is needed: the tokenizer of {args.hf} has no {EOT} "
                             f"to start a document with")
    else:
        (model, tok, _), stop = load_model(args.checkpoint), ()
    if not isinstance(model, Seq2SeqLM):  # a continuation follows its prompt
        sys.stdout.write(args.prompt)
    for piece in generate(model, tok, args.prompt, args.max_tokens,
                          np.random.default_rng(args.seed), temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p,
                          allow_special=args.allow_special, stop_ids=stop):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
