"""The parallel (Blelloch) scan against the sequential scan and a hand loop; its backward
against the reverse-time adjoint loop; the selective scan on it against the Numba scan, and a
model whose Mamba layers run on it (MambaSpec.scan) against the same model on the time loop."""
import numpy as np
import pytest

from scratchllm.lm import LM
from scratchllm.specs import MambaSpec, from_dict, from_flat, preset, to_dict
from scratchllm.specs.unflat import to_flat
from scratchllm.ssm import (associative_scan_backward, associative_scan_forward,
                            associative_scan_forward_ref, selective_scan_assoc_backward,
                            selective_scan_assoc_forward, selective_scan_backward,
                            selective_scan_forward)


@pytest.mark.parametrize("T", [1, 2, 3, 7, 8, 9, 33])
def test_blelloch_equals_sequential(T):
    rng = np.random.default_rng(T)
    a, b = rng.uniform(-1, 1, (2, T, 3, 2)), rng.standard_normal((2, T, 3, 2))
    h, _ = associative_scan_forward(a, b)
    h_ref = np.zeros_like(b)
    prev = np.zeros_like(b[:, 0])
    for t in range(T):  # h_t = a_t h_{t-1} + b_t written out
        prev = a[:, t] * prev + b[:, t]
        h_ref[:, t] = prev
    np.testing.assert_allclose(h, h_ref, rtol=0, atol=1e-13)
    np.testing.assert_allclose(associative_scan_forward_ref(a, b)[0], h_ref, rtol=0, atol=0)


def test_backward_is_the_adjoint_loop():
    rng = np.random.default_rng(1)
    a, b, dh = (rng.uniform(-1, 1, (2, 10, 3)), rng.standard_normal((2, 10, 3)),
                rng.standard_normal((2, 10, 3)))
    h, cache = associative_scan_forward(a, b)
    g = associative_scan_backward(dh, cache)
    lam, want_a, want_b = np.zeros_like(dh[:, 0]), np.empty_like(a), np.empty_like(b)
    for t in reversed(range(10)):
        lam = dh[:, t] + (a[:, t + 1] * lam if t + 1 < 10 else 0)
        want_b[:, t] = lam
        want_a[:, t] = lam * (h[:, t - 1] if t else 0)
    np.testing.assert_allclose(g["a"], want_a, atol=1e-13)
    np.testing.assert_allclose(g["b"], want_b, atol=1e-13)


def test_selective_scan_on_the_parallel_scan_equals_the_numba_scan():
    rng = np.random.default_rng(2)
    batch, T, d, N = 2, 19, 5, 3
    args = (rng.standard_normal((batch, T, d)), rng.uniform(0.05, 1.0, (batch, T, d)),
            -rng.uniform(0.2, 2.0, (d, N)), rng.standard_normal((batch, T, N)),
            rng.standard_normal((batch, T, N)), rng.standard_normal(d))
    y, cache = selective_scan_assoc_forward(*args)
    y_ref, cache_ref = selective_scan_forward(*args)
    np.testing.assert_allclose(y, y_ref, atol=1e-12)
    dy = rng.standard_normal(y.shape)
    g, g_ref = selective_scan_assoc_backward(dy, cache), selective_scan_backward(dy, cache_ref)
    for name in g_ref:
        np.testing.assert_allclose(g[name], g_ref[name], atol=1e-11, err_msg=name)


def test_a_model_on_the_associative_scan_equals_the_sequential_scan():
    small = dict(vocab_size=23, d_model=8, n_heads=2, n_kv_heads=1, d_ff=16, d_state=3,
                 n_layers=3, layer_pattern="MAM")
    models = {}
    for scan in ("sequential", "associative"):
        cfg = preset("hybrid", **small, mamba_scan=scan)
        assert [layer.mixer.scan for layer in cfg.layers if isinstance(layer.mixer, MambaSpec)] \
            == [scan, scan]
        assert from_dict(to_dict(cfg)) == cfg and from_flat(**to_flat(cfg)) == cfg
        models[scan] = LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)
    block = models["associative"].layers[0].mixer  # the option reaches the layer's scan
    assert type(block.forward(np.zeros((1, 2, 8)))[1].scan).__name__ == "SelectiveAssocCache"
    ids = np.random.default_rng(1).integers(0, 23, (2, 9))
    out = {}
    for scan, model in models.items():
        logits, _ = model.forward(ids)
        loss, cache = model.loss(ids[:, :-1], ids[:, 1:])
        model.loss_backward(1.0, cache)
        out[scan] = logits, {n: p.grad for n, p in model.named_parameters()}
    (logits, grads), (logits_ref, grads_ref) = out["associative"], out["sequential"]
    np.testing.assert_allclose(logits, logits_ref, rtol=0, atol=1e-10)
    assert grads.keys() == grads_ref.keys() and any("A_log" in n for n in grads)
    for name in grads_ref:
        np.testing.assert_allclose(grads[name], grads_ref[name], rtol=0, atol=1e-10,
                                   err_msg=name)
    with pytest.raises(ValueError, match="scan"):
        MambaSpec(scan="blelloch")


def test_shape_and_dtype_errors():
    with pytest.raises(ValueError, match="b"):
        associative_scan_forward(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(TypeError, match="associative_scan_forward: b must be a float array"):
        associative_scan_forward(np.ones((2, 3)), np.ones((2, 3), np.int64))
    assert associative_scan_forward(np.ones((2, 3)), np.ones((2, 3), np.float32))[0].dtype \
        == np.float64  # mixed float dtypes compute in the common one
    _, cache = associative_scan_forward(np.ones((2, 3)), np.ones((2, 3)))
    with pytest.raises(ValueError, match="dh"):
        associative_scan_backward(np.ones((2, 4)), cache)
