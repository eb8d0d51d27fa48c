"""Linear attention, RetNet and GLA: the plain loop == the recurrent form == the parallel form ==
the chunked form (several chunk sizes, ragged T), every form's backward against finite
differences and against the others, decoding == the full forward, float32 under huge gates."""
import numpy as np
import pytest

from grads.check import check
from scratchllm.linear_attention import (
    gla_attention_backward, gla_attention_forward, gla_attention_recurrent,
    gla_attention_recurrent_ref, gla_attention_step, linear_attention_backward,
    linear_attention_forward, linear_attention_recurrent, linear_attention_recurrent_ref,
    linear_attention_step, retnet_attention_backward, retnet_attention_forward,
    retnet_attention_recurrent, retnet_attention_recurrent_ref, retnet_attention_step,
    retnet_gammas)

FORMS = [dict(form="recurrent"), dict(form="parallel")] + [
    dict(form="chunked", chunk=c) for c in (1, 3, 4, 16)]  # T = 13: ragged for 3 and 4


def rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def qkv(rng, B=2, H=3, T=13, Dk=5, Dv=4, dtype=np.float64):
    return [rng.standard_normal(s).astype(dtype) for s in ((B, H, T, Dk), (B, H, T, Dk),
                                                           (B, H, T, Dv))]


def direct_gla(q, k, v, g):
    """o_t = Σ_{s≤t} Σ_i q_t[i] k_s[i] Π_{s<r≤t} α_r[i] v_s, by explicit products (no cumsum)."""
    B, H, T, Dk = q.shape
    alpha = np.exp(g if g.ndim == 4 else np.repeat(g[..., None], Dk, axis=-1))
    o = np.zeros(v.shape)
    for t in range(T):
        for s in range(t + 1):
            decay = np.prod(alpha[:, :, s + 1:t + 1], axis=2)  # (B, H, Dk)
            o[:, :, t] += (q[:, :, t] * k[:, :, s] * decay).sum(-1)[..., None] * v[:, :, s]
    return o


def gates(rng, kind, B=2, H=3, T=13, Dk=5):
    shape = (B, H, T, Dk) if kind == "channel" else (B, H, T)
    return np.log(rng.uniform(0.5, 1.0, shape))  # log α in (log 0.5, 0)


# ---------------------------------------------------------------------------- equivalences
@pytest.mark.parametrize("kind", ["channel", "head"])
def test_gla_every_form_equals_the_direct_sum(kind):
    rng = np.random.default_rng(0)
    q, k, v = qkv(rng)
    g = gates(rng, kind)
    want = direct_gla(q, k, v, g)
    o_ref, S_ref = gla_attention_recurrent_ref(q, k, v, g)
    o_rec, S_rec = gla_attention_recurrent(q, k, v, g)
    assert rel(o_ref, want) < 1e-12 and rel(o_rec, want) < 1e-12 and rel(S_rec, S_ref) < 1e-12
    for form in FORMS:
        assert rel(gla_attention_forward(q, k, v, g, **form)[0], want) < 1e-12, form


@pytest.mark.parametrize("feature,normalize", [("elu", True), ("elu", False),
                                               ("identity", False)])
def test_linear_attention_forms_equal_the_quadratic_formula(feature, normalize):
    rng = np.random.default_rng(1)
    q, k, v = qkv(rng)
    phi = (lambda x: np.where(x > 0, x + 1, np.exp(x))) if feature == "elu" else (lambda x: x)
    A = np.tril(np.einsum("bhti,bhsi->bhts", phi(q), phi(k)))  # (B, H, T, T) masked
    want = A @ v / (A.sum(-1, keepdims=True) + 1e-6) if normalize else A @ v
    opts = dict(feature=feature, normalize=normalize)
    assert rel(linear_attention_recurrent_ref(q, k, v, **opts)[0], want) < 1e-12
    assert rel(linear_attention_recurrent(q, k, v, **opts)[0], want) < 1e-12
    for form in FORMS:
        assert rel(linear_attention_forward(q, k, v, **opts, **form)[0], want) < 1e-12, form


def test_retnet_forms_equal_the_decay_mask_formula():
    rng = np.random.default_rng(2)
    q, k, v = qkv(rng)
    gamma = np.array([0.9, 0.5, 0.99])
    T = q.shape[2]
    t, s = np.arange(T)[:, None], np.arange(T)[None, :]
    M = np.where(s <= t, gamma[:, None, None] ** np.maximum(t - s, 0), 0)  # (H, T, T)
    want = (np.einsum("bhti,bhsi->bhts", q, k) * M) @ v
    assert rel(retnet_attention_recurrent_ref(q, k, v, gamma)[0], want) < 1e-12
    assert rel(retnet_attention_recurrent(q, k, v, gamma)[0], want) < 1e-12
    for form in FORMS:
        assert rel(retnet_attention_forward(q, k, v, gamma, **form)[0], want) < 1e-12, form
    assert np.allclose(retnet_gammas(3), [1 - 1 / 32, 1 - 1 / 64, 1 - 1 / 128])


# ---------------------------------------------------------------------------- gradients
def _small(rng):
    return qkv(rng, B=2, H=2, T=7, Dk=3, Dv=5)


@pytest.mark.parametrize("form", [dict(form="recurrent"), dict(form="parallel"),
                                  dict(form="chunked", chunk=3)])
