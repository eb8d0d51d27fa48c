"""FlatGrads: the replicas' gradients in one array, summed and squared per thread with the
bits of the Param-by-Param loops (numpy's += in replica order, fused_adamw.sum_squares)."""
import numpy as np
import pytest

from scratchllm.core import Linear, Module, Param, fused_adamw
from scratchllm.core.flat_grads import FlatGrads, balanced_split


class _Two(Module):
    def __init__(self, rng, dtype):
        self.a = Linear(5, 7, bias=True, rng=rng, dtype=dtype)
        self.b = [Param(np.zeros(s, dtype)) for s in ((1,), (3, 2, 4), (33,))]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_sum_rows_gives_the_loops_bits_and_each_params_squares(dtype, threads):
    draws = np.random.default_rng(3)
    models = [_Two(np.random.default_rng(0), dtype) for _ in range(3)]
    for m in models:
        for p in m.parameters():
            p.grad[...] = draws.standard_normal(p.data.shape)
    want = [p.grad + q.grad + r.grad for p, q, r in zip(*[m.parameters() for m in models])]
    before = [p.grad.copy() for p in models[1].parameters()]
    flat = FlatGrads(models, threads)
    for k in range(threads):
        flat.sum_rows(3, k)
    for j, p in enumerate(models[0].parameters()):
        np.testing.assert_array_equal(p.grad, want[j])  # the values kept, then summed
        assert flat.squares[j] == fused_adamw.sum_squares(want[j])
    for p, g in zip(models[1].parameters(), before):
        np.testing.assert_array_equal(p.grad, g)  # the other rows untouched
    flat.zero(1)
    assert not any(p.grad.any() for p in models[1].parameters())
    assert models[0].parameters()[0].grad.any()


def test_flat_grads_are_views_until_one_is_re_pointed():
    models = [_Two(np.random.default_rng(0), np.float32) for _ in range(2)]
    flat = FlatGrads(models, 2)
    assert all(np.shares_memory(p.grad, flat.buf) for m in models for p in m.parameters())
    assert flat.valid()
    models[1].a.W.grad = np.zeros_like(models[1].a.W.grad)
    assert not flat.valid()


def test_fits_only_one_float_dtype_of_real_arrays():
    a, b = _Two(np.random.default_rng(0), np.float32), _Two(np.random.default_rng(0),
                                                             np.float32)
    assert FlatGrads.fits([a, b])
    b.b[0].grad = np.zeros(1, np.float64)
    assert not FlatGrads.fits([a, b])
    assert not FlatGrads.fits([Module()])  # no Params
    a.a.W.grad = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (5, 7), (0, 0))
    assert not FlatGrads.fits([a])  # a ZeRO placeholder (dist/zero_layers.py empty_grad)


def test_balanced_split_gives_each_thread_about_its_share():
    sizes = [98304, 98304] + [24576] * 12 + [9216, 4608, 4608, 9216] * 4 + [96] * 9
    parts = balanced_split(sizes, 2)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(sizes)))
    loads = [sum(sizes[j] for j in p) for p in parts]
    assert max(loads) - min(loads) <= 96
    assert [p.tolist() for p in balanced_split([5, 1], 3)] == [[0], [1], []]
