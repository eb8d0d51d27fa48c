"""Benchmarks for issue 6: state-space models (float32, medians, side by side in one run).

Run serialised with other helpers:
    flock /tmp/scratchllm-bench.lock python benchmarks/bench_ssm.py [NAME ...]

Each benchmark is a function `bench_NAME() -> None` that prints its own table; `BENCHMARKS`
lists them in order. With no arguments every benchmark runs; otherwise only the named ones.

Sections:
- LTI (ssm.py): fft_conv vs causal_conv_ref over T; S4D fwd+bwd vs a PyTorch autograd twin.
- selective scan (scan.py): added by the scan.py helper below its marker.
"""
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import numpy as np  # noqa: E402


def median_time(fn, repeats=5, warmup=1):
    """Median wall time in seconds of `fn()` over `repeats` runs after `warmup` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


# --- LTI state-space (ssm.py) ---


# --- selective scan (scan.py) ---


BENCHMARKS = [
    # LTI (ssm.py)
    # selective scan (scan.py)
]


def main(argv=None):
    names = sys.argv[1:] if argv is None else argv
    todo = [b for b in BENCHMARKS if not names or b.__name__.removeprefix("bench_") in names]
    for bench in todo:
        print(f"\n## {bench.__name__}")
        bench()
    return 0


if __name__ == "__main__":
    sys.exit(main())
