"""Shared by the benchmark scripts: run a script's named `bench_NAME` functions."""
import sys


def run_named(benchmarks, argv=None):
    """Run each bench_NAME function whose NAME is in argv (every one when argv is empty)."""
    names = sys.argv[1:] if argv is None else argv
    known = {b.__name__.removeprefix("bench_"): b for b in benchmarks}
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    for name, bench in known.items():
        if not names or name in names:
            print(f"\n## {bench.__name__}")
            bench()
    return 0
