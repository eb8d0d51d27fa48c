"""Muon (core/muon.py): the Newton-Schulz iteration against the SVD and the scalar polynomial,
one step computed by hand, momentum and weight decay, the threads, the state round trip, and
MuonAdamW's split of one schedule."""
import math

import numpy as np
import pytest

from scratchllm.core.muon import NS_COEFFS, Muon, MuonAdamW, muon_scale, newton_schulz
from scratchllm.core.nn import Param
from scratchllm.core.optim import AdamW


def _phi5(s):
    """The singular values after five iterations: phi(s) = a s + b s^3 + c s^5, five times."""
    a, b, c = NS_COEFFS
    for _ in range(5):
        s = a * s + b * s ** 3 + c * s ** 5
    return s


@pytest.mark.parametrize("shape", [(17, 40), (40, 17), (23, 23)])
def test_newton_schulz_keeps_the_singular_vectors_and_maps_each_value_by_phi5(shape):
    G = np.random.default_rng(0).standard_normal(shape)
    U, S, Vt = np.linalg.svd(G, full_matrices=False)            # an independent computation
    O = newton_schulz(G)
    assert O.shape == G.shape and O.dtype == G.dtype
    D = U.T @ O @ Vt.T                                          # (k, k): diagonal if the
    off = D - np.diag(np.diag(D))                               # singular vectors stayed
    assert np.abs(off).max() < 1e-10
    # each singular value went through phi five times, from s / ||G||_F
    np.testing.assert_allclose(np.diag(D), _phi5(S / (np.linalg.norm(G) + 1e-7)),
                               rtol=1e-10)
    assert 0.68 < np.diag(D).min() and np.diag(D).max() < 1.21  # the band, near P V^T


def test_newton_schulz_in_float32_is_near_the_polar_factor():
    G = np.random.default_rng(1).standard_normal((64, 192)).astype(np.float32)
    U, _, Vt = np.linalg.svd(G.astype(np.float64), full_matrices=False)
    O = newton_schulz(G)
    assert O.dtype == np.float32
    sv = np.linalg.svd(O.astype(np.float64), compute_uv=False)
    assert 0.68 < sv.min() and sv.max() < 1.21
    # cosine with the exact polar factor P V^T: close, not equal (the band)
    polar = U @ Vt
    cos = (O * polar).sum() / (np.linalg.norm(O) * np.linalg.norm(polar))
    assert cos > 0.98
    with pytest.raises(ValueError, match=r"newton_schulz: G must be a matrix.*\(3, 4, 5\)"):
        newton_schulz(np.zeros((3, 4, 5)))


def test_one_step_by_hand():
    """G = 2 [I 0] (2 x 3): both singular values 2, so X0 = G / ||G||_F has 1/sqrt(2) twice
    and NS5(G) = phi5(1/sqrt(2)) [I 0]; the scale is sqrt(3/2) (d_in 2, d_out 3)."""
    G = np.array([[2.0, 0, 0], [0, 2.0, 0]])
    W0 = np.array([[0.5, -1.0, 0.25], [1.5, 0.0, -0.5]])
    p = Param(W0.copy())
    p.grad = G.copy()
    opt = Muon([p], lr=0.1, momentum=0.95, weight_decay=0.2)
    opt.step()
    # M = 0.05 G; U = 0.05 G + 0.95 M = 0.0975 G (Nesterov): a multiple of G, same NS output
    np.testing.assert_allclose(opt.m[0], 0.05 * G, rtol=1e-14)
    s = _phi5(0.0975 * 2 / (0.0975 * math.sqrt(8) + 1e-7))  # U's 0.1950 / (||U||_F + 1e-7)
    expect = W0 * (1 - 0.1 * 0.2) - 0.1 * math.sqrt(1.5) * s * np.array([[1.0, 0, 0],
                                                                        [0, 1.0, 0]])
    np.testing.assert_allclose(p.data, expect, rtol=0, atol=1e-14)
    assert math.isclose(muon_scale((2, 3)), math.sqrt(1.5)) and muon_scale((3, 2)) == 1.0
    assert 0.68 < s < 1.21


def test_momentum_accumulates_and_nesterov_looks_ahead():
    rng = np.random.default_rng(2)
    g1, g2 = rng.standard_normal((4, 6)), rng.standard_normal((4, 6))
    p, q = Param(np.zeros((4, 6))), Param(np.zeros((4, 6)))
    nest, plain = Muon([p], lr=0.01), Muon([q], lr=0.01, nesterov=False)
    for g in (g1, g2):
        p.grad, q.grad = g.copy(), g.copy()
        nest.step(), plain.step()
    m2 = 0.95 * 0.05 * g1 + 0.05 * g2
    np.testing.assert_allclose(nest.m[0], m2, rtol=1e-14)
    np.testing.assert_allclose(plain.m[0], m2, rtol=1e-14)
    # the last update: NS of 0.05 g2 + 0.95 m2 (Nesterov) or of m2 (plain)
    upd = lambda u: -0.01 * muon_scale((4, 6)) * newton_schulz(u)  # noqa: E731
    first_n, first_p = upd(0.05 * g1 + 0.95 * 0.05 * g1), upd(0.05 * g1)
    np.testing.assert_allclose(p.data, first_n + upd(0.05 * g2 + 0.95 * m2), atol=1e-15)
    np.testing.assert_allclose(q.data, first_p + upd(m2), atol=1e-15)


