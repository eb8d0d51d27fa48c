"""Modules equal their functional pairs; tied weights accumulate; the parameter tree."""
from types import SimpleNamespace

import numpy as np
import pytest

from scratchllm.core import fused, nn, ops


def _rng():
    return np.random.default_rng(11)


def test_linear_module_equals_the_pair():
    rng = _rng()
    layer = nn.Linear(5, 3, bias=True, rng=rng, dtype=np.float64)
    layer.b.data[...] = rng.standard_normal(3)
    x, dy = rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 4, 3))
    y, cache = layer.forward(x)
    y_ref, cache_ref = ops.linear_forward(x, layer.W.data, layer.b.data)
    np.testing.assert_array_equal(y, y_ref)
    dx = layer.backward(dy, cache)
    g = ops.linear_backward(dy, cache_ref)
    np.testing.assert_array_equal(dx, g["x"])
    np.testing.assert_array_equal(layer.W.grad, g["W"])
    np.testing.assert_array_equal(layer.b.grad, g["b"])


@pytest.mark.parametrize("readable", [True, False], ids=["readable", "fused"])
def test_rmsnorm_and_swiglu_modules_equal_the_pairs(readable, monkeypatch):
    """The Modules run ops' pairs under SCRATCHLLM_READABLE=1, else core/fused.py's twins."""
    monkeypatch.setenv("SCRATCHLLM_READABLE", "1" if readable else "0")
    pairs = ops if readable else SimpleNamespace(**{
        f"{op}_{half}": getattr(fused, f"fused_{op}_{half}")
        for op in ("rmsnorm", "swiglu") for half in ("forward", "backward")})
    rng = _rng()
    norm, ffn = nn.RMSNorm(6, dtype=np.float64), nn.SwiGLU(6, 10, rng=rng, dtype=np.float64)
    norm.g.data[...] = rng.standard_normal(6)
    x, dy = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    h, c1 = norm.forward(x)
    y, c2 = ffn.forward(h)
    h_ref, r1 = pairs.rmsnorm_forward(x, norm.g.data)
    y_ref, r2 = pairs.swiglu_forward(h_ref, ffn.W1.data, ffn.W3.data, ffn.W2.data)
    np.testing.assert_array_equal(y, y_ref)
    dx = norm.backward(ffn.backward(dy, c2), c1)
    g2 = pairs.swiglu_backward(dy, r2)
    g1 = pairs.rmsnorm_backward(g2["x"], r1)
    np.testing.assert_array_equal(dx, g1["x"])
    np.testing.assert_array_equal(norm.g.grad, g1["g"])
    for name in ("W1", "W3", "W2"):
        np.testing.assert_array_equal(getattr(ffn, name).grad, g2[name])


def test_backward_accumulates_until_zero_grad():
    rng = _rng()
    layer = nn.Linear(3, 2, rng=rng, dtype=np.float64)
    x, dy = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    _, cache = layer.forward(x)
    layer.backward(dy, cache)
    once = layer.W.grad.copy()
    layer.backward(dy, cache)
    np.testing.assert_allclose(layer.W.grad, 2 * once)
    layer.zero_grad()
    np.testing.assert_array_equal(layer.W.grad, 0)


class _TiedLM(nn.Module):
    def __init__(self, rng):
        self.embed = nn.Embedding(7, 4, rng=rng, dtype=np.float64)
        self.norm = nn.RMSNorm(4, dtype=np.float64)


def test_tied_weight_used_twice_accumulates_both_gradients():
    rng = _rng()
    model = _TiedLM(rng)
    ids, dlogits = np.array([[1, 5, 1]]), rng.standard_normal((1, 3, 7))
    h, c_embed = model.embed.forward(ids)
    z, c_norm = model.norm.forward(h)
    logits, c_head = model.embed.attend(z)
    dz = model.embed.attend_backward(dlogits, c_head)
    head_part = model.embed.E.grad.copy()
    model.embed.backward(model.norm.backward(dz, c_norm), c_embed)
    E = model.embed.E.data
    np.testing.assert_allclose(logits, z @ E.T)
    np.testing.assert_allclose(head_part, dlogits.reshape(-1, 7).T @ z.reshape(-1, 4))
    # the embedding lookup's gradient lands on top of the head's, rows 1 and 5 only
    lookup_part = model.embed.E.grad - head_part
    np.testing.assert_array_equal(lookup_part[[0, 2, 3, 4, 6]], 0)
    assert np.abs(lookup_part[[1, 5]]).min() > 0
    # and the sum is the true gradient of sum(logits * dlogits), by finite differences
    def loss(E_):
        h_ = E_[ids]
        z_ = h_ / np.sqrt(np.mean(h_ ** 2, -1, keepdims=True) + 1e-5)
        return np.sum((z_ @ E_.T) * dlogits)
    e, i, j = 1e-6, 5, 2
    bump = np.zeros_like(E)
    bump[i, j] = e
    numeric = (loss(E + bump) - loss(E - bump)) / (2 * e)
    assert abs(model.embed.E.grad[i, j] - numeric) < 1e-7 * max(1, abs(numeric))


def test_named_parameters_walks_the_tree_once_per_param():
    rng = _rng()
    model = _TiedLM(rng)
    model.blocks = [nn.Linear(4, 4, rng=rng), nn.Linear(4, 4, rng=rng)]
    model.alias = model.embed  # the same module twice: its Param is listed once
    names = [n for n, _ in model.named_parameters()]
    assert names == ["embed.E", "norm.g", "blocks.0.W", "blocks.1.W"]
    assert model.n_params() == 7 * 4 + 4 + 2 * 16


def test_embedding_backward_adds_into_e_grad_as_the_dense_pair_does():
    """Embedding.backward scatters into E.grad; the same as adding the pair's dense (V, D)
    dE (repeated ids accumulate), computed here with an explicit loop over positions."""
    rng = np.random.default_rng(3)
    emb = nn.Embedding(11, 4, rng=rng, dtype=np.float64)
    emb.E.grad[:] = rng.standard_normal((11, 4))
    before = emb.E.grad.copy()
    ids = np.array([[1, 5, 1], [10, 0, 5]])
    out, cache = emb.forward(ids)
    dout = rng.standard_normal(out.shape)
    emb.backward(dout, cache)
    want = before.copy()
    for b, t in np.ndindex(ids.shape):
        want[ids[b, t]] += dout[b, t]
    np.testing.assert_allclose(emb.E.grad, want, rtol=0, atol=1e-15)
    untouched = [v for v in range(11) if v not in ids]
    np.testing.assert_array_equal(emb.E.grad[untouched], before[untouched])
