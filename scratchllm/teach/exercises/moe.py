"""Ex. 2 and Ex. 3 (the MoE chapter): the balance-loss bound Σ f_i P_i ≥ 1/E as an identity
checked on 10,000 random routers, and expert choice's balance by construction, checked on
scratchllm.moe.expert_choice_forward. Both proofs are also cells of notebook 05.

Glossary: E experts, K top-k, BT tokens, C tokens per expert (capacity), f_i routed fraction
of the BT·K slots, P_i mean router probability.
"""
import math
from typing import NamedTuple

import numpy as np

from scratchllm import moe
from scratchllm.core import ops
from scratchllm.specs import ExpertsSpec, MoESpec, RouterSpec
from scratchllm.teach.drills.bank import assert_close
from scratchllm.teach.exercises.core import exercise, rng as _rng


# ---------------------------------------------------------------------------- Ex. 2
class Router(NamedTuple):
    f: np.ndarray     # (E,) routed fraction of the BT·K slots
    P: np.ndarray     # (E,) mean router probability
    loss: float       # the library's balance_loss_forward = E Σ f_i P_i


def _router(probs, topk_idx):
    loss, cache = moe.balance_loss_forward(probs, topk_idx)
    return Router(cache.f, probs.mean(axis=0), float(loss))


N_ROUTERS, BLOCK = 10_000, 100