def test_threads_give_the_same_bits_and_only_updates_the_chosen():
    rng = np.random.default_rng(3)
    shapes = [(8, 24), (24, 8), (8, 8), (8, 4)]
    runs = []
    for threads in (1, 2):
        ps = [Param(np.random.default_rng(i).standard_normal(s).astype(np.float32))
              for i, s in enumerate(shapes)]
        opt = Muon(ps, lr=0.02, threads=threads)
        grads = [np.random.default_rng(10 + i).standard_normal(s).astype(np.float32)
                 for i, s in enumerate(shapes)]
        for _ in range(3):
            for p, g in zip(ps, grads):
                p.grad = g
            opt.step(only=[0, 1, 3])
        runs.append(([p.data for p in ps], opt))
    for a, b in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(runs[0][0][2], np.random.default_rng(2).standard_normal(
        (8, 8)).astype(np.float32))  # not in `only`: untouched
    assert runs[0][1].t == 3 and not runs[0][1].m[2].any()
    del rng


def test_state_round_trip_and_errors():
    rng = np.random.default_rng(4)
    p = Param(rng.standard_normal((5, 7)))
    p.grad = rng.standard_normal((5, 7))
    opt = Muon([p], lr=0.03)
    opt.step()
    other = Muon([Param(np.zeros((5, 7)))], lr=1.0)
    other.load_state_dict(opt.state_dict())
    assert other.t == 1 and other.lr == 0.03
    np.testing.assert_array_equal(other.m[0], opt.m[0])
    with pytest.raises(ValueError, match=r"m.0 has shape \(7, 5\), expected \(5, 7\)"):
        other.load_state_dict({"t": 1, "lr": 0.1, "m.0": np.zeros((7, 5))})
    with pytest.raises(ValueError, match="state has 4 entries, expected 3"):
        other.load_state_dict({**opt.state_dict(), "m.1": np.zeros(3)})
    with pytest.raises(ValueError, match=r"Muon: every parameter must be a matrix.*\(5,\)"):
        Muon([Param(np.zeros(5))])
    with pytest.raises(ValueError, match="Muon: momentum must lie in \\[0, 1\\), got 1.0"):
        Muon([p], momentum=1.0)
    with pytest.raises(ValueError, match="lr"):
        Muon([p], lr=-0.1)


def test_muon_adamw_drives_both_from_one_lr_and_round_trips():
    rng = np.random.default_rng(5)
    v, w = Param(rng.standard_normal(6)), Param(rng.standard_normal((6, 3)))
    v2, w2 = Param(v.data.copy()), Param(w.data.copy())
    both = MuonAdamW(AdamW([v], lr=1e-3), Muon([w], lr=0.02), muon_ratio=10.0)
    alone_a, alone_m = AdamW([v2], lr=1e-3), Muon([w2], lr=0.02)
    both.lr = alone_a.lr = 4e-3
    alone_m.lr = 0.04
    assert both.adamw.lr == 4e-3 and both.muon.lr == 0.04 and both.lr == 4e-3
    assert both.params == [v, w]
    for _ in range(2):
        v.grad, w.grad = rng.standard_normal(6), rng.standard_normal((6, 3))
        v2.grad, w2.grad = v.grad.copy(), w.grad.copy()
        both.step(), alone_a.step(), alone_m.step()
    np.testing.assert_array_equal(v.data, v2.data)
    np.testing.assert_array_equal(w.data, w2.data)
    both.step(only=[1])  # Muon's matrix only: AdamW's vector stays
    np.testing.assert_array_equal(v.data, v2.data)
    assert not np.array_equal(w.data, w2.data)
    state = both.state_dict()
    assert sorted(state) == ["adamw.lr", "adamw.m.0", "adamw.t", "adamw.v.0", "muon.lr",
                             "muon.m.0", "muon.t"]
    again = MuonAdamW(AdamW([Param(np.zeros(6))]), Muon([Param(np.zeros((6, 3)))]), 1.0)
    again.load_state_dict(state)
    assert again.muon.t == 3 and again.adamw.t == 3
    np.testing.assert_array_equal(again.muon.m[0], both.muon.m[0])
    with pytest.raises(ValueError, match="entry 'm.0' is neither AdamW's nor Muon's"):
        again.load_state_dict({"m.0": np.zeros(6)})
