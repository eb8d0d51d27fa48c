"""The drafters speculative decoding asks for k proposals a round: another (smaller) model, or
the target's own multi-token-prediction module (lm/mtp.py, DeepSeek-V3's MTP used as a draft,
as DeepSeek-V3 sec. 5.4.3 does).

ModelDraft: the draft model decodes k tokens one at a time through its own cache (forward_rows
on what it has not seen); after a rejection its cache past the accepted prefix is stale and the
next round writes over it.

MTPDraft, with h_p the target's hidden state (before its final norm) at position p and module 1
of the target's MTP (its enorm, hnorm, projection M, Block, norm and the shared head):
    g_p  = Block(M [enorm(E t_{p+1}); hnorm(h_p)])     causal over p, a KV cache of its own
    q(t_{p+2} | ...) = softmax(head(norm(g_p)))
At each round, with L tokens of which the target has seen L - 1 (its hidden states known up to
position L - 2), module 1 catches up on the positions it has not seen (exact: the inputs are
verified) and its output at p = L - 2 proposes d_1 (the token at index L). Later proposals
reuse module 1 one position further each, its own output standing in for the target's hidden
state it does not have yet:  d_j from Block(M [enorm(E d_{j-1}); hnorm(g_{p+j-2})]) at
position p + j - 1 (so one trained module drafts any k; further modules of a deeper MTP only
train the trunk here). Those speculative positions of the module's cache are written over by
the next round's catch-up. In the first round no hidden state exists yet: nothing is proposed.

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
    """Module 1 of target.mtp as the draft (module docstring), with caches for `size`
    tokens."""

    def __init__(self, target, size):
        if getattr(target, "mtp", None) is None:
            raise ValueError("speculative_generate: draft='mtp' needs a target trained with "
                             "multi-token-prediction modules (train --mtp D, cfg.mtp), and "
                             "this one has none")
        self.target, self.module = target, target.mtp.depths[0]
        self.cache = ContiguousCache(SimpleNamespace(layers=[self.module.block],
                                                     dtype=target.dtype))
        self.cache.add(0, size)
        self.hidden = np.zeros((size, target.cfg.d_model), target.dtype)  # h_p, verified
        self.n_hidden = 0  # positions whose h_p is known
        self.n_seen = 0    # positions the module has seen with verified inputs

    def _run(self, h_prev, ids_ahead, start):
        """Module 1 at positions start .. start + t - 1: h_prev (t, D), ids (t,) -> (g (t, D),
        logits (t, V))."""
        def run_block(block, a):
            return block_rows(block, 0, a, self.cache, [0], np.array([start])), None
        g, logits, _ = self.target.mtp.step(self.target, 1, h_prev[None],
                                             np.asarray(ids_ahead)[None], run_block)
        return g[0], logits[0]

    def propose(self, tokens, k, temperature, rng):
        """Up to k drafts after `tokens` (none before the target has run) -> (drafts, qs)."""
        L = len(tokens)
        if k == 0 or L < 2 or self.n_hidden < L - 1:
            return [], []
        lo, hi = self.n_seen, L - 1  # catch up on positions lo .. L - 2 (inputs verified)
        g, logits = self._run(self.hidden[lo:hi], tokens[lo + 1:hi + 1], lo)
        self.n_seen = hi
        drafts, qs = [], []
        for j in range(k):
            qs.append(probs(logits[-1], temperature))
            drafts.append(draw(qs[-1], rng))
            if j + 1 < k:  # module 1 one position further, its own output as the hidden
                g, logits = self._run(g[-1:], drafts[-1:], hi + j)
        return drafts, qs

    def accepted(self, tokens, hidden, start):
        """After a round: `tokens` now, the target's hidden states (t, D) of the positions it
        was fed from `start`; those of the first len(tokens) - 1 positions are verified."""
        valid = len(tokens) - 1 - start
        self.hidden[start:start + valid] = hidden[:valid]
        self.n_hidden = start + valid
