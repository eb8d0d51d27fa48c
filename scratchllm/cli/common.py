"""What every command shares: its parser, its error prefix and its exit codes.

    usage error (unknown flag, missing argument)   exit 2   "scratchllm COMMAND: ..."
    runtime error (bad file, bad value, bad data)  exit 1   "scratchllm COMMAND: ..."
    Ctrl-C outside a training loop                 exit 130
    any error on one rank of an MPI job            exit 1 (the whole job, never a hang)
                                                   "scratchllm COMMAND: rank R of N: ..."
"""
import argparse
import math
import sys
import traceback

RUNTIME_ERRORS = (ValueError, TypeError, OSError)  # CheckpointError is a ValueError


class Parser(argparse.ArgumentParser):
    """argparse for `python -m scratchllm COMMAND`: usage errors exit 2 with the prefix."""

    def __init__(self, command=None, description=None, **kwargs):
        if command is not None:  # (sub-commands' parsers come from argparse with a prog)
            kwargs.setdefault("prog", f"python -m scratchllm {command}")
        super().__init__(description=description,
                         formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)
        self.command = command or self.prog.removeprefix("python -m scratchllm ")

    def error(self, message):
        self.print_usage(sys.stderr)
        self.exit(2, f"scratchllm {self.command}: {message}\n")


def int_at_least(low):
    """An argparse `type`: an integer >= low, else a usage error (exit 2) naming the flag."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return parse


def float_in(low, high, *, open_low=False):
    """An argparse `type`: a finite number in [low, high] ((low, high] with open_low)."""
    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        below = value <= low if open_low else value < low
        if not math.isfinite(value) or below or value > high:
            raise argparse.ArgumentTypeError(
                f"must be a finite number in {'(' if open_low else '['}{low}, {high}], got "
                f"{text}")
        return value
    return parse


LR = float_in(0, 1, open_low=True)  # a peak learning rate: AdamW moves a weight ~lr per step


def run(command, body, args):
    """body(args) -> exit code, with runtime errors printed as `scratchllm COMMAND: ...`
    (exit 1) and Ctrl-C as exit 130."""
    try:
        return body(args)
    except RUNTIME_ERRORS as e:
        print(f"scratchllm {command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nscratchllm {command}: interrupted", file=sys.stderr)
        return 130


def run_on_ranks(command, body, args, world):
    """body(args) -> exit code on every rank of an MPI job (world: a dist.Group). An exception
    on any rank prints `scratchllm COMMAND: rank R of N: ...` (with the traceback when it is
    not a runtime error) and aborts the whole job with exit 1, so no rank waits forever in a
    collective for one that died."""
    try:
        return body(args)
    except (Exception, KeyboardInterrupt) as e:
        if not isinstance(e, RUNTIME_ERRORS + (KeyboardInterrupt,)):
            traceback.print_exc()
        what = "interrupted" if isinstance(e, KeyboardInterrupt) else str(e)
        print(f"scratchllm {command}: rank {world.rank} of {world.size}: {what}",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        world.abort(1)
        return 1


def print_results(results):
    """One PASS/FAIL line per check result (name, passed, detail), then "n/m checks pass"
    without its newline (the caller may add to it); returns n."""
    for r in results:
        print(f"{'PASS' if r.passed else 'FAIL'}  {r.name}" + (f"  ({r.detail})" if r.detail else ""))
    n_pass = sum(r.passed for r in results)
    print(f"\n{n_pass}/{len(results)} checks pass", end="")
    return n_pass
