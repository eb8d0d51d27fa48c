"""What the Hugging Face fixture tests share: the fixtures' folder (written by tools/'s
make_hf_fixtures*.py scripts with transformers), a checkpoint's expected.npz, and the relative
error every comparison with transformers uses."""
from pathlib import Path

import numpy as np

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def expected(name):
    """{name: array} of HF/name/expected.npz (inputs, logits, gradients, greedy ids)."""
    return dict(np.load(HF / name / "expected.npz"))


def rel_err(a, b):
    """max |a - b| / max |b|."""
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))
