"""AdamW against the update written out by hand; clipping; the schedule."""
import math

import numpy as np
import pytest

from scratchllm.core import Param
from scratchllm.core import AdamW, clip_grad_norm, cosine_schedule
from scratchllm.core.optim import clip_scale


def test_adamw_three_steps_match_the_formula_by_hand():
    lr, b1, b2, eps, wd = 0.1, 0.8, 0.95, 1e-6, 0.3
    p0 = np.array([1.0, -2.0, 0.5])
    grads = [np.array([0.3, -0.1, 2.0]), np.array([-0.4, 0.2, 1.0]), np.array([0.1, 0.1, -3.0])]
    param = Param(p0.copy())
    opt = AdamW([param], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for g in grads:
        param.grad[...] = g
        opt.step()
    # the same three steps, scalar by scalar, straight from torch.optim.AdamW's documentation
    for i in range(3):
        p, m, v = p0[i], 0.0, 0.0
        for t, g in enumerate(grads, start=1):
            p = p - lr * wd * p
            m = b1 * m + (1 - b1) * g[i]
            v = b2 * v + (1 - b2) * g[i] ** 2
            m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
            p = p - lr * m_hat / (math.sqrt(v_hat) + eps)
        assert param.data[i] == pytest.approx(p, rel=1e-13)


def test_adamw_param_groups_apply_their_own_decay():
    a, b = Param(np.ones(2)), Param(np.ones(2))
    opt = AdamW([{"params": [a]}, {"params": [b], "weight_decay": 0.0}], lr=0.5, weight_decay=0.1)
    opt.step()  # zero gradients: only weight decay moves a parameter
    np.testing.assert_allclose(a.data, 1 - 0.5 * 0.1)
    np.testing.assert_array_equal(b.data, 1.0)


def test_adamw_state_round_trip_resumes_exactly():
    rng = np.random.default_rng(0)
    grads = rng.standard_normal((4, 3))
    p1, p2 = Param(np.ones(3)), Param(np.ones(3))
    o1 = AdamW([p1], lr=0.01)
    for g in grads:
        p1.grad[...] = g
        o1.step()
    o2 = AdamW([p2], lr=0.01)
    for g in grads[:2]:
        p2.grad[...] = g
        o2.step()
    saved, data = {k: v.copy() for k, v in o2.state_dict().items()}, p2.data.copy()
    p3 = Param(data)
    o3 = AdamW([p3], lr=0.5)
    o3.load_state_dict(saved)
    for g in grads[2:]:
        p3.grad[...] = g
        o3.step()
    np.testing.assert_array_equal(p3.data, p1.data)


def test_adamw_rejects_bad_hyperparameters():
    with pytest.raises(ValueError, match="AdamW: lr must be a finite number > 0"):
        AdamW([Param(np.ones(1))], lr=0.0)
    with pytest.raises(ValueError, match=r"AdamW: betas must lie in \[0, 1\)"):
        AdamW([Param(np.ones(1))], betas=(0.9, 1.0))


def test_clip_grad_norm_scales_to_max_norm_and_returns_the_old_norm():
    a, b = Param(np.zeros(2)), Param(np.zeros(1))
    a.grad[...] = [3.0, 0.0]
    b.grad[...] = [4.0]
    norm = clip_grad_norm([a, b], max_norm=1.0)
    assert norm == pytest.approx(5.0)
    total = math.sqrt(np.sum(a.grad ** 2) + np.sum(b.grad ** 2))
    assert total == pytest.approx(1.0, rel=1e-6)
    np.testing.assert_allclose(a.grad, [0.6, 0.0], rtol=1e-6)


def test_clip_grad_norm_leaves_small_gradients_alone():
    a = Param(np.zeros(2))
    a.grad[...] = [0.3, 0.4]
    assert clip_grad_norm([a], max_norm=1.0) == pytest.approx(0.5)
    np.testing.assert_array_equal(a.grad, [0.3, 0.4])


def test_cosine_schedule_warmup_cosine_floor():
    kw = dict(max_lr=1.0, min_lr=0.1, warmup=10, total=110)
    assert cosine_schedule(0, **kw) == 0.0
    assert cosine_schedule(5, **kw) == pytest.approx(0.5)
    assert cosine_schedule(10, **kw) == pytest.approx(1.0)
    assert cosine_schedule(60, **kw) == pytest.approx(0.55)  # halfway down the cosine
    assert cosine_schedule(110, **kw) == pytest.approx(0.1)
    assert cosine_schedule(500, **kw) == 0.1
    lrs = [cosine_schedule(s, **kw) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_cosine_schedule_rejects_warmup_past_total():
    with pytest.raises(ValueError, match="warmup=20, total=10"):
        cosine_schedule(0, 1.0, 0.1, warmup=20, total=10)


def _grouped(dtype, shapes, threads, draws):
    """Params of `shapes` drawn from draws, and an AdamW of two groups on `threads`."""
    params = [Param(draws.standard_normal(s).astype(dtype)) for s in shapes]
    opt = AdamW([{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.0,
                                          "lr_scale": 0.5}], lr=0.01, weight_decay=0.1)
    opt.threads = threads
    return params, opt


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_on_threads_gives_the_bits_of_one_thread_and_of_the_readable_twin(
        dtype, monkeypatch):
    """Whole Params per thread (a step of all), equal spans of every Param per thread (a
    step of `only` some: ZeRO's; spans of 1 and 0 numbers at 3 threads), the readable twin."""
    shapes = [(7, 5), (1,), (3,), (2, 3, 4)]
    runs = {}
    for label, threads, readable, only in (("1", 1, "0", None), ("2", 2, "0", None),
                                           ("3", 3, "0", None), ("spans2", 2, "0", range(4)),
                                           ("spans3", 3, "0", range(4)),
                                           ("ref", 1, "1", None)):
        monkeypatch.setenv("SCRATCHLLM_READABLE", readable)
        draws = np.random.default_rng(4)
        params, opt = _grouped(dtype, shapes, threads, draws)
        for _ in range(3):
            for p in params:
                p.grad[...] = draws.standard_normal(p.data.shape)
            opt.step(only=only)
        runs[label] = [p.data.copy() for p in params] + opt.m + opt.v
    for label in ("2", "3", "spans2", "spans3", "ref"):
        for a, b in zip(runs["1"], runs[label]):
            np.testing.assert_array_equal(a, b)


def test_adamw_on_threads_refuses_a_non_contiguous_parameter():
    p = Param(np.ones((4, 6))[:, ::2])  # a strided view: no flat span of it exists
    opt = AdamW([p], lr=0.1)
    opt.threads = 2
    with pytest.raises(ValueError, match="adamw_update: p must be C-contiguous"):
        opt.step()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adamw_grad_scale_is_the_scaled_gradients_step_on_any_threads(dtype, monkeypatch):
    """step(grad_scale=s) (the clip's factor, taken into AdamW's pass; whole Params per
    thread) gives the bits of `p.grad *= s` then step(), and leaves .grad so scaled."""
    shapes = [(7, 5), (1,), (3,), (2, 3, 4), (40,)]
    runs = {}
    for label, threads, readable, fold in (("plain", 1, "0", False), ("1", 1, "0", True),
                                           ("2", 2, "0", True), ("3", 3, "0", True),
                                           ("ref", 1, "1", True)):
        monkeypatch.setenv("SCRATCHLLM_READABLE", readable)
        draws = np.random.default_rng(4)
        params, opt = _grouped(dtype, shapes, threads, draws)
        for scale in (0.37, None, 0.81):
            for p in params:
                p.grad[...] = draws.standard_normal(p.data.shape)
            if fold:
                opt.step(grad_scale=scale)
            else:
                for p in params:
                    p.grad *= 1.0 if scale is None else scale
                opt.step()
        runs[label] = [p.data.copy() for p in params] + [p.grad for p in params] + opt.m + opt.v
    for label in ("1", "2", "3", "ref"):
        for a, b in zip(runs["plain"], runs[label]):
            np.testing.assert_array_equal(a, b)


def test_adamw_follows_a_param_whose_data_is_re_pointed():
    """The update's flat views are rebuilt when a Param's .data is another array (a loaded
    checkpoint's): the step lands on the new array, the old one is left alone."""
    p = Param(np.ones((3, 4), np.float32))
    opt = AdamW([p], lr=0.1, weight_decay=0.0)
    p.grad[...] = 1.0
    opt.step()
    old, p.data = p.data, np.full((3, 4), 5.0, np.float32)
    kept = old.copy()
    opt.step()
    np.testing.assert_array_equal(old, kept)
    assert (p.data < 5.0).all()


def test_clip_scale_is_clip_grad_norms_factor_and_takes_given_squares():
    a, b = Param(np.zeros(3)), Param(np.zeros(2))
    a.grad[...], b.grad[...] = [3.0, 0.0, 0.0], [0.0, 4.0]
    norm, scale = clip_scale([a, b], 1.0)
    assert norm == 5.0 and scale == pytest.approx(1.0 / (5.0 + 1e-6), rel=1e-15)
    assert clip_scale([a, b], 10.0) == (5.0, None)
    assert clip_scale([a, b], 1.0, squares=[9.0, 16.0]) == (norm, scale)
    assert clip_grad_norm([a, b], 1.0, squares=[0.0, 1.0]) == 1.0  # the given squares count
    np.testing.assert_array_equal(a.grad, [3.0, 0.0, 0.0])  # norm 1 <= max_norm: unscaled