def random_routers(rng, n=N_ROUTERS, block=BLOCK):
    """n random softmax routers, `block` at a time sharing BT in [1, 32], E in [2, 8] and
    K in [1, E], each at its own temperature: [(f, P)], the first of each block also through
    scratchllm.moe.balance_loss_forward (AssertionError unless it agrees)."""
    out = []
    for _ in range(n // block):
        E = int(rng.integers(2, 9))
        BT, K = int(rng.integers(1, 33)), int(rng.integers(1, E + 1))
        logits = rng.standard_normal((block, BT, E)) * rng.uniform(0.1, 5, (block, 1, 1))
        probs = np.exp(logits - logits.max(-1, keepdims=True))  # (R, BT, E)
        probs /= probs.sum(-1, keepdims=True)
        topk = np.argsort(-probs, axis=-1, kind="stable")[..., :K]  # (R, BT, K)
        f = (topk[..., None] == np.arange(E)).sum(axis=(1, 2)) / (BT * K)  # (R, E)
        P = probs.mean(axis=1)  # (R, E)
        lib = _router(probs[0], topk[0])
        assert_close(lib.loss, E * f[0] @ P[0], tol=1e-12, what="balance_loss_forward")
        out += list(zip(f, P))
    return out


def _gap_identity(fn):
    worst, below, ordered = 0.0, 0, 0
    for f, P in random_routers(_rng(20)):
        E = len(f)
        gap, direct = fn(f, P), float(f @ P) - 1 / E
        worst = max(worst, abs(direct - gap))
        if (np.subtract.outer(f, f) * np.subtract.outer(P, P) >= 0).all():
            ordered += 1
            if not gap >= -1e-15:
                raise AssertionError(f"similarly ordered f={f}, P={P} gave gap {gap:.3e}")
        below += direct < -1e-15
    if not worst < 1e-12:
        raise AssertionError(f"Σ f_i P_i - 1/E differs from your gap by {worst:.2e} "
                             f"on {N_ROUTERS:,} random routers")
    return (f"{N_ROUTERS:,} routers: identity to {worst:.0e}; {ordered:,} similarly ordered, "
            f"all >= 1/E; {below:,} fall below 1/E")


def _gap_at_f_equals_p(fn):
    rng = _rng(21)
    for E in (2, 3, 5, 8):
        u = np.full(E, 1 / E)
        if abs(fn(u, u)) > 1e-15:
            raise AssertionError(f"gap(uniform, uniform) = {fn(u, u):.2e} for E={E}, not 0")
        for _ in range(200):
            P = rng.dirichlet(np.ones(E) * rng.uniform(0.2, 5))
            assert_close(fn(P, P), np.sum(P * P) - 1 / E, tol=1e-10, what="gap(P, P)")
            if not fn(P, P) > 0:
                raise AssertionError(f"gap(P, P) = {fn(P, P)} for non-uniform P = {P}")
    return "Σ P_i² - 1/E > 0 for 800 non-uniform P, 0 at uniform"


def _gap_counterexample(fn):
    eps = 1e-3
    probs = np.array([[0.5 + eps, 0.5 - eps], [0.5 + eps, 0.5 - eps], [eps, 1 - eps]])
    r = _router(probs, np.argmax(probs, axis=1)[:, None])  # f = (2/3, 1/3), P ≈ (1/3, 2/3)
    assert_close(fn(r.f, r.P), r.loss / 2 - 0.5, tol=1e-10, what="gap of the counterexample")
    if not fn(r.f, r.P) < 0:
        raise AssertionError("the counterexample's gap must be negative (Σ f_i P_i ≈ 4/9 < 1/2)")
    f = np.array([0.5, 0.5])
    if abs(fn(f, np.array([0.9, 0.1]))) > 1e-15:
        raise AssertionError("f uniform gives Σ f_i P_i = 1/E for any P: the gap must be 0")
    return f"Σ f_i P_i = {r.loss / 2:.4f} < 1/2; f uniform, P skewed: gap 0"


@exercise(2, "the balance loss is smallest at balance: Σ f_i P_i ≥ 1/E",
          "05_moe_balance_loss", '''
    The Switch balance loss is E·Σ_i f_i P_i (f_i the fraction of routing slots sent to expert
    i, P_i the mean router probability of i; Σ f = Σ P = 1). Show Σ_i f_i P_i ≥ 1/E, with
    equality iff f = P = uniform. Write the proof's key identity as
    balance_gap(f, P) = Σ_i f_i P_i - 1/E expressed as a sum over pairs of experts, and say
    exactly when the bound holds: is it true for every router?
''', '''
    Multiply 1/E by (Σ_i f_i)(Σ_j P_j) = 1 and expand Σ_{i,j} (f_i - f_j)(P_i - P_j).
    Then try f = P, and then a router whose argmax counts disagree with its mean probabilities.
''', '''
    Identity. Σ_{i,j} (f_i - f_j)(P_i - P_j) = 2E Σ_i f_i P_i - 2 (Σ_i f_i)(Σ_j P_j)
        = 2E Σ_i f_i P_i - 2,   so   Σ_i f_i P_i - 1/E = (1/2E) Σ_{i,j} (f_i - f_j)(P_i - P_j).
    (a) f = P (the soft surrogate, or a router whose counts follow its probabilities): the gap
        is (1/2E) Σ_{i,j} (P_i - P_j)² ≥ 0, zero iff every P_i is equal. So Σ P_i² ≥ 1/E
        with equality iff f = P = uniform (Cauchy-Schwarz: 1 = (Σ P_i)² ≤ E Σ P_i²).
    (b) f and P similarly ordered (f_i > f_j => P_i ≥ P_j): every term is ≥ 0, so the bound
        holds (Chebyshev's sum inequality). Equality needs every term 0: f uniform is enough,
        for ANY P (f = (1/2, 1/2), P = (0.9, 0.1) gives exactly 1/2), so "iff uniform" needs f = P.
    (c) Not for every router. Three tokens, two experts, top-1: p = (0.5+ε, 0.5-ε) twice and
        (ε, 1-ε) once give f = (2/3, 1/3), P ≈ (1/3, 2/3) and Σ f_i P_i ≈ 4/9 < 1/2. Of the
        check's 10,000 random routers (random BT, E, K, temperature) 649 fall below 1/E;
        none of the 5,431 similarly ordered ones do. f carries no gradient, so the loss
        pushes P against the current counts; balance, f = P = uniform, is where that stops.
''', '''
    def balance_gap(f, P):
        """f, P (E,) nonnegative, each summing to 1.  Return Σ_i f_i P_i - 1/E written as a
        sum over pairs (i, j) of experts (the identity the proof rests on)."""
''', [
    ("identity on 10,000 random routers (scratchllm.moe.balance_loss_forward's f, P)",
     _gap_identity),
    ("f = P: gap = Σ P_i² - 1/E ≥ 0, zero only at uniform", _gap_at_f_equals_p),
    ("a router below 1/E, and equality with f uniform", _gap_counterexample),
])
def _balance_gap(f, P):
    E = len(f)
    return float(np.sum(np.subtract.outer(f, f) * np.subtract.outer(P, P)) / (2 * E))


# ---------------------------------------------------------------------------- Ex. 3
def _expert_choice_run(rng, BT, E, D=6, F=5, capacity_factor=2.0, skew=0.0):
    """The library's expert_choice_forward on random weights: (token_idx (E, C) from its
    cache, probs (BT, E), C, x, w_router)."""
    x = rng.standard_normal((BT, D))
    w_router = rng.standard_normal((D, E))
    w_router[:, 0] += skew * np.sign(x.mean(axis=0))  # skew > 0: every token prefers expert 0
    w1, w3 = rng.standard_normal((E, D, F)), rng.standard_normal((E, D, F))
    _, cache = moe.expert_choice_forward(x, w_router, w1, w3, rng.standard_normal((E, F, D)),
                                         capacity_factor=capacity_factor)
    probs = ops.softmax_forward(x @ w_router)[0]  # (BT, E)
    return cache.token_idx, probs, min(BT, math.ceil(capacity_factor * BT / E)), x, w_router


def _ec_random(fn):
    rng = _rng(30)
    for BT, E, c in [(12, 3, 1.0), (17, 4, 2.0), (9, 5, 1.5), (20, 8, 0.5), (5, 2, 4.0)]:
        token_idx, probs, C, _, _ = _expert_choice_run(rng, BT, E, capacity_factor=c)
        load, loss = fn(token_idx, probs)
        if not np.array_equal(np.asarray(load), np.full(E, C)):
            raise AssertionError(f"BT={BT}, E={E}, c={c}: loads {load}, expected {C} each")
        if any(len(set(row)) != C for row in token_idx):
            raise AssertionError("an expert took the same token twice")
        assert_close(loss, 1.0, tol=1e-12, what=f"balance loss (BT={BT}, E={E}, c={c})")
    return "5 routers: every expert exactly C tokens, loss 1 to 1e-12"


def _ec_collapsed(fn):
    rng = _rng(31)
    token_idx, probs, C, x, w_router = _expert_choice_run(rng, 16, 4, skew=20.0)
    w = moe.MoEWeights(w_router, None, *(rng.standard_normal(s) for s in
                                         ((4, 6, 5), (4, 6, 5), (4, 5, 6))))
    spec = MoESpec(RouterSpec(4, 1), ExpertsSpec(d_ff=5), capacity_factor=2.0)
    out, tc = moe.moe_forward(x, w, spec=spec)
    C_tc = moe.capacity_of(16, 1, 4, 2.0)  # ceil(c·BT·K/E) = 8
    if not tc.tokens_per_expert.max() > C_tc or not float(out.aux) > 1.5:
        raise AssertionError("the collapsed router should overflow token choice")
    load, loss = fn(token_idx, probs)
    if not np.array_equal(np.asarray(load), np.full(4, C)):
        raise AssertionError(f"expert choice loads {load}, expected {C} each")
    assert_close(loss, 1.0, tol=1e-12, what="balance loss")
    return (f"token choice: {tc.tokens_per_expert.max()} slots for capacity {C_tc}, "
            f"loss {float(out.aux):.2f}; expert choice: {C} each, loss {loss:.12f}")


@exercise(3, "expert choice never exceeds capacity; its balance loss is 1",
          "05_moe_balance_loss", '''
    In expert-choice routing (Zhou et al. 2022, arXiv 2202.09368) each expert takes its top
    C = min(BT, ceil(c·BT/E)) tokens by router probability. Show that no expert ever exceeds
    capacity and that the Switch balance loss E·Σ_i f_i P_i equals 1 for every router, by
    construction. Write expert_choice_balance(token_idx, probs) -> (load per expert, loss)
    and check it on scratchllm.moe.expert_choice_forward's choices.
''', '''
    Count the routing slots: how many does each expert fill, and how many are there in all?
''', '''
    Expert i fills exactly C slots (its top-C column entries), so load_i = C ≤ capacity: there
    is nothing to drop, whatever the router. There are E·C slots in all, so
    f_i = C / (E·C) = 1/E for every i, and  L = E·Σ_i (1/E)·P_i = Σ_i P_i = 1,  because each
    token's probabilities sum to 1. The loss is a constant: its gradient is zero, and it needs
    none. Contrast token choice: a collapsed router sends every slot to one expert (loads over
    capacity, loss → E). The price of expert choice: a token may get 0 experts or several, and
    whether it is picked depends on the other tokens in the batch, the future included (not
    causal).
''', '''
    def expert_choice_balance(token_idx, probs):
        """token_idx (E, C) ints: the tokens each expert chose; probs (BT, E) router
        probabilities.  Return (load (E,) ints: slots filled per expert, loss: the balance
        loss E Σ_i f_i P_i with f_i = load_i / (total slots) and P_i = mean_n probs[n, i])."""
''', [
    ("scratchllm.moe.expert_choice_forward: loads == C, loss == 1", _ec_random),
    ("a collapsed router: token choice overflows, expert choice does not", _ec_collapsed),
])
def _expert_choice_balance(token_idx, probs):
    E = probs.shape[1]
    load = np.bincount(np.repeat(np.arange(E), token_idx.shape[1]), minlength=E)  # (E,)
    f = load / load.sum()  # (E,)
    return load, float(E * np.dot(f, probs.mean(axis=0)))
