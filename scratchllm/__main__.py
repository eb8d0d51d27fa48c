"""python -m scratchllm COMMAND ...: the command-line entry point (scratchllm.cli)."""
import sys

from scratchllm.cli import main

if __name__ == "__main__":
    sys.exit(main())
