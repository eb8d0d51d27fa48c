"""The fused path (the default) and the readable one (SCRATCHLLM_READABLE=1) compute the same
training step: loss, every gradient and the weights after AdamW agree to 3e-6 (float32) /
1e-12 (float64) for every preset (each op's twins agree to 1e-6, tests/core/test_fused.py;
over a whole model the readable float32 path itself sits up to 1.4e-6 from the float64 result
of the same weights, mla measured); and a float32 step keeps every array float32 (no silent
float64 promotion) in the caches, gradients and optimizer state."""
import numpy as np
import pytest

from grads.cases import LM_TINY, lm_tiny
from scratchllm.core import AdamW, fused
from scratchllm.lm import LM

PRESET_NAMES = ["dense", "moe", "mla", "swa", "hybrid"]
TOL = {np.float32: 3e-6, np.float64: 1e-12}


def train_step(name, dtype, readable, monkeypatch):
    """(loss, {param: grad}, {param: data after one AdamW step}, the step's LossCache)."""
    if readable:
        monkeypatch.setenv("SCRATCHLLM_READABLE", "1")
    else:
        monkeypatch.delenv("SCRATCHLLM_READABLE", raising=False)
    model = LM(lm_tiny(name), rng=np.random.default_rng(0), dtype=dtype)
    rng = np.random.default_rng(1)
    ids, targets = (rng.integers(0, LM_TINY["vocab_size"], (3, 9)) for _ in range(2))
    loss, cache = model.loss(ids, targets)
    model.loss_backward(1.0, cache)
    grads = {n: p.grad.copy() for n, p in model.named_parameters()}
    opt = AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    opt.step()
    return float(loss), grads, {n: p.data for n, p in model.named_parameters()}, cache, opt


def rel_err(a, b):
    return np.max(np.abs(a.astype(np.float64) - b)) / max(np.max(np.abs(b)), 1e-30)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_fused_and_readable_paths_agree(name, dtype, monkeypatch):
    loss, grads, after, cache, _ = train_step(name, dtype, False, monkeypatch)
    loss_r, grads_r, after_r, cache_r, _ = train_step(name, dtype, True, monkeypatch)
    assert isinstance(cache.ce_cache.cache, fused.FusedCrossEntropyCache)
    assert not isinstance(cache_r.ce_cache.cache, fused.FusedCrossEntropyCache)
    assert abs(loss - loss_r) <= TOL[dtype] * abs(loss_r)
    bad = {n: rel_err(grads[n], grads_r[n]) for n in grads
           if rel_err(grads[n], grads_r[n]) >= TOL[dtype]}
    assert bad == {}
    bad = {n: rel_err(after[n], after_r[n]) for n in after
           if rel_err(after[n], after_r[n]) >= TOL[dtype]}
    assert bad == {}


def float_arrays(obj, path="cache"):
    """(path, array) of every floating-point array inside nested tuples, lists and dicts."""
    if isinstance(obj, np.ndarray):
        return [(path, obj)] if np.issubdtype(obj.dtype, np.floating) else []
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (tuple, list)):
        items = zip(getattr(obj, "_fields", range(len(obj))), obj)
    else:
        return []
    return [found for key, item in items for found in float_arrays(item, f"{path}.{key}")]


@pytest.mark.parametrize("readable", [False, True], ids=["fused", "readable"])
@pytest.mark.parametrize("name", PRESET_NAMES)
def test_a_float32_step_makes_no_float64_array(name, readable, monkeypatch):
    _, grads, after, cache, opt = train_step(name, np.float32, readable, monkeypatch)
    arrays = (float_arrays(cache) + float_arrays(grads, "grad") + float_arrays(after, "param")
              + float_arrays(opt.m, "m") + float_arrays(opt.v, "v"))
    assert len(arrays) > 3 * len(grads)
    assert [(p, a.dtype) for p, a in arrays if a.dtype != np.float32] == []
