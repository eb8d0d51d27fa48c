"""Speculative decoding (Leviathan et al. 2023, arXiv 2211.17192; Chen et al. 2023, arXiv
2302.01318): a cheap draft proposes k tokens one at a time, the target scores all of them in
one call, and rejection sampling keeps the output distributed exactly as the target's.

One round, with tokens so far x (the target holds all but the last):
    draft:   d_i ~ q_i = q(. | x, d_<i)            i = 1..k   (k draft calls)
    target:  p_1 .. p_{k+1} = p(. | x, d_<i)       one forward_rows call over [x_last, d_1..d_k]
    accept d_i with probability min(1, p_i(d_i) / q_i(d_i)), in order; at the first
    rejection emit a token from the residual norm(max(0, p_i - q_i)) and stop; if all k are
    accepted emit one more from p_{k+1}. (Greedy, temperature 0: accept while d_i =
    argmax p_i, else emit argmax p_i: the target's own greedy tokens exactly.)
Each emitted token is distributed as the target's next-token distribution: P(emit y) =
min(q(y), p(y)) + (1 - sum_z min(q(z), p(z))) * norm(max(0, p - q))(y) = p(y).
A rejection leaves stale keys past the accepted prefix in both caches; the next round writes
over them (forward_rows reads only the first starts + t tokens of each sequence). The draft is
another model or the target's own MTP module (serve/drafts.py); any draft distribution q
keeps the output exact, only the acceptance rate depends on it.

Glossary: k draft tokens per round, V vocabulary, p target, q draft distributions.
"""
import numpy as np

from scratchllm.serve.drafts import MTPDraft, ModelDraft, draw, probs
from scratchllm.serve.pool import ContiguousCache
from scratchllm.serve.rows import rows_supported, trunk_rows


def accept_draft(p, q, token, u):
    """The acceptance rule: keep the draft's `token` when u < p(token) / q(token) (u uniform
    on [0, 1)); with one-hot p and q (greedy) it keeps exactly the target's argmax."""
    return u * q[token] < p[token]


def residual(p, q):
    """The distribution to draw from after a rejection: norm(max(0, p - q)) (V,)."""
    r = np.maximum(p - q, 0.0)
    return r / r.sum() if r.sum() > 0 else p


def mtp_depth(draft):
    """The MTP modules a draft string chains: "mtp" -> None (all), "mtp:N" -> N; False for
    any other string."""
    if draft == "mtp":
        return None
    head, _, n = draft.partition(":")
    return int(n) if head == "mtp" and n.isdigit() else False


def _check(target, draft, prompt, max_new_tokens, k, temperature, rng):
    if isinstance(draft, str) and mtp_depth(draft) is False:
        raise ValueError(f"speculative_generate: draft must be a model, 'mtp' or 'mtp:N', "
                         f"got {draft!r}")
    if not prompt or k < 1 or max_new_tokens < 0 or temperature < 0:
        raise ValueError(f"speculative_generate: need a non-empty prompt, k >= 1, "
                         f"max_new_tokens >= 0, temperature >= 0; got {len(prompt)} tokens, "
                         f"k={k}, {max_new_tokens}, {temperature}")
    if not isinstance(draft, str) and target.cfg.vocab_size != draft.cfg.vocab_size:
        raise ValueError(f"speculative_generate: the target's vocabulary ({target.cfg.vocab_size}"
                         f") and the draft's ({draft.cfg.vocab_size}) differ")
    if temperature > 0 and rng is None:
        raise ValueError("speculative_generate: sampling (temperature > 0) needs rng")
    for name, m in (("target", target), ("draft", draft)):
        if not isinstance(m, str) and not rows_supported(m):
            raise ValueError(f"speculative_generate: the {name} needs attention layers that "
                             f"decode_rows serves")


def speculative_generate(target, draft, prompt, max_new_tokens, *, k=4, temperature=0.0,
                         rng=None):
    """max_new_tokens tokens after `prompt` from `target`, proposed k at a time by `draft`.

    Inputs:  target an LM (attention layers decode_rows serves); draft an LM over the same
             vocabulary, or "mtp": the target's own multi-token-prediction modules 1 .. D
             chained (a target trained with train --mtp D; "mtp:N" chains the first N, and
             module N drafts on past N: drafts.MTPDraft); prompt a non-empty list of ids; k >= 1;
             temperature 0 (greedy: the target's own greedy ids) or > 0 (sampled: the
             target's distribution, with rng a numpy Generator).
    Returns: (ids, stats) with stats["accepted"] draft tokens kept of stats["proposed"],
             stats["rounds"] target calls after the prompt.
    """
    _check(target, draft, prompt, max_new_tokens, k, temperature, rng)
    rng = rng if temperature > 0 else None
    size = len(prompt) + max_new_tokens + k + 1
    drafter = MTPDraft(target, size, mtp_depth(draft)) if isinstance(draft, str) \
        else ModelDraft(draft, size)
    cache = ContiguousCache(target)
    cache.add(0, size)
    tokens, held = list(prompt), 0  # the tokens the target's cache holds
    stats = dict(accepted=0, proposed=0, rounds=0)
    end = len(prompt) + max_new_tokens
    while len(tokens) < end:
        kk = min(k, end - len(tokens) - 1)  # the last round may propose fewer
        drafts, qs = drafter.propose(tokens, kk, temperature, rng)
        kk = len(drafts)
        start = held
        hidden = trunk_rows(target, np.array([tokens[held:] + drafts]), cache, [0],
                            np.array([held]))  # (1, n + kk, D)
        logits = target.unembed(hidden[:, -(kk + 1):])[0]  # (kk + 1, V)
        ps = [probs(z, temperature) for z in logits]  # (kk + 1) x (V,)
        n_ok = 0
        for p, q, d in zip(ps, qs, drafts):
            if not accept_draft(p, q, d, 0.0 if rng is None else rng.random()):
                break
            n_ok += 1
        emit = ps[n_ok] if n_ok == kk else residual(ps[n_ok], qs[n_ok])
        tokens += drafts[:n_ok] + [draw(emit, rng)]
        held = len(tokens) - 1  # the rest of what it was fed is stale
        drafter.accepted(tokens, hidden[0], start)
        stats["accepted"] += n_ok
        stats["proposed"] += kk
        stats["rounds"] += 1
    return tokens[len(prompt):], stats
