"""GLA's chunked form as Numba lane kernels (linear_attention/gla_chunks.py) against its
readable NumPy twin (gla._chunked, gla._chunked_backward): every gate layout (none, one per
head, one per channel), ragged T, one chunk longer than T; float64 to round-off, float32 with
strong gates finite and close to float64; and the same bits on 1, 2 or 3 threads."""
import numpy as np
import pytest

from scratchllm.linear_attention import gla, lanes


def rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def _inputs(rng, gate, B=2, H=3, T=21, Dk=5, Dv=7, strongest=-0.7):
    q, k = rng.standard_normal((2, B, H, T, Dk))
    v = rng.standard_normal((B, H, T, Dv))
    width = {"none": 1, "head": 1, "channel": Dk}[gate]
    g = rng.uniform(strongest, 0.0, (B, H, T, width)) * (gate != "none")
    return q, k, v, g


@pytest.mark.parametrize("gate", ["none", "head", "channel"])
@pytest.mark.parametrize("T,C", [(21, 8), (16, 4), (5, 8)])
def test_kernel_equals_the_numpy_twin(gate, T, C):
    rng = np.random.default_rng(T + C)
    q, k, v, g = _inputs(rng, gate, T=T)
    o_ref, parts_ref = gla._chunked(q, k, v, g, C)
    o, parts = gla._chunked_fast(q, k, v, g, C)
    assert o.shape == o_ref.shape and rel(o, o_ref) < 1e-12
    for a, b in zip(parts, parts_ref):
        assert a.shape == b.shape and rel(a, b) < 1e-12
    cache = gla.GLACache("chunked", *parts_ref, T, gate)
    do = rng.standard_normal(o.shape)
    for got, want, name in zip(gla._chunked_backward_fast(do, cache),
                               gla._chunked_backward(do, cache), ("dq", "dk", "dv", "dg")):
        assert got.shape == want.shape and rel(got, want) < 1e-12, name


@pytest.mark.parametrize("gate", ["head", "channel"])
def test_float32_strong_gates_stay_finite(gate):
    rng = np.random.default_rng(7)
    q, k, v, g = _inputs(rng, gate, T=40, strongest=-30.0)  # e^b underflows in float32
    o64, p64 = gla._chunked(q, k, v, g, 16)
    do = rng.standard_normal(o64.shape)
    g64 = gla._chunked_backward(do, gla.GLACache("chunked", *p64, 40, gate))
    f = np.float32
    o, parts = gla._chunked_fast(*(a.astype(f) for a in (q, k, v, g)), 16)
    grads = gla._chunked_backward_fast(do.astype(f), gla.GLACache("chunked", *parts, 40, gate))
    assert o.dtype == f and np.all(np.isfinite(o)) and rel(o, o64) < 1e-4
    for got, want in zip(grads, g64):
        assert got.dtype == f and np.all(np.isfinite(got)) and rel(got, want) < 1e-3


def test_the_same_bits_on_one_or_two_threads(monkeypatch):
    rng = np.random.default_rng(3)
    q, k, v, g = (a.astype(np.float32) for a in _inputs(rng, "channel", B=3, H=2, T=33))
    do = rng.standard_normal((3, 2, 33, 7)).astype(np.float32)
    monkeypatch.setattr(lanes, "MIN_WORK", 0)  # small inputs too: spans on threads
    real, cut = lanes.spans, []
    monkeypatch.setattr(lanes, "spans", lambda L, n: cut.append(n) or real(L, n))
    runs = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(lanes, "_threads", lambda n=threads: n)
        o, parts = gla._chunked_fast(q, k, v, g, 8)
        runs.append((o,) + gla._chunked_backward_fast(do, gla.GLACache("chunked", *parts, 33,
                                                                        "channel")))
    assert cut == [1, 1, 6, 6, 6, 6]  # fwd and bwd per thread count: 1, else a span a lane
    for run in runs[1:]:
        for a, b in zip(run, runs[0]):
            np.testing.assert_array_equal(a, b)


def test_spans_cover_every_lane_once():
    for L, n in ((6, 1), (6, 2), (7, 3), (2, 5), (1, 2)):
        cut = lanes.spans(L, n)
        assert len(cut) == min(n, L) and cut[0][0] == 0 and cut[-1][1] == L
        assert all(hi == lo for (_, hi), (lo, _) in zip(cut[:-1], cut[1:]))
        assert all(hi > lo for lo, hi in cut)
