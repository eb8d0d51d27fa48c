"""The drills of scratchllm.linear_attention: recurrent linear attention, a delta-rule step,
an RWKV-7 step."""
import numpy as np

from scratchllm import linear_attention
from scratchllm.teach.drills.bank._common import assert_close, drill, seeded_rng


# ---------------------------------------------------------------------------- recurrent mixers
def _la_inputs():
    r = seeded_rng(21)
    return r.standard_normal((9, 4)), r.standard_normal((9, 4)), r.standard_normal((9, 3))


@drill("linear_attention_recurrent", 10, "scratchllm/linear_attention/linear.py", '''
    def linear_attention_recurrent(q, k, v):
        """Causal linear attention (Katharopoulos et al. 2020) as an RNN, one sequence, one head.

        q, k (T, Dk); v (T, Dv).  Return o (T, Dv).
        Reach: phi(x) = elu(x) + 1 (x + 1 for x > 0, exp(x) otherwise); S = 0 (Dk, Dv), z = 0 (Dk,);
               for each t: S += outer(phi(k_t), v_t);  z += phi(k_t);
                           o_t = phi(q_t) @ S / (phi(q_t) @ z + 1e-6)
        """
''', [
    ("equals scratchllm.linear_attention (parallel form)", lambda fn: _la_vs_library(fn)),
    ("equals the masked quadratic formula", lambda fn: _la_quadratic(fn)),
])
def _linear_attention_recurrent(q, k, v):
    o, _ = linear_attention.linear_attention_forward(q[None, None], k[None, None], v[None, None],
                                                     form="recurrent")
    return o[0, 0]


def _la_vs_library(fn):
    q, k, v = _la_inputs()
    want = linear_attention.linear_attention_forward(q[None, None], k[None, None],
                                                     v[None, None], form="parallel")[0][0, 0]
    return assert_close(fn(q, k, v), want, what="o")


def _la_quadratic(fn):
    q, k, v = _la_inputs()
    fq, fk = (np.where(x > 0, x + 1, np.exp(x)) for x in (q, k))  # elu + 1
    A = np.tril(fq @ fk.T)  # (T, T)
    return assert_close(fn(q, k, v), A @ v / (A.sum(1, keepdims=True) + 1e-6), what="o")


def _delta_inputs(T=7):
    r = seeded_rng(22)
    k = r.standard_normal((T, 4))
    return (r.standard_normal((T, 4)), k / np.linalg.norm(k, axis=1, keepdims=True),
            r.standard_normal((T, 3)), r.uniform(0.1, 0.9, T))


@drill("delta_rule_step", 15, "scratchllm/linear_attention/delta.py", '''
    def delta_rule_step(S, q, k, v, beta):
        """One step of DeltaNet's delta rule (Schlag et al. 2021; Yang et al. 2024).

        S (Dk, Dv) the key -> value memory; q, k (Dk,); v (Dv,); beta a float in (0, 1).
        Return (o (Dv,), S_new (Dk, Dv)).
        Reach: u = S^T k (what the memory holds for k);  S_new = S + beta * outer(k, v - u);
               o = S_new^T q
        """
''', [
    ("T steps equal scratchllm.linear_attention.delta_rule_forward", lambda fn: _delta_seq(fn)),
    ("a unit key written with beta = 1 reads back its value", lambda fn: _delta_recall(fn)),
])
def _delta_rule_step(S, q, k, v, beta):
    o, S_new = linear_attention.delta_rule_step(q[None, None], k[None, None], v[None, None],
                                                np.array([[beta]]), None, S[None, None])
    return o[0, 0], S_new[0, 0]


def _delta_seq(fn):
    q, k, v, beta = _delta_inputs()
    S, outs = np.zeros((4, 3)), []
    for t in range(len(beta)):
        o, S = fn(S, q[t], k[t], v[t], float(beta[t]))
        outs.append(o)
    want = linear_attention.delta_rule_forward(q[None, None], k[None, None], v[None, None],
                                               beta[None, None], chunk=3)[0][0, 0]
    return assert_close(np.stack(outs), want, what="o")


def _delta_recall(fn):
    q, k, v, beta = _delta_inputs()
    S = seeded_rng(23).standard_normal((4, 3))  # whatever the memory held before
    o, _ = fn(S, k[0], k[0], v[0], 1.0)
    return assert_close(o, v[0], what="o read back at the written key")


# ---------------------------------------------------------------------------- rwkv-7
def _rwkv7_inputs(T=6):
    r = seeded_rng(23)
    kappa = r.standard_normal((T, 4))
    return dict(r=r.standard_normal((T, 4)), w=r.uniform(0.5, 0.99, (T, 4)),
                k=r.standard_normal((T, 4)), v=r.standard_normal((T, 3)),
                kappa=kappa / np.linalg.norm(kappa, axis=1, keepdims=True),
                a=r.uniform(0.05, 0.95, (T, 4)))


@drill("rwkv7_step", 15, "scratchllm/linear_attention/rwkv7.py", '''
    def rwkv7_step(S, r, w, k, v, kappa, a):
        """One step of RWKV-7's generalised delta rule (Peng et al. 2025), S (Dk, Dv).

        r, w, k, kappa, a (Dk,): receptance, decay in (0, 1), key, removal key, in-context
        learning rate in (0, 1); v (Dv,).  Return (o (Dv,), S_new (Dk, Dv)).
        Reach: S_new = diag(w) S - outer(a * kappa, kappa @ S) + outer(k, v);  o = S_new^T r
        """
''', [
    ("a sequence of steps equals scratchllm.linear_attention.rwkv7_forward",
     lambda fn: _rwkv7_vs_library(fn)),
    ("w = 1, kappa = k, a = beta, written key beta k: DeltaNet's step",
     lambda fn: _rwkv7_deltanet(fn)),
])
def _rwkv7_step(S, r, w, k, v, kappa, a):
    o, S_new = linear_attention.rwkv7_step(*(x[None, None] for x in (r, w, k, v, kappa, a)),
                                           S[None, None])
    return o[0, 0], S_new[0, 0]


def _rwkv7_vs_library(fn):
    inp = _rwkv7_inputs()
    want, _ = linear_attention.rwkv7_forward(**{n: x[None, None] for n, x in inp.items()})
    S, outs = np.zeros((4, 3)), []
    for t in range(6):
        o, S = fn(S, *(inp[n][t] for n in ("r", "w", "k", "v", "kappa", "a")))
        outs.append(o)
    return assert_close(np.stack(outs), want[0, 0], what="o")


def _rwkv7_deltanet(fn):
    inp = _rwkv7_inputs()
    S, kh, beta = seeded_rng(24).standard_normal((4, 3)), inp["kappa"][0], 0.3
    o, S_new = fn(S, inp["r"][0], np.ones(4), beta * kh, inp["v"][0], kh, np.full(4, beta))
    want_o, want_S = linear_attention.delta_rule_step(
        inp["r"][0][None, None], kh[None, None], inp["v"][0][None, None],
        np.array([[beta]]), None, S[None, None])
    assert_close(S_new, want_S[0, 0], what="S_new")
    return assert_close(o, want_o[0, 0], what="o")