@pytest.mark.parametrize("kind", ["channel", "head", None])
def test_gla_backward_of_every_form(form, kind):
    rng = np.random.default_rng(3)
    q, k, v = _small(rng)
    g = None if kind is None else gates(rng, kind, 2, 2, 7, 3)
    report = check(gla_attention_forward, gla_attention_backward, rng=rng, q=q, k=k, v=v, g=g,
                   **form)
    assert report.ok, report
    assert {r.input for r in report.rows} == ({"q", "k", "v"} | ({"g"} if kind else set()))


def test_backwards_of_the_forms_agree():
    rng = np.random.default_rng(4)
    q, k, v = qkv(rng)
    g = gates(rng, "channel")
    do = rng.standard_normal(v.shape)
    grads = [gla_attention_backward(do, gla_attention_forward(q, k, v, g, **f)[1])
             for f in FORMS]
    for other in grads[1:]:
        for name in ("q", "k", "v", "g"):
            assert rel(other[name], grads[0][name]) < 1e-11, name


@pytest.mark.parametrize("form", [dict(form="recurrent"), dict(form="chunked", chunk=4)])
@pytest.mark.parametrize("feature,normalize", [("elu", True), ("identity", False),
                                               ("elu", False)])
def test_linear_attention_backward(form, feature, normalize):
    rng = np.random.default_rng(5)
    q, k, v = _small(rng)
    report = check(linear_attention_forward, linear_attention_backward, rng=rng, q=q, k=k, v=v,
                   feature=feature, normalize=normalize, **form)
    assert report.ok, report


@pytest.mark.parametrize("form", [dict(form="recurrent"), dict(form="chunked", chunk=2)])
def test_retnet_backward_including_gamma(form):
    rng = np.random.default_rng(6)
    q, k, v = _small(rng)
    report = check(retnet_attention_forward, retnet_attention_backward, rng=rng, q=q, k=k, v=v,
                   gamma=np.array([0.7, 0.95]), **form)
    assert report.ok, report
    assert "gamma" in {r.input for r in report.rows}


# ---------------------------------------------------------------------------- decoding
def test_decoding_steps_equal_the_full_forward():
    rng = np.random.default_rng(7)
    q, k, v = qkv(rng)
    g = gates(rng, "channel")
    gamma = np.array([0.9, 0.5, 0.99])
    full = [gla_attention_forward(q, k, v, g)[0], linear_attention_forward(q, k, v)[0],
            retnet_attention_forward(q, k, v, gamma)[0]]
    states, steps = [None] * 3, [[], [], []]
    for t in range(q.shape[2]):
        qt, kt, vt = q[:, :, t], k[:, :, t], v[:, :, t]
        outs = [gla_attention_step(qt, kt, vt, g[:, :, t], states[0]),
                linear_attention_step(qt, kt, vt, states[1]),
                retnet_attention_step(qt, kt, vt, gamma, states[2])]
        for i, (o_t, st) in enumerate(outs):
            steps[i].append(o_t)
            states[i] = st
    for f, s in zip(full, steps):
        assert rel(np.stack(s, axis=2), f) < 1e-12
    assert states[0].shape == (2, 3, 5, 4) and states[1].shape == (2, 3, 5, 5)  # [S | z]


# ---------------------------------------------------------------------------- float32
def test_float32_huge_gates_stay_finite_and_match_float64():
    rng = np.random.default_rng(8)
    T = 300
    q, k, v = qkv(rng, B=1, H=2, T=T, Dk=4, Dv=3)
    g = -rng.uniform(0, 30.0, (1, 2, T, 4))  # α down to e^-30 per step, cumulative e^-4500
    g[..., :50, :] = 0.0  # and long stretches of α = 1
    want = gla_attention_forward(q, k, v, g, form="chunked", chunk=32)[0]
    for form in (dict(form="parallel"), dict(form="chunked", chunk=64)):
        args = [a.astype(np.float32) for a in (q, k, v, g)]
        o, cache = gla_attention_forward(*args, **form)
        grads = gla_attention_backward(rng.standard_normal(o.shape).astype(np.float32), cache)
        assert o.dtype == np.float32 and np.all(np.isfinite(o))
        assert all(np.all(np.isfinite(x)) and x.dtype == np.float32 for x in grads.values())
        assert rel(o, want) < 1e-4


# ---------------------------------------------------------------------------- bad input
def test_bad_input_names_the_function_and_argument():
    rng = np.random.default_rng(9)
    q, k, v = _small(rng)
    with pytest.raises(ValueError, match="gla_attention: g has shape"):
        gla_attention_forward(q, k, v, np.zeros((2, 2, 7, 4)))
    with pytest.raises(ValueError, match="linear_attention: form must be one of"):
        linear_attention_forward(q, k, v, form="fast")
    with pytest.raises(ValueError, match="linear_attention: feature must be one of"):
        linear_attention_forward(q, k, v, feature="relu")
    with pytest.raises(ValueError, match="retnet_attention: gamma must lie in"):
        retnet_attention_forward(q, k, v, np.array([0.5, 1.5]))
    with pytest.raises(ValueError, match="gla_attention: chunk must be > 0"):
        gla_attention_forward(q, k, v, None, chunk=0)
    with pytest.raises(ValueError, match="v has shape"):
        gla_attention_forward(q, k, v[:, :1], None)
