"""python -m scratchllm bpe train|encode: train a byte-level BPE tokenizer, or encode a file.

    python -m scratchllm bpe train corpus.txt --vocab-size 10000 --special "<|endoftext|>" -o tok/
    python -m scratchllm bpe encode -t tok/ corpus.txt            # ids, space-separated
    python -m scratchllm bpe encode -t tok/ corpus.txt --stats    # tokens, bytes/token, MB/s
    python -m scratchllm bpe encode -t tok/ corpus.txt --allow-special   # "<|endoftext|>" -> id

`encode` treats the file as ordinary text (a special-token string in it is encoded as plain
text, never as the control token) unless --allow-special is given.

`train` writes DIR/tokenizer.bpe (our text format, see scratchllm/tokenizer/gpt2.py) and
DIR/tokenizer.tiktoken.
"""
import os
import sys
import time

from scratchllm.cli.common import Parser, run
from scratchllm.tokenizer import TOKENIZER_FILE, Tokenizer, train_bpe


def _parser():
    parser = Parser("bpe", __doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train on a UTF-8 text file")
    tr.add_argument("file")
    tr.add_argument("--vocab-size", type=int, required=True,
                    help="256 bytes + merges + special tokens")
    tr.add_argument("--special", nargs="*", default=[], metavar="TOK",
                    help='special tokens, e.g. "<|endoftext|>"')
    tr.add_argument("--pattern", default="gpt2", help="gpt2, cl100k, o200k, llama3 or a regex")
    tr.add_argument("--workers", type=int, default=None, help="pre-tokenizer processes")
    tr.add_argument("-o", "--out", required=True, metavar="DIR")
    en = sub.add_parser("encode", help="encode a UTF-8 text file")
    en.add_argument("-t", "--tokenizer", required=True, metavar="DIR",
                    help=f"a directory written by train (or a {TOKENIZER_FILE} file)")
    en.add_argument("file")
    en.add_argument("--pattern", default=None, help="trust this custom pattern (the file's own "
                    "must equal it; gpt2 and cl100k need no flag)")
    en.add_argument("--workers", type=int, default=None)
    en.add_argument("--stats", action="store_true", help="print counts and speed, not ids")
    en.add_argument("--allow-special", action="store_true",
                    help="encode special-token strings in the file as their ids (default: "
                         "as ordinary text)")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    return run(f"bpe {args.command}", _train if args.command == "train" else _encode, args)


def _train(args):
    start = time.perf_counter()
    vocab, merges = train_bpe(args.file, args.vocab_size, args.special, args.pattern,
                              workers=args.workers, progress=True)
    tok = Tokenizer(vocab, merges, args.special, args.pattern)
    os.makedirs(args.out, exist_ok=True)
    tok.save(os.path.join(args.out, TOKENIZER_FILE))
    tok.save_tiktoken(os.path.join(args.out, "tokenizer.tiktoken"))
    print(f"{len(vocab)} tokens ({len(merges)} merges) in {time.perf_counter() - start:.2f} s "
          f"-> {args.out}/{TOKENIZER_FILE}, tokenizer.tiktoken")
    return 0


def _encode(args):
    tok = Tokenizer.load(args.tokenizer, allow_pattern=args.pattern)
    start = time.perf_counter()
    ids = tok.encode_file(args.file, workers=args.workers, disallowed_special=(),
                          allowed_special="all" if args.allow_special else ())
    seconds = time.perf_counter() - start
    if not args.stats:
        sys.stdout.write(" ".join(map(str, ids.tolist())) + "\n")
        return 0
    size = os.path.getsize(args.file)
    print(f"tokens {len(ids)}  bytes {size}  bytes/token {size / max(len(ids), 1):.3f}  "
          f"{size / seconds / 1e6:.2f} MB/s")
    return 0
