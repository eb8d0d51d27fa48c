"""python -m scratchllm bpe train|encode: train a byte-level BPE tokenizer, or encode a file.

    python -m scratchllm bpe train corpus.txt --vocab-size 10000 --special "<|endoftext|>" -o tok/
    python -m scratchllm bpe encode -t tok/ corpus.txt            # ids, space-separated
    python -m scratchllm bpe encode -t tok/ corpus.txt --stats    # tokens, bytes/token, MB/s

`train` writes DIR/tokenizer.bpe (our text format, see gpt2.py) and DIR/tokenizer.tiktoken.
"""
import argparse
import os
import sys
import time

from .tokenizer import Tokenizer
from .train import train_bpe


def _parser():
    parser = argparse.ArgumentParser(prog="python -m scratchllm bpe",
                                     description="Byte-level BPE (GPT-2 style) tokenizer.")
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train on a UTF-8 text file")
    tr.add_argument("file")
    tr.add_argument("--vocab-size", type=int, required=True,
                    help="256 bytes + merges + special tokens")
    tr.add_argument("--special", nargs="*", default=[], metavar="TOK",
                    help='special tokens, e.g. "<|endoftext|>"')
    tr.add_argument("--pattern", default="gpt2", help="gpt2, cl100k or a regex")
    tr.add_argument("--workers", type=int, default=None, help="pre-tokenizer processes")
    tr.add_argument("-o", "--out", required=True, metavar="DIR")
    en = sub.add_parser("encode", help="encode a UTF-8 text file")
    en.add_argument("-t", "--tokenizer", required=True, metavar="DIR",
                    help="a directory written by train (or a tokenizer.bpe file)")
    en.add_argument("file")
    en.add_argument("--workers", type=int, default=None)
    en.add_argument("--stats", action="store_true", help="print counts and speed, not ids")
    return parser


def main(argv):
    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        return _encode(args)
    except (OSError, ValueError) as err:
        print(f"python -m scratchllm bpe {args.command}: {err}", file=sys.stderr)
        return 1


def _train(args):
    start = time.perf_counter()
    vocab, merges = train_bpe(args.file, args.vocab_size, args.special, args.pattern,
                              workers=args.workers, progress=True)
    tok = Tokenizer(vocab, merges, args.special, args.pattern)
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, "tokenizer.bpe"))
    tok.save_tiktoken(os.path.join(args.out, "tokenizer.tiktoken"))
    print(f"{len(vocab)} tokens ({len(merges)} merges) in {time.perf_counter() - start:.2f} s "
          f"-> {args.out}/tokenizer.bpe, tokenizer.tiktoken")
    return 0


def _encode(args):
    tok = Tokenizer.load(args.tokenizer)
    start = time.perf_counter()
    ids = tok.encode_file(args.file, workers=args.workers)
    seconds = time.perf_counter() - start
    if not args.stats:
        sys.stdout.write(" ".join(map(str, ids.tolist())) + "\n")
        return 0
    size = os.path.getsize(args.file)
    print(f"tokens {len(ids)}  bytes {size}  bytes/token {size / max(len(ids), 1):.3f}  "
          f"{size / seconds / 1e6:.2f} MB/s")
    return 0
