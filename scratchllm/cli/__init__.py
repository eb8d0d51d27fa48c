"""python -m scratchllm COMMAND ...: one module per command, argparse and printing only.

Each command module exposes `main(argv) -> int` with its own parser (common.Parser); a module
is imported only when its command runs. Exit codes and error messages are uniform
(common.py): usage errors exit 2, runtime errors 1, both as `scratchllm COMMAND: ...`.
"""
import importlib
import sys

COMMANDS = {
    "train": ("scratchllm.cli.train", "train a small language model (the default demo)"),
    "sample": ("scratchllm.cli.sample", "generate text from a checkpoint"),
    "finetune": ("scratchllm.cli.finetune", "fine-tune a Hugging Face checkpoint on a text file"),
    "compare": ("scratchllm.cli.compare", "train the presets on the same tokens and compare them"),
    "bpe": ("scratchllm.cli.bpe", "train a byte-level BPE tokenizer or encode a file"),
    "size": ("scratchllm.cli.size", "parameters, FLOPs and KV-cache bytes of a real model"),
    "drill": ("scratchllm.cli.drill", "retype a backward by hand and check it"),
    "exercise": ("scratchllm.cli.exercise", "the chapters' exercises: statement, hint, checks"),
    "notebooks": ("scratchllm.cli.notebooks", "the notebooks, executed, as HTML pages"),
    "experiment": ("scratchllm.cli.experiment", "the chapters' claims measured: list, run NAME"),
    "embed": ("scratchllm.cli.embed", "train a tiny embedding model, print retrieval accuracy"),
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
