"""Router collapse undone by the balance loss alone: an 8-expert top-2 softmax router that
starts imbalanced (one expert takes 25% of the routing slots, twice its share 1/E) is trained
on the Switch balance loss L = E sum_i f_i P_i (Fedus et al. 2021, arXiv 2101.03961, eq. 4)
and nothing else, for 300 AdamW steps on fixed random tokens.

The imbalance comes from a constant input feature whose router weight favours expert 0,
set by bisection so that expert 0 takes 25% of the slots. The gradient (moe/losses.py)
lowers the logit of every expert whose load f_j is above the probability-weighted mean.
"""
import numpy as np

from scratchllm.core import AdamW, Param
from scratchllm.experiments.base import Experiment, Outcome, pick
from scratchllm.moe import (RouterOut, balance_loss_backward, balance_loss_forward,
                            router_backward, router_forward)
from scratchllm.specs import RouterSpec

_NAME = "collapse"
_CLAIM = ("trained on the balance loss alone, a router that starts with one expert at 25% of "
         "the slots ends with every expert within a few percent of 1/E")
E, K, D = 8, 2, 16


def loads(x, w, spec):
    """Share of the routing slots per expert (E,) under router weights w."""
    out, _ = router_forward(x, w, spec=spec)
    return np.bincount(out.topk_idx.ravel(), minlength=spec.n_experts) / out.topk_idx.size


def _imbalanced(x, w, spec, share):
    """w with w[0, 0] (the constant feature's weight on expert 0) set so that expert 0 takes
    `share` of the slots (bisection)."""
    lo, hi = 0.0, 20.0
    for _ in range(50):
        w[0, 0] = (lo + hi) / 2
        lo, hi = (w[0, 0], hi) if loads(x, w, spec)[0] < share else (lo, w[0, 0])
    return w


def _run(mode, seed):
    steps = pick(mode, 40, 300, 300)
    BT = pick(mode, 512, 4096, 16384)
    lr = 0.01
    rng = np.random.default_rng(seed)
    spec = RouterSpec(n_experts=E, top_k=K)
    x = rng.standard_normal((BT, D))  # (BT, D)
    x[:, 0] = 1.0  # the constant feature
    w = _imbalanced(x, 0.1 * rng.standard_normal((D, E)), spec, 0.25)
    before = loads(x, w, spec)
    p = Param(w)
    opt = AdamW([p], lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        out, cache = router_forward(x, p.data, spec=spec)
        loss, c_bal = balance_loss_forward(out.probs, out.topk_idx)
        dprobs = balance_loss_backward(np.asarray(1.0), c_bal)["probs"]  # fwd: L(P, f)
        dout = RouterOut(np.zeros_like(out.gates), None, dprobs, None)
        p.grad[...] = router_backward(dout, cache)["w_router"]  # fwd: probs = router(x, w)
        opt.step()
        losses.append(float(loss))
    after = loads(x, p.data, spec)
    worst = float(np.abs(after - 1 / E).max() * E)
    rows = [f"{'expert':<8}{'before':>9}{'after':>9}"]
    rows += [f"{i:<8}{b:>9.3f}{a:>9.3f}" for i, (b, a) in enumerate(zip(before, after))]
    rows.append(f"{'1/E':<8}{1 / E:>9.3f}{1 / E:>9.3f}")
    holds = "holds" if worst < 0.1 else "does not hold here"
    verdict = (f"after {steps} steps the largest deviation from 1/E is {100 * worst:.1f}% of "
               f"1/E (balance loss {losses[0]:.4f} -> {losses[-1]:.4f}): the claim {holds}")
    config = dict(n_experts=E, top_k=K, d_model=D, tokens=BT, steps=steps, lr=lr,
                  start_share=0.25)
    metrics = dict(load_before=before, load_after=after, balance_loss=losses)
    return Outcome(metrics, config, "\n".join(rows), verdict)


def _figure(fig, outcome):
    ax = fig.subplots()
    m = outcome.metrics
    idx = np.arange(E)
    ax.bar(idx - 0.2, m["load_before"], 0.4, label="before")
    ax.bar(idx + 0.2, m["load_after"], 0.4, label="after")
    ax.axhline(1 / E, ls="--", c="gray", label="1/E")
    ax.set(xlabel="expert", ylabel="share of routing slots", title="router collapse undone")
    ax.legend()


COLLAPSE = Experiment(_NAME, _CLAIM, _run, _figure)
