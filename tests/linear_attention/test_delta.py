"""The delta rule and gated DeltaNet: the papers' loop == the recurrent form == the WY chunked
form (several chunk sizes, ragged T) == the parallel form, every form's backward, decoding ==
the full forward, float32 with strong gates and writes, and what the rule means (a key written
with β = 1 is recalled exactly)."""
import numpy as np
import pytest

from grads.check import check
from scratchllm.linear_attention import (delta_rule_backward, delta_rule_forward,
                                         delta_rule_recurrent, delta_rule_recurrent_ref,
                                         delta_rule_step)

FORMS = [dict(form="recurrent"), dict(form="parallel")] + [
    dict(form="chunked", chunk=c) for c in (1, 3, 4, 16)]


def rel(a, b):
    return np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300)


def inputs(rng, B=2, H=3, T=13, Dk=5, Dv=4, gated=True):
    k = rng.standard_normal((B, H, T, Dk))
    return dict(q=rng.standard_normal((B, H, T, Dk)), k=k / np.linalg.norm(k, axis=-1,
                                                                            keepdims=True),
                v=rng.standard_normal((B, H, T, Dv)), beta=rng.uniform(0.05, 1.0, (B, H, T)),
                g=np.log(rng.uniform(0.5, 1.0, (B, H, T))) if gated else None)


@pytest.mark.parametrize("gated", [False, True])
def test_every_form_equals_the_papers_loop(gated):
    a = inputs(np.random.default_rng(0), gated=gated)
    want, S_want = delta_rule_recurrent_ref(**a)
    o, S = delta_rule_recurrent(**a)
    assert rel(o, want) < 1e-12 and rel(S, S_want) < 1e-12
    for form in FORMS:
        assert rel(delta_rule_forward(**a, **form)[0], want) < 1e-12, form


def test_a_key_written_with_beta_one_is_recalled_exactly():
    rng = np.random.default_rng(1)
    a = inputs(rng, B=1, H=1, T=6, Dk=8, Dv=3, gated=False)
    a["beta"][:] = 1.0
    a["k"][0, 0, 5] = a["k"][0, 0, 2]  # rewrite key 2 at the last step
    a["q"][0, 0, 5] = a["k"][0, 0, 2]  # ... and read it back
    o = delta_rule_forward(**a, form="chunked", chunk=4)[0]
    assert rel(o[0, 0, 5], a["v"][0, 0, 5]) < 1e-12  # the new value replaced the old one


@pytest.mark.parametrize("form", [dict(form="recurrent"), dict(form="parallel"),
                                  dict(form="chunked", chunk=3)])
@pytest.mark.parametrize("gated", [False, True])
def test_backward_of_every_form(form, gated):
    rng = np.random.default_rng(2)
    a = inputs(rng, B=2, H=2, T=7, Dk=3, Dv=5, gated=gated)
    report = check(delta_rule_forward, delta_rule_backward, rng=rng, **a, **form)
    assert report.ok, report
    assert {r.input for r in report.rows} == {"q", "k", "v", "beta"} | ({"g"} if gated else set())


def test_backwards_of_the_forms_agree():
    rng = np.random.default_rng(3)
    a = inputs(rng)
    do = rng.standard_normal(a["v"].shape)
    grads = [delta_rule_backward(do, delta_rule_forward(**a, **f)[1]) for f in FORMS]
    for other in grads[1:]:
        for name in ("q", "k", "v", "beta", "g"):
            assert rel(other[name], grads[0][name]) < 1e-10, name


def test_decoding_steps_equal_the_full_forward():
    a = inputs(np.random.default_rng(4))
    full = delta_rule_forward(**a)[0]
    state, outs = None, []
    for t in range(a["q"].shape[2]):
        o_t, state = delta_rule_step(*(a[n][:, :, t] for n in ("q", "k", "v", "beta", "g")),
                                     state)
        outs.append(o_t)
    assert rel(np.stack(outs, axis=2), full) < 1e-12 and state.shape == (2, 3, 5, 4)


def test_float32_long_sequence_strong_gates_stays_finite():
    rng = np.random.default_rng(5)
    a = inputs(rng, B=1, H=2, T=400, Dk=8, Dv=4)
    a["g"] = -rng.uniform(0, 20.0, (1, 2, 400))  # per-step decay down to e^-20
    a["beta"] = rng.uniform(0.9, 1.0, (1, 2, 400))
    want = delta_rule_forward(**a, form="recurrent")[0]
    a32 = {n: x.astype(np.float32) for n, x in a.items()}
    o, cache = delta_rule_forward(**a32, form="chunked", chunk=32)
    g = delta_rule_backward(rng.standard_normal(o.shape).astype(np.float32), cache)
    assert o.dtype == np.float32 and np.all(np.isfinite(o)) and rel(o, want) < 1e-4
    assert all(x.dtype == np.float32 and np.all(np.isfinite(x)) for x in g.values())


def test_bad_input():
    a = inputs(np.random.default_rng(6))
    with pytest.raises(ValueError, match="delta_rule: beta has shape"):
        delta_rule_forward(**{**a, "beta": a["beta"][..., :3]})
    with pytest.raises(ValueError, match="delta_rule: form must be one of"):
        delta_rule_forward(**a, form="wy")
