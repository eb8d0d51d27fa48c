"""RWKV-7's generalised delta rule: the vectorised scan and the chunked form against the
paper-orientation loop with the transition matrix written out, the decoding step against the full forward, DeltaNet
as its special case, and the backward against the loop differentiated step by step."""
import numpy as np
import pytest

from scratchllm.linear_attention import (delta_rule_forward, rwkv7_backward, rwkv7_forward,
                                         rwkv7_recurrent, rwkv7_recurrent_ref, rwkv7_step)


def _inputs(rng, B=2, H=3, T=9, Dk=4, Dv=5):
    kappa = rng.standard_normal((B, H, T, Dk))
    return dict(r=rng.standard_normal((B, H, T, Dk)), w=rng.uniform(0.5, 0.99, (B, H, T, Dk)),
                k=rng.standard_normal((B, H, T, Dk)), v=rng.standard_normal((B, H, T, Dv)),
                kappa=kappa / np.linalg.norm(kappa, axis=-1, keepdims=True),
                a=rng.uniform(0.05, 0.95, (B, H, T, Dk)))


def test_forms_agree():
    inp = _inputs(np.random.default_rng(0))
    o, _ = rwkv7_forward(**inp)
    o_ref, final_ref = rwkv7_recurrent_ref(**inp)
    o_rec, final = rwkv7_recurrent(**inp)
    np.testing.assert_allclose(o, o_ref, atol=1e-12)
    np.testing.assert_allclose(o_rec, o_ref, atol=1e-12)
    np.testing.assert_allclose(final, final_ref, atol=1e-12)
    state, outs = None, []  # decoding, one token at a time
    for t in range(9):
        o_t, state = rwkv7_step(*(inp[n][:, :, t] for n in ("r", "w", "k", "v", "kappa", "a")),
                                state)
        outs.append(o_t)
    np.testing.assert_allclose(np.stack(outs, axis=2), o_ref, atol=1e-12)


@pytest.mark.parametrize("chunk", [1, 3, 4, 9, 16])
def test_chunked_form_equals_the_loop(chunk):
    inp = _inputs(np.random.default_rng(chunk))
    o, cache = rwkv7_forward(**inp, form="chunked", chunk=chunk)
    np.testing.assert_allclose(o, rwkv7_recurrent_ref(**inp)[0], atol=1e-12)
    do = np.random.default_rng(5).standard_normal(o.shape)
    g, g_rec = rwkv7_backward(do, cache), rwkv7_backward(do, rwkv7_forward(**inp)[1])
    for name in g:
        np.testing.assert_allclose(g[name], g_rec[name], atol=1e-12, err_msg=name)


def test_deltanet_is_the_special_case():
    """w = 1, κ = k̂, a = β (every channel), written key β k̂: S = (I − β k̂ k̂ᵀ) S + β k̂ vᵀ."""
    rng = np.random.default_rng(1)
    B, H, T, Dk, Dv = 2, 2, 8, 4, 3
    q, v = rng.standard_normal((B, H, T, Dk)), rng.standard_normal((B, H, T, Dv))
    k = rng.standard_normal((B, H, T, Dk))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    beta = rng.uniform(0.1, 0.9, (B, H, T))
    want, _ = delta_rule_forward(q, k, v, beta, form="recurrent")
    got, _ = rwkv7_forward(q, np.ones_like(k), beta[..., None] * k, v, k,
                           np.broadcast_to(beta[..., None], k.shape).copy())
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_backward_equals_finite_differences_of_the_loop():
    rng = np.random.default_rng(2)
    inp = _inputs(rng, B=1, H=1, T=4, Dk=2, Dv=3)
    o, cache = rwkv7_forward(**inp)
    do = rng.standard_normal(o.shape)
    g = rwkv7_backward(do, cache)
    for name in inp:
        x, h = inp[name], 1e-6
        num = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus, minus = {**inp, name: x.copy()}, {**inp, name: x.copy()}
            plus[name][idx] += h
            minus[name][idx] -= h
            num[idx] = np.sum((rwkv7_recurrent_ref(**plus)[0] - rwkv7_recurrent_ref(**minus)[0])
                              * do) / (2 * h)
        np.testing.assert_allclose(g[name], num, atol=1e-8, err_msg=name)


def test_errors():
    inp = _inputs(np.random.default_rng(3))
    with pytest.raises(ValueError, match="form"):
        rwkv7_forward(**inp, form="parallel")
    with pytest.raises(ValueError, match="kappa"):
        rwkv7_forward(**{**inp, "kappa": inp["kappa"][..., :3]})
    o, cache = rwkv7_forward(**inp)
    with pytest.raises(ValueError, match="do"):
        rwkv7_backward(o[..., :2], cache)
