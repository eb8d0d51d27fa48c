"""python -m grads [NAME ...] [--list] [--mpi P]: run the registered gradient checks, print one
table, exit 1 if any check FAILs. --mpi P runs the distributed check of the collectives on P
ranks instead (`mpiexec -n P python -m grads.mpi`; needs the dist extra)."""
import argparse
import subprocess
import sys
import time
import zlib

import numpy as np

from grads.cases import CASES
from grads.check import Report, format_table


def run_case(name):
    """Run one case with an rng seeded by its name; always a list of Reports."""
    result = CASES[name](np.random.default_rng(zlib.crc32(name.encode())))
    return [result] if isinstance(result, Report) else list(result)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m grads", description=__doc__)
    parser.add_argument("names", nargs="*", help="cases to run (default: all)")
    parser.add_argument("--list", action="store_true", help="name the registered cases")
    parser.add_argument("--mpi", type=int, metavar="P", help="the distributed check of the "
                        "collectives on P ranks (mpiexec)")
    args = parser.parse_args(argv)
    if args.mpi:
        return subprocess.call(["mpiexec", "-n", str(args.mpi), sys.executable, "-m",
                                "grads.mpi"] + (["--directions", "2"] if args.mpi > 2 else []))
    if args.list:
        print("\n".join(CASES))
        return 0
    unknown = [n for n in args.names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    rows, start = [], time.perf_counter()
    for name in args.names or list(CASES):
        for report in run_case(name):
            label = f"{name} ({report.label})" if report.label else name
            rows += [(label, row) for row in report.rows]
    print(format_table(rows))
    n_fail = sum(row.status == "FAIL" for _, row in rows)
    n_kink = sum(row.status == "kink" for _, row in rows)
    print(f"\n{len(rows)} rows: {len(rows) - n_fail - n_kink} ok, {n_kink} kink, {n_fail} FAIL "
          f"in {time.perf_counter() - start:.1f} s")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
