"""Mamba-2's SSD: chunked SSD == the dual quadratic form == the sequential scan (NumPy loop and
Numba kernel) == Mamba-1's selective scan with A shared across a head's channels; the duality
(A = 0 is causal linear attention with φ = identity and no normaliser); gradients of every
input; decoding == the full forward; float32 with long T and large Δ|A|."""
import numpy as np
import pytest

from grads.check import check
from scratchllm.linear_attention import linear_attention_forward
from scratchllm.ssm import (selective_scan_forward, ssd_backward, ssd_forward, ssd_recurrent,
                            ssd_recurrent_ref, ssd_step)

FORMS = [dict(form="recurrent"), dict(form="parallel")] + [
    dict(form="chunked", chunk=c) for c in (1, 3, 4, 16)]  # T = 13: ragged for 3 and 4


def rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def inputs(rng, batch=2, T=13, H=4, Dh=3, G=2, N=5, dtype=np.float64):
    a = dict(x=rng.standard_normal((batch, T, H, Dh)), dt=rng.uniform(0.05, 1.0, (batch, T, H)),
             A=-rng.uniform(0.2, 2.0, H), B=rng.standard_normal((batch, T, G, N)),
             C=rng.standard_normal((batch, T, G, N)), D=rng.standard_normal(H))
    return {k: v.astype(dtype) for k, v in a.items()}


@pytest.mark.parametrize("G", [1, 2, 4])
def test_chunked_dual_and_scan_agree(G):
    a = inputs(np.random.default_rng(0), G=G)
    want, S_want = ssd_recurrent_ref(**a)
    y, S = ssd_recurrent(**a)
    assert rel(y, want) < 1e-12 and rel(S, S_want) < 1e-12
    for form in FORMS:
        assert rel(ssd_forward(**a, **form)[0], want) < 1e-12, form


def test_ssd_is_the_selective_scan_with_a_scalar_A_per_head():
    a = inputs(np.random.default_rng(1), G=1)
    batch, T, H, Dh = a["x"].shape
    N = a["B"].shape[-1]
    # Mamba-1 lanes c = (h, p): Δ and A repeated over the head's Dh channels and N states
    y1, _ = selective_scan_forward(
        a["x"].reshape(batch, T, H * Dh), np.repeat(a["dt"], Dh, axis=2),
        np.repeat(np.repeat(a["A"][:, None], N, axis=1), Dh, axis=0), a["B"][:, :, 0],
        a["C"][:, :, 0], np.repeat(a["D"], Dh))
    assert rel(ssd_forward(**a)[0], y1.reshape(batch, T, H, Dh)) < 1e-12


def heads(m):
    """(B, T, H, *) -> (B, H, T, *)."""
    return np.swapaxes(m, 1, 2)


def test_duality_A_zero_is_causal_linear_attention_without_normaliser():
    a = inputs(np.random.default_rng(2), G=4)
    a["A"][:] = 0.0
    y = ssd_forward(**a, chunk=4)[0]
    o = linear_attention_forward(heads(a["C"]), heads(a["B"]),
                                 heads(a["x"] * a["dt"][..., None]), feature="identity",
                                 normalize=False, form="parallel")[0]
    assert rel(y, heads(o) + a["D"][:, None] * a["x"]) < 1e-12


@pytest.mark.parametrize("form", [dict(form="recurrent"), dict(form="parallel"),
                                  dict(form="chunked", chunk=3)])
def test_backward_of_every_input(form):
    rng = np.random.default_rng(3)
    a = inputs(rng, batch=2, T=7, H=4, Dh=3, G=2, N=5)
    report = check(ssd_forward, ssd_backward, rng=rng, **a, **form)
    assert report.ok, report
    assert {r.input for r in report.rows} == set(a)


def test_decoding_steps_equal_the_full_forward():
    a = inputs(np.random.default_rng(4))
    full = ssd_forward(**a)[0]
    state, outs = None, []
    for t in range(a["x"].shape[1]):
        y_t, state = ssd_step(a["x"][:, t], a["dt"][:, t], a["A"], a["B"][:, t], a["C"][:, t],
                              a["D"], state)
        outs.append(y_t)
    assert rel(np.stack(outs, axis=1), full) < 1e-12 and state.shape == (2, 4, 5, 3)


def test_float32_long_sequence_large_decay():
    rng = np.random.default_rng(5)
    a = inputs(rng, batch=1, T=1000, H=2, Dh=4, G=1, N=8)
    a["dt"] = rng.uniform(0.0, 10.0, a["dt"].shape)  # Δ|A| up to 20 per step
    want = ssd_recurrent_ref(**a)[0]
    a32 = {n: v.astype(np.float32) for n, v in a.items()}
    y, cache = ssd_forward(**a32, chunk=64)
    g = ssd_backward(rng.standard_normal(y.shape).astype(np.float32), cache)
    assert y.dtype == np.float32 and rel(y, want) < 1e-4
    assert rel(ssd_recurrent(**a32)[0], want) < 1e-4
    assert all(v.dtype == np.float32 and np.all(np.isfinite(v)) for v in g.values())


def test_bad_input():
    a = inputs(np.random.default_rng(6), H=4, G=2)
    with pytest.raises(ValueError, match="ssd: H=4 heads must be a multiple of Hg=3"):
        ssd_forward(**{**a, "B": a["B"][:, :, :1].repeat(3, 2), "C": a["C"][:, :, :1].repeat(3, 2)})
    with pytest.raises(ValueError, match="ssd: A has shape"):
        ssd_forward(**{**a, "A": np.zeros((4, 5))})
