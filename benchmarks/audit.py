"""The bad-input audit, re-runnable: each case is a small program run in a forked process.

A segfault or a hang cannot take the audit down; every case is classified as

    clear      ValueError/TypeError whose message starts with the function or command name
    unclear    any other exception, or a message that names nothing ("index 3 is out of ...")
    wrong      a result returned where an error (or another value) is the right answer
    nonfinite  NaN or inf returned where a finite result is the right answer
    hang       no answer within --timeout seconds
    crash      the process died on a signal (segfault)
    ok         the right answer (an expected finite value)

Run it against any checkout:  PYTHONPATH=/path/to/checkout python benchmarks/audit.py
(`--list` prints each case's outcome, `--only NAME...` runs the cases named). This file is
the runner; the cases are the reported reproductions and their categories, by topic in
audit_cases_pairs.py (douts, kernel offsets, empty and mistyped inputs), audit_cases_options.py
(the optimizer, the commands' flags, configs, attention options), audit_cases_numerics.py
(overflow and underflow) and audit_cases_tokenizer.py, and those of audit_extra.py (masks,
decoding states, the Tokenizer's methods, sizes); their `want` says what the right answer is:
ERROR (a clear error), "--flag" (a command's one-line error naming the flag, exit 1 or 2, no
traceback) or the value to return.
"""
import argparse
import multiprocessing as mp
import re
import sys
import traceback
from collections import Counter

import numpy as np

from audit_cases_numerics import NUMERIC_CASES
from audit_cases_options import OPTION_CASES
from audit_cases_pairs import PAIR_CASES
from audit_cases_tokenizer import TOKENIZER_CASES
from audit_common import ERROR
from audit_extra import EXTRA_CASES

CLEAR = re.compile(r"^(scratchllm )?[A-Za-z_][\w.]*( \w+)?: |^\S+ line \d+: |^/")
CASES = PAIR_CASES + OPTION_CASES + NUMERIC_CASES + TOKENIZER_CASES + EXTRA_CASES


# ---------------------------------------------------------------------------- running
def _child(case, conn):
    import contextlib
    import io
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            value = case()
        if isinstance(value, int) and case.__name__.startswith(_CLI_CASES) and value != 0:
            conn.send(("exit", (value, err.getvalue())))  # a command's exit code
        else:
            conn.send(("value", value))
    except SystemExit as e:
        conn.send(("exit", (e.code, err.getvalue())))
    except BaseException as e:  # classify, whatever it is
        conn.send(("raise", (type(e).__name__, str(e), traceback.format_exc(limit=2))))


_CLI_CASES = ("train_", "compare_", "sample_max", "drill_")


def _close(a, b):
    try:
        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        # rtol 5e-3: float16 results (2^-11 relative rounding per entry) count as right
        return a.shape == b.shape and bool(np.allclose(a, b, rtol=5e-3, atol=1e-12))
    except (TypeError, ValueError):
        return False


def _finite(v):
    """False if v, or any array inside a dict / tuple / list v, holds NaN or inf."""
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    if isinstance(v, (tuple, list)) and v and not np.isscalar(v[0]):
        return all(_finite(x) for x in v)
    try:
        return bool(np.isfinite(np.asarray(v, dtype=np.float64)).all())
    except (TypeError, ValueError):
        return True


def classify(kind, payload, want):
    if kind == "raise":
        name, msg, _ = payload
        if isinstance(want, str) and want.startswith("--"):
            return "unclear"  # a command let an exception escape: a traceback
        clear = name in ("ValueError", "TypeError", "CheckpointError", "NonFiniteError",
                         "FileNotFoundError", "MemoryError") and CLEAR.match(msg)
        return "clear" if clear else "unclear"
    if kind == "exit":
        code, err = payload
        last = err.strip().splitlines()[-1] if err.strip() else ""
        one_line = "Traceback" not in err and re.match(r"scratchllm \w+( \w+)?: ", last)
        names = not (isinstance(want, str) and want.startswith("--")) or want in last
        return "clear" if code in (1, 2) and one_line and names else "unclear"
    if isinstance(want, str) and want.startswith("--"):
        return "wrong"  # the command ran instead of refusing the flag
    if want is ERROR:
        return "wrong" if _finite(payload) else "nonfinite"
    if not _finite(payload):
        return "nonfinite"
    return "ok" if _close(payload, want) else "wrong"


def run_case(case, want, timeout):
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(case, child))
    proc.start()
    child.close()
    if not parent.poll(timeout):
        proc.kill()
        proc.join()
        return "hang", [f"no answer in {timeout:.0f} s"]
    try:
        kind, payload = parent.recv()
    except EOFError:
        proc.join()
        return "crash", f"exit code {proc.exitcode}"
    proc.join()
    detail = payload[1] if kind == "raise" else payload if kind == "value" else payload[1]
    return classify(kind, payload, want), str(detail).strip().splitlines()[-1:] or [""]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--list", action="store_true", help="print every case's outcome")
    p.add_argument("--only", nargs="*", help="run only the cases named (or audit_extra's: extra)")
    args = p.parse_args(argv)
    cases = [(c, w) for c, w in CASES if not args.only or c.__name__ in args.only
             or ("extra" in args.only and (c, w) in EXTRA_CASES)]
    counts = Counter()
    for case, want in cases:
        outcome, detail = run_case(case, want, args.timeout)
        counts[outcome] += 1
        if args.list:
            print(f"{outcome:<10} {case.__name__:<28} {str(detail)[:90]}")
    order = ["ok", "clear", "unclear", "wrong", "nonfinite", "hang", "crash"]
    print(f"{len(cases)} cases: " + ", ".join(f"{k} {counts[k]}" for k in order))
    return 0


if __name__ == "__main__":
    sys.exit(main())
