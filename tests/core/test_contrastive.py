"""InfoNCE with in-batch negatives against the formula written with a loop over queries, its
gradient against a written-out (softmax − I) form, and its limits."""
import numpy as np
import pytest

from scratchllm.core import info_nce_backward, info_nce_forward


def _loop_loss(q, k, tau):
    total = 0.0
    for i in range(len(q)):
        s = np.array([q[i] @ k[j] / tau for j in range(len(k))])
        total += -(s[i] - np.log(np.sum(np.exp(s - s.max()))) - s.max())
    return total / len(q)


@pytest.mark.parametrize("symmetric", [False, True])
def test_equals_the_loop(symmetric):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))
    loss, cache = info_nce_forward(q, k, temperature=0.3, symmetric=symmetric)
    want = _loop_loss(q, k, 0.3)
    if symmetric:
        want = (want + _loop_loss(k, q, 0.3)) / 2
    assert loss == pytest.approx(want, rel=1e-13)
    g = info_nce_backward(np.float64(1.0), cache)
    S = q @ k.T / 0.3
    P = np.exp(S - S.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    dS = (P - np.eye(6)) / 6
    if symmetric:
        Pt = np.exp(S.T - S.T.max(1, keepdims=True))
        Pt /= Pt.sum(1, keepdims=True)
        dS = (dS + ((Pt - np.eye(6)) / 6).T) / 2
    np.testing.assert_allclose(g["q"], dS @ k / 0.3, atol=1e-13)
    np.testing.assert_allclose(g["k"], dS.T @ q / 0.3, atol=1e-13)


def test_limits():
    rng = np.random.default_rng(1)
    e = rng.standard_normal((8, 16))
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    aligned, _ = info_nce_forward(e, e, temperature=0.01)
    assert aligned < 1e-3  # each query's positive is its own unit vector
    uniform, _ = info_nce_forward(np.zeros((8, 16)), e, temperature=0.1)
    assert uniform == pytest.approx(np.log(8))  # no information: log B
    with pytest.raises(ValueError, match="k"):
        info_nce_forward(e, e[:5])
    with pytest.raises(ValueError, match="temperature"):
        info_nce_forward(e, e, temperature=0.0)
