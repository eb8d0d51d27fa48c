"""python -m scratchllm COMMAND ...: the command-line entry point.

Each command lives in its own module, which exposes `main(argv) -> int` with its own argparse
parser (prog "python -m scratchllm COMMAND"); a module is imported only when its command runs.
"""
import importlib
import sys

COMMANDS = {
    "train": ("scratchllm.train", "train a small language model (the default demo)"),
    "sample": ("scratchllm.generate", "generate text from a checkpoint"),
    "compare": ("scratchllm.compare", "train the presets on the same tokens and compare them"),
    "bpe": ("scratchllm.tokenizer.cli", "train a byte-level BPE tokenizer or encode a file"),
    "size": ("scratchllm.accounting", "parameters, FLOPs and KV-cache bytes of a real model"),
    "drill": ("scratchllm.drills", "retype a backward by hand and check it"),
}


def usage():
    lines = ["usage: python -m scratchllm COMMAND [ARGS ...]", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "python -m scratchllm COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"scratchllm: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    return module.main(rest)


if __name__ == "__main__":
    sys.exit(main())
