"""Selective scan: Numba == NumPy reference, the LTI special case, gradients, determinism."""
import numba
import numpy as np
import pytest

import scratchllm.ssm.scan as scan_module
from grads.check import check
from scratchllm.ssm import (selective_scan_backward, selective_scan_forward,
                             selective_scan_forward_ref, selective_scan_backward_ref)


def inputs(rng, Bt=2, T=9, d=13, N=5, dtype=np.float64):
    """Odd sizes; d is zero-padded to blocks of W = 32 channels inside the kernels."""
    a = dict(x=rng.standard_normal((Bt, T, d)), delta=rng.uniform(0.05, 1.0, (Bt, T, d)),
             A=-rng.uniform(0.2, 2.0, (d, N)), B=rng.standard_normal((Bt, T, N)),
             C=rng.standard_normal((Bt, T, N)), D=rng.standard_normal(d))
    return {k: v.astype(dtype) for k, v in a.items()}


def rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


@pytest.mark.parametrize("sizes", [dict(), dict(Bt=1, T=1, d=1, N=1), dict(Bt=3, T=17, d=4, N=8),
                                   dict(Bt=2, T=5, d=70, N=3)])  # 3 blocks of W, 2 groups
def test_numba_matches_reference_forward_and_every_gradient(sizes):
    rng = np.random.default_rng(0)
    a = inputs(rng, **sizes)
    y, cache = selective_scan_forward(**a)
    y_ref, cache_ref = selective_scan_forward_ref(**a)
    assert rel(y, y_ref) < 1e-12
    dy = rng.standard_normal(y.shape)
    g, g_ref = selective_scan_backward(dy, cache), selective_scan_backward_ref(dy, cache_ref)
    assert sorted(g) == sorted(a)
    for name in a:
        assert g[name].shape == a[name].shape, name
        assert rel(g[name], g_ref[name]) < 1e-12, name


def test_constant_delta_B_C_is_the_LTI_convolution_with_euler_B_bar():
    # Independent computation: K_l = sum_n C_n Abar_n^l Bbar_n with Abar = exp(ΔA), Bbar = ΔB,
    # then y_t = sum_s K_s x_{t-s} + D x_t (a direct causal convolution, no recurrence).
    rng = np.random.default_rng(1)
    Bt, T, d, N = 2, 11, 3, 4
    a = inputs(rng, Bt, T, d, N)
    dt = rng.uniform(0.1, 0.5, d)  # (d,)
    Bv, Cv = rng.standard_normal(N), rng.standard_normal(N)  # (N,)
    a["delta"] = np.broadcast_to(dt, (Bt, T, d)).copy()
    a["B"], a["C"] = np.tile(Bv, (Bt, T, 1)), np.tile(Cv, (Bt, T, 1))
    powers = np.exp(dt[:, None, None] * a["A"][:, None, :] * np.arange(T)[None, :, None])
    K = np.einsum("n,cln,n->cl", Cv, powers, Bv) * dt[:, None]  # (d, T)
    y_conv = a["D"] * a["x"]
    for t in range(T):
        for s in range(t + 1):
            y_conv[:, t] += K[:, s] * a["x"][:, t - s]
    for fwd in (selective_scan_forward, selective_scan_forward_ref):
        assert rel(fwd(**a)[0], y_conv) < 1e-12


@pytest.mark.parametrize("pair", [(selective_scan_forward, selective_scan_backward),
                                  (selective_scan_forward_ref, selective_scan_backward_ref)])
def test_gradient_check(pair):
    rng = np.random.default_rng(2)
    report = check(*pair, rng=rng, **inputs(rng, Bt=2, T=6, d=3, N=4))
    assert report.ok, "\n" + str(report)


def _run(a, dy):
    y, cache = selective_scan_forward(**a)
    return [y] + list(selective_scan_backward(dy, cache).values())


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_bits_for_one_and_two_threads_and_over_runs(dtype, monkeypatch):
    monkeypatch.setattr(scan_module, "_MIN_WORK", 0)  # this small input on threads too
    spans, real = [], scan_module.run_tasks
    monkeypatch.setattr(scan_module, "run_tasks", lambda fn, n, workers: spans.append(n) or real(
        fn, n, workers))
    rng = np.random.default_rng(3)
    a = inputs(rng, Bt=3, T=40, d=70, N=6, dtype=dtype)  # 3 tasks of 2 groups each
    dy = rng.standard_normal((3, 40, 70)).astype(dtype)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _run(a, dy)
        numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
        two, again = _run(a, dy), _run(a, dy)
    finally:
        numba.set_num_threads(before)
    assert spans == [1, 1] + [min(2, numba.config.NUMBA_NUM_THREADS)] * 4  # fwd, bwd per run
    for u, v, w in zip(one, two, again):
        assert u.dtype == dtype
        assert np.array_equal(u, v) and np.array_equal(v, w)


