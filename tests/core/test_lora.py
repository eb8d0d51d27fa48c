"""LoRA on a Linear: B = 0 changes nothing, only A and B train, the Module's gradients are the
pair's, merge folds the update into W (same outputs) and unmerge restores W."""
import numpy as np
import pytest

from scratchllm.core import Linear, LoRALinear, LoRAWeights, lora_forward


def _layer(bias=True, rank=3, alpha=6.0):
    rng = np.random.default_rng(0)
    lin = Linear(8, 5, bias=bias, rng=rng, dtype=np.float64)
    if bias:
        lin.b.data[...] = rng.standard_normal(5)
    return lin, LoRALinear(lin, rank, alpha=alpha, rng=rng), rng.standard_normal((2, 4, 8))


@pytest.mark.parametrize("bias", [True, False])
def test_a_fresh_adapter_changes_nothing(bias):
    lin, lora, x = _layer(bias)
    np.testing.assert_array_equal(lora.forward(x)[0], lin.forward(x)[0])
    assert [n for n, _ in lora.named_parameters()] == ["A", "B"]
    assert lora.scale == 2.0


def test_the_update_is_scale_x_a_b():
    lin, lora, x = _layer()
    lora.B.data[...] = np.random.default_rng(1).standard_normal(lora.B.data.shape)
    want = lin.forward(x)[0] + 2.0 * (x @ lora.A.data) @ lora.B.data
    np.testing.assert_allclose(lora.forward(x)[0], want, rtol=1e-12)
    w = LoRAWeights(lin.W.data, lora.A.data, lora.B.data)  # no bias: the bias term drops out
    np.testing.assert_allclose(lora_forward(x, w, scale=2.0)[0], want - lin.b.data, rtol=1e-12)


def test_module_backward_adds_only_the_adapter_grads():
    lin, lora, x = _layer()
    lora.B.data[...] = np.random.default_rng(1).standard_normal(lora.B.data.shape)
    dy = np.random.default_rng(2).standard_normal((2, 4, 5))
    y, cache = lora.forward(x)
    dx = lora.backward(dy, cache)
    s = lora.scale
    np.testing.assert_allclose(lora.B.grad, s * np.einsum("btr,bto->ro", x @ lora.A.data, dy))
    np.testing.assert_allclose(lora.A.grad, np.einsum("bti,btr->ir", x, s * dy @ lora.B.data.T))
    np.testing.assert_allclose(dx, dy @ (lin.W.data + s * lora.A.data @ lora.B.data).T)
    assert not lin.W.grad.any()  # the base weight is frozen


def test_merge_then_unmerge_restores_the_weights():
    lin, lora, x = _layer()
    lora.B.data[...] = np.random.default_rng(1).standard_normal(lora.B.data.shape)
    W0, y = lin.W.data.copy(), lora.forward(x)[0]
    lora.merge()
    np.testing.assert_allclose(lin.forward(x)[0], y, rtol=1e-12)  # the Linear alone now
    np.testing.assert_allclose(lora.forward(x)[0], y, rtol=1e-12)
    with pytest.raises(ValueError, match="merged"):
        lora.backward(np.ones_like(y), lora.forward(x)[1])
    with pytest.raises(ValueError, match="already merged"):
        lora.merge()
    lora.unmerge()
    np.testing.assert_allclose(lin.W.data, W0, rtol=0, atol=1e-14)
    assert not np.array_equal(W0 + lora.delta(), W0)  # the update was not zero
