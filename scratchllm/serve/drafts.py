"""The drafters speculative decoding asks for k proposals a round: another (smaller) model, or
the target's own multi-token-prediction module (lm/mtp.py, DeepSeek-V3's MTP used as a draft,
as DeepSeek-V3 sec. 5.4.3 does).

ModelDraft: the draft model decodes k tokens one at a time through its own cache (forward_rows
on what it has not seen); after a rejection its cache past the accepted prefix is stale and the
next round writes over it.

MTPDraft chains the target's MTP modules 1 .. c (c = depth, default all D of them) as
DeepSeek-V3 trains them (lm/mtp.py). With h^0_p the target's hidden state (before its final
norm) at position p, and module m's enorm, hnorm, projection M_m, Block, norm and the shared
head:
    h^m_p = Block_m(M_m [enorm_m(E t_{p+m}); hnorm_m(h^{m-1}_p)])   causal over p, each
                                                                  module a KV cache of its own
    q(t_{p+m+1} | ...) = softmax(head(norm_m(h^m_p)))
At each round, with L tokens of which the target has seen L - 1 (h^0 known up to p = L - 2),
module m runs positions seen_m .. p and its output at p proposes d_m (the token at index
L + m - 1): module 1 reads the last verified token, module m > 1 reads d_{m-1} and module
m - 1's outputs. Module m's positions 0 .. L - 1 - m had only verified inputs and are kept
(seen_m); the later ones read drafts and are written over by the next round's catch-up.
Beyond c drafts, module c runs one position further each, its own output standing in for
the hidden state it does not have: d_j from Block_c(M_c [enorm_c(E d_{j-1}); hnorm_c(h^c_{p
+ j - c - 1})]) at position p + j - c (c = 1: module 1 alone drafts any k). In the first
round no hidden state exists yet: nothing is proposed.

Glossary: L tokens so far, p a position, D model width, V vocabulary.
"""
from types import SimpleNamespace

import numpy as np

from scratchllm.serve.pool import ContiguousCache
from scratchllm.serve.rows import block_rows, forward_rows


def probs(logits, temperature):
    """softmax(logits / temperature) (V,) float64; temperature 0: one-hot at the argmax."""
    z = np.asarray(logits, np.float64)
    if temperature == 0:
        return np.eye(z.size)[int(np.argmax(z))]
    z = (z - z.max()) / temperature
    p = np.exp(z)
    return p / p.sum()


def draw(p, rng):
    """A token from p (V,): the argmax without rng (greedy), else a sample."""
    return int(np.argmax(p)) if rng is None else int(rng.choice(p.size, p=p))


class ModelDraft:
    """Another model over the same vocabulary, with a cache for `size` tokens."""

    def __init__(self, model, size):
        self.model, self.cache, self.held = model, ContiguousCache(model), 0
        self.cache.add(0, size)

    def propose(self, tokens, k, temperature, rng):
        """k draft tokens after `tokens` and their distributions -> (drafts, qs)."""
        drafts, qs, pending = [], [], tokens[self.held:]  # >= 1 token it has not seen
        for _ in range(k):
            logits = forward_rows(self.model, np.array([pending]), self.cache, [0],
                                  np.array([self.held]))[0, -1]  # (V,)
            self.held += len(pending)
            qs.append(probs(logits, temperature))
            drafts.append(draw(qs[-1], rng))
            pending = drafts[-1:]
        return drafts, qs

    def accepted(self, tokens, hidden, start):
        """After a round: `tokens` now; its cache past tokens[:-1] is stale."""
        self.held = min(self.held, len(tokens) - 1)


class MTPDraft:
    """Modules 1 .. depth of target.mtp chained as the draft (module docstring; depth None:
    all of them), with caches for `size` tokens."""

    def __init__(self, target, size, depth=None):
        if getattr(target, "mtp", None) is None:
            raise ValueError("speculative_generate: draft='mtp' needs a target trained with "
                             "multi-token-prediction modules (train --mtp D, cfg.mtp), and "
                             "this one has none")
        n = len(target.mtp.depths)
        depth = n if depth is None else depth
        if not 1 <= depth <= n:
            raise ValueError(f"speculative_generate: the MTP draft's depth must be 1 .. {n} "
                             f"(the target's modules), got {depth}")
        self.target, self.depth = target, depth
        blocks = [m.block for m in target.mtp.depths[:depth]]  # cache layer k - 1: module k
        self.cache = ContiguousCache(SimpleNamespace(layers=blocks, dtype=target.dtype))
        self.cache.add(0, size)
        # outs[0]: the target's h^0_p (verified); outs[k]: module k's output h^k_p
        self.outs = np.zeros((depth + 1, size, target.cfg.d_model), target.dtype)
        self.n_hidden = 0  # positions whose h^0_p is known
        self.seen = [0] * (depth + 1)  # seen[k]: module k's positions with verified inputs

    def _run(self, k, h_prev, ids_ahead, start):
        """Module k at positions start .. start + t - 1: h_prev (t, D), ids (t,) -> (h^k (t,
        D), logits (t, V))."""
        def run_block(block, a):
            return block_rows(block, k - 1, a, self.cache, [0], np.array([start])), None
        g, logits, _ = self.target.mtp.step(self.target, k, h_prev[None],
                                             np.asarray(ids_ahead)[None], run_block)
        return g[0], logits[0]

    def propose(self, tokens, k, temperature, rng):
        """Up to k drafts after `tokens` (none before the target has run) -> (drafts, qs)."""
        L = len(tokens)
        if k == 0 or L < 2 or self.n_hidden < L - 1:
            return [], []
        p, ext, qs = L - 2, list(tokens), []  # every module's last position; tokens + drafts
        for m in range(1, min(k, self.depth) + 1):  # module m catches up on lo .. p
            lo = self.seen[m]  # h^{m-1} holds lo .. p: module m - 1 just ran up to p
            g, logits = self._run(m, self.outs[m - 1, lo:p + 1], ext[lo + m:p + m + 1], lo)
            self.outs[m, lo:p + 1] = g
            self.seen[m] = max(lo, L - m)  # positions 0 .. L - 1 - m: every input verified
            qs.append(probs(logits[-1], temperature))
            ext.append(draw(qs[-1], rng))
        for j in range(len(qs), k):  # the last module one position further, own output in
            g, logits = self._run(self.depth, g[-1:], ext[-1:], p + j - self.depth + 1)
            qs.append(probs(logits[-1], temperature))
            ext.append(draw(qs[-1], rng))
        return ext[L:], qs

    def accepted(self, tokens, hidden, start):
        """After a round: `tokens` now, the target's hidden states (t, D) of the positions it
        was fed from `start`; those of the first len(tokens) - 1 positions are verified."""
        valid = len(tokens) - 1 - start
        self.outs[0, start:start + valid] = hidden[:valid]
        self.n_hidden = start + valid
