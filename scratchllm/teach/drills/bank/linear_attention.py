"""The drills of scratchllm.linear_attention: recurrent linear attention, a delta-rule step."""
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
