"""What the tests that train under mpiexec share: the arguments of a short float64 run and the
comparison of two checkpoints' models (the fixtures `small` and `one` are conftest.py's)."""
from pathlib import Path

import numpy as np

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "python-docs-slice.txt"


def train_args(data, out, *extra):
    """`train` flags for 3 steps of 5 x 16 tokens of the dense preset (not the first run's
    narrower model; an --preset in `extra` comes later and wins) in float64 on `data`, written
    to `out`."""
    return ["--preset", "dense", "--data", str(data), "--batch-size", "5", "--seq-len", "16",
            "--steps", "3",
            "--dtype", "float64", "--eval-every", "100", "--no-progress", "--out", str(out),
            *extra]


def max_rel(a, b):
    """max over Params of max|a - b| / max|b|, and the same for the buffers (MoE biases)."""
    rel = max(np.abs(p.data - q.data).max() / np.abs(q.data).max()
              for p, q in zip(a.parameters(), b.parameters()))
    return rel, max([np.abs(x - y).max() for (_, x), (_, y) in
                     zip(a.named_buffers(), b.named_buffers())], default=0.0)