def test_cache_holds_no_states_and_float32_stays_float32():
    rng = np.random.default_rng(4)
    a = inputs(rng, Bt=2, T=8, d=6, N=5, dtype=np.float32)
    y, cache = selective_scan_forward(**a)
    assert y.dtype == np.float32
    assert max(v.size for v in cache) < 2 * 8 * 6 * 5  # nothing of size B·T·d·N
    g = selective_scan_backward(np.ones_like(y), cache)
    assert all(v.dtype == np.float32 for v in g.values())
    y_ref = selective_scan_forward_ref(**a)[0]
    assert y_ref.dtype == np.float32 and rel(y, y_ref) < 1e-5


def test_bad_inputs_name_the_argument():
    a = inputs(np.random.default_rng(5))
    with pytest.raises(ValueError, match="selective_scan_forward: A has shape"):
        selective_scan_forward(**{**a, "A": a["A"][:-1]})
    with pytest.raises(ValueError, match="C has shape"):
        selective_scan_forward_ref(**{**a, "C": a["C"][:, :-1]})
    with pytest.raises(TypeError, match="selective_scan_forward: B must be a float array"):
        selective_scan_forward(**{**a, "B": a["B"].astype(np.int64)})


def test_a_float32_input_among_float64_computes_in_float64():
    a = inputs(np.random.default_rng(5))
    B32 = a["B"].astype(np.float32)
    y = selective_scan_forward(**{**a, "B": B32})[0]
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, selective_scan_forward(**{**a, "B": B32.astype(float)})[0])


def test_vectorisable_exp_float32_within_1_ulp_and_float64_is_libm_exp():
    from numba import njit

    from scratchllm.ssm.vexp import exp_lanes

    @njit
    def apply(v):
        out = np.empty_like(v)
        for i in range(v.size):
            out[i] = exp_lanes(v[i])
        return out

    v = np.linspace(-86.9, 88.7, 200001).astype(np.float32)
    exact = np.exp(v.astype(np.float64))
    assert np.max(np.abs(apply(v) - exact) / exact) < 1.2e-7  # fused: ~0.8 ulp
    edge = apply(np.array([-1e4, -87.5, 89.0, 0.0], np.float32))
    assert edge.dtype == np.float32 and list(edge) == [0.0, 0.0, np.inf, 1.0]
    v64 = np.linspace(-50, 50, 1001)
    np.testing.assert_allclose(apply(v64), np.exp(v64), rtol=1e-15)  # libm vs numpy's SIMD exp


def test_float32_vector_kernel_matches_float64_reference_gradients():
    # the float32 backward runs on explicit 16-lane vectors (vexp.Lanes16), float64 on scalars
    rng = np.random.default_rng(6)
    a = inputs(rng, Bt=2, T=30, d=70, N=6)  # 3 blocks of W = 32: 2 groups, padded lanes
    dy = rng.standard_normal((2, 30, 70))
    g_ref = selective_scan_backward_ref(dy, selective_scan_forward_ref(**a)[1])
    a32 = {k: v.astype(np.float32) for k, v in a.items()}
    g = selective_scan_backward(dy.astype(np.float32), selective_scan_forward(**a32)[1])
    for name in a:
        assert g[name].dtype == np.float32 and rel(g[name], g_ref[name]) < 2e-5, name


def test_fold16_sums_16_lanes_in_the_documented_order():
    from numba import njit

    from scratchllm.ssm.vexp import fold16, load16

    v = np.random.default_rng(7).standard_normal(16).astype(np.float32) * 1e4
    s = v[:8] + v[8:]
    s = s[:4] + s[4:]
    assert njit(lambda a: fold16(load16(a, 0)))(v) == (s[0] + s[2]) + (s[1] + s[3])


def test_exp16_has_the_bits_of_exp_lanes():
    from numba import njit

    from scratchllm.ssm.vexp import exp16, exp_lanes, load16, store16

    @njit
    def both(v, a, b):
        for i in range(0, v.size, 16):
            store16(a, i, exp16(load16(v, i)))
        for i in range(v.size):
            b[i] = exp_lanes(v[i])

    v = np.concatenate([np.linspace(-100, 100, 4000), [np.nan, -87, 88.72, 88.73, -87.01, 0,
                                                       np.inf, -np.inf, 1e-30, -1e-30]])
    v = v.astype(np.float32)  # (4010 + 6 padding,)
    v = np.concatenate([v, np.zeros(-v.size % 16, np.float32)])  # (4016,)
    a, b = np.empty_like(v), np.empty_like(v)  # (4016,)
    both(v, a, b)
    assert np.array_equal(a, b, equal_nan=True)
