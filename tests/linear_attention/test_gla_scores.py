"""GLA's intra-chunk scores with a gate per channel: the Numba twin (running products of the
gates) == the NumPy reference (the whole decay tensor), forward and backward, in float64 and
float32 with strong gates (no overflow, no NaN); gradients by finite differences."""
import numpy as np
import pytest

from grads.check import check
from scratchllm.linear_attention.gla_scores import (gla_scores_backward, gla_scores_backward_ref,
                                                    gla_scores_forward, gla_scores_forward_ref)


def rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def inputs(rng, shape, strongest=-1.2):
    """q, k and b = cumsum(g) with log gates g uniform in (strongest, 0)."""
    return dict(q=rng.standard_normal(shape), k=rng.standard_normal(shape),
                b=np.cumsum(rng.uniform(strongest, 0.0, shape), axis=-2))


@pytest.mark.parametrize("shape", [(2, 3, 5, 7, 4), (1, 1, 3), (3, 16, 8), (2, 64, 64)])
def test_numba_equals_the_reference(shape):
    rng = np.random.default_rng(len(shape))
    a = inputs(rng, shape)
    P, cache = gla_scores_forward(**a)
    P_ref, cache_ref = gla_scores_forward_ref(**a)
    assert P.shape == shape[:-1] + shape[-2:-1] and rel(P, P_ref) < 1e-12
    assert np.all(np.triu(P[..., :, :], 1) == 0)  # causal: nothing above the diagonal
    dP = rng.standard_normal(P.shape)
    g, g_ref = gla_scores_backward(dP, cache), gla_scores_backward_ref(dP, cache_ref)
    assert g.keys() == g_ref.keys() == {"q", "k", "b"}
    for name in g:
        assert rel(g[name], g_ref[name]) < 1e-12, name


def test_float32_strong_gates_stay_finite():
    rng = np.random.default_rng(1)
    a = inputs(rng, (2, 64, 16), strongest=-30.0)  # b reaches ~ −960: e^b underflows float32
    P64, c64 = gla_scores_forward_ref(**a)
    dP = rng.standard_normal(P64.shape)
    g64 = gla_scores_backward_ref(dP, c64)
    a32 = {n: x.astype(np.float32) for n, x in a.items()}
    P, cache = gla_scores_forward(**a32)
    g = gla_scores_backward(dP.astype(np.float32), cache)
    assert P.dtype == np.float32 and np.all(np.isfinite(P)) and rel(P, P64) < 1e-4
    for name, x in g.items():
        assert x.dtype == np.float32 and np.all(np.isfinite(x)) and rel(x, g64[name]) < 1e-3


def test_gradients():
    rng = np.random.default_rng(2)
    report = check(gla_scores_forward, gla_scores_backward, rng=rng, **inputs(rng, (2, 5, 3)))
    assert report.ok, report


def test_bad_input():
    a = inputs(np.random.default_rng(3), (2, 5, 3))
    with pytest.raises(ValueError, match="gla_scores: k has shape"):
        gla_scores_forward(**{**a, "k": a["k"][:, :4]})
    P, cache = gla_scores_forward(**a)
    with pytest.raises(ValueError, match="gla_scores_backward: dP has shape"):
        gla_scores_backward(P[:, :4], cache)
