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


def assert_names_round_trip(family, model):
    """family.names(model, model.cfg) names every Param once under distinct HF names, and
    writing each Param out and reading it back (layout.to_hf, from_hf) restores it exactly."""
    from scratchllm.hub.layout import from_hf, to_hf
    table = family.names(model, model.cfg)
    assert len({e.hf for e in table}) == len(table)
    arrays = {n: p.data for n, p in model.named_parameters()}
    assert sorted(lib for e in table for lib in e.lib) == sorted(arrays)
    restored = {n: np.zeros_like(a) for n, a in arrays.items()}
    for e in table:
        from_hf(e, to_hf(e, arrays), restored)
    assert all(np.array_equal(restored[n], a) for n, a in arrays.items())
