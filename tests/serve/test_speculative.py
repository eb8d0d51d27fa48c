"""Speculative decoding: greedy output equals the target's greedy output exactly; sampled
output follows the target's distribution (a chi-square test over many draws on a 4-token
vocabulary), and the same test rejects a deliberately wrong acceptance rule."""
import numpy as np
import pytest
from scipy.stats import chisquare

from grads.cases import LM_TINY, lm_tiny
from scratchllm.lm import LM, generate_ids
from scratchllm.serve import speculative, speculative_generate


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculation_equals_the_targets_greedy_output(k):
    target = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    draft = LM(lm_tiny("dense", n_layers=1), rng=np.random.default_rng(1), dtype=np.float64)
    rng = np.random.default_rng(2)
    for n in (1, 2, 9):
        prompt = [int(t) for t in rng.integers(0, LM_TINY["vocab_size"], n)]
        ids, stats = speculative_generate(target, draft, prompt, 11, k=k)
        assert ids == list(generate_ids(target, prompt, 11, None, temperature=0.0))
        assert 0 <= stats["accepted"] <= stats["proposed"]
    ids, stats = speculative_generate(target, target, prompt, 11, k=k)  # a perfect draft
    assert stats["accepted"] == stats["proposed"] and stats["rounds"] == -(-11 // (k + 1))


def _two_token_counts(target, draft, n, seed):
    """Counts of the first two sampled tokens (4 x 4 cells) over n draws, and their exact
    probabilities under the target."""
    rng = np.random.default_rng(seed)
    counts = np.zeros((4, 4))
    for _ in range(n):
        ids, _ = speculative_generate(target, draft, [1], 2, k=2, temperature=0.7, rng=rng)
        counts[ids[0], ids[1]] += 1
    def probs(ids):
        z = target.forward(np.array([ids]))[0][0, -1] / 0.7
        return np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    p1 = probs([1])
    exact = np.stack([p1[a] * probs([1, a]) for a in range(4)])  # (4, 4)
    return counts.ravel(), exact.ravel()


def test_sampled_speculation_follows_the_target_and_a_wrong_rule_fails(monkeypatch):
    cfg = dict(vocab_size=4)
    target = LM(lm_tiny("dense", **cfg), rng=np.random.default_rng(3), dtype=np.float64)
    draft = LM(lm_tiny("dense", n_layers=1, **cfg), rng=np.random.default_rng(4),
               dtype=np.float64)
    for p in draft.parameters():
        p.data = p.data * 3  # a draft whose distributions differ clearly from the target's
    counts, exact = _two_token_counts(target, draft, 400, seed=5)
    assert chisquare(counts, exact * counts.sum()).pvalue > 1e-3
    monkeypatch.setattr(speculative, "accept_draft", lambda p, q, token, u: True)
    counts, exact = _two_token_counts(target, draft, 400, seed=5)
    assert chisquare(counts, exact * counts.sum()).pvalue < 1e-6  # the draft's distribution


def test_bad_arguments():
    target = LM(lm_tiny("dense"), rng=np.random.default_rng(0), dtype=np.float64)
    other = LM(lm_tiny("dense", vocab_size=5), rng=np.random.default_rng(0), dtype=np.float64)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(target, other, [1], 3)
    with pytest.raises(ValueError, match="train --mtp"):
        speculative_generate(target, "mtp", [1], 3)
    with pytest.raises(ValueError, match="a model, 'mtp' or 'mtp:N'"):
        speculative_generate(target, "eagle", [1], 3)
    with pytest.raises(ValueError, match="needs rng"):
        speculative_generate(target, target, [1], 3, temperature=1.0)
    assert speculative_generate(target, target, [1], 0)[0] == []


def _mtp_target(depth=1, **kw):
    from dataclasses import replace

    from scratchllm.specs import MTPSpec
    cfg = replace(lm_tiny("dense", **kw), mtp=MTPSpec(depth))
    return LM(cfg, rng=np.random.default_rng(0), dtype=np.float64)


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_mtp_drafting_equals_the_targets_greedy_output(k):
    target = _mtp_target()
    prompt = [3, 1, 4, 1, 5]
    ids, stats = speculative_generate(target, "mtp", prompt, 12, k=k)
    assert ids == list(generate_ids(target, prompt, 12, None, temperature=0.0))
    assert stats["proposed"] > 0 and 0 <= stats["accepted"] <= stats["proposed"]


def test_the_mtp_drafts_first_proposal_is_module_1_on_the_full_sequence():
    """The draft's cached catch-up equals MTP.step on the whole sequence from position 0:
    its first proposal each round is the module's argmax at position L - 2."""
    from scratchllm.serve import MTPDraft
    target = _mtp_target()
    tokens = [3, 1, 4, 1, 5, 9, 2]
    h = target.forward(np.array([tokens[:-1]]))[1].last  # (1, L - 1, D)
    _, logits, _ = target.mtp.step(target, 1, h, np.array([tokens[1:]]))
    draft = MTPDraft(target, 32)
    draft.accepted(tokens[:4], h[0, :3], 0)  # a first round saw 3 positions
    draft.propose(tokens[:4], 1, 0.0, None)
    draft.accepted(tokens, h[0, 3:], 3)  # the next round saw the rest
    drafts, qs = draft.propose(tokens, 2, 0.0, None)
    assert drafts[0] == int(np.argmax(logits[0, -1]))


def _mtp_samples(depth, n_new, k, cells, draws, seed):
    """A 4-token-vocabulary target with `depth` MTP modules made unlike it; over `draws` runs
    of speculative_generate(target, "mtp", [1], n_new, k=k) at temperature 0.7, the counts
    (4, 4) of ids[cells[0]], ids[cells[1]], the drafts proposed, and the target's law
    p(next | ids) at that temperature."""
    target = _mtp_target(depth=depth, vocab_size=4)
    for p in target.mtp.parameters():
        p.data = p.data * 3  # a draft clearly unlike the target
    rng = np.random.default_rng(seed)
    counts, proposed = np.zeros((4, 4)), 0
    for _ in range(draws):
        ids, stats = speculative_generate(target, "mtp", [1], n_new, k=k, temperature=0.7,
                                          rng=rng)
        counts[ids[cells[0]], ids[cells[1]]] += 1
        proposed += stats["proposed"]

    def law(ids):
        z = target.forward(np.array([ids]))[0][0, -1] / 0.7
        return np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    return counts, proposed, law


def test_sampled_mtp_speculation_follows_the_target():
    """Prompt [1], three tokens, k = 1: the first comes from the target alone (no hidden state
    yet), the second through an MTP proposal and the acceptance rule: their pair law is the
    target's."""
    counts, proposed, law = _mtp_samples(1, 3, 1, (0, 1), 300, seed=7)
    exact = np.stack([law([1])[a] * law([1, a]) for a in range(4)]).ravel()
    assert proposed >= 300 and chisquare(counts.ravel(), exact * 300).pvalue > 1e-3


@pytest.mark.parametrize("draft,k", [("mtp", 2), ("mtp", 3), ("mtp", 5), ("mtp:2", 4)])
def test_greedy_chained_mtp_drafting_equals_the_targets_greedy_output(draft, k):
    target = _mtp_target(depth=3)
    prompt = [3, 1, 4, 1, 5]
    ids, stats = speculative_generate(target, draft, prompt, 13, k=k)
    assert ids == list(generate_ids(target, prompt, 13, None, temperature=0.0))
    assert stats["proposed"] > 0 and 0 <= stats["accepted"] <= stats["proposed"]


def test_chained_mtp_drafts_are_modules_1_to_d_on_the_full_sequence():
    """Module m's proposal at position L - 2 equals MTP.step m on the whole sequence from
    position 0 (module m - 1's outputs and the tokens m places ahead, the drafts included),
    its distribution to 1e-12, after two rounds of cached catch-up; past D, module D runs one
    position further on its own output."""
    from scratchllm.serve import MTPDraft
    target = _mtp_target(depth=3)
    tokens = [3, 1, 4, 1, 5, 9, 2]
    h0 = target.forward(np.array([tokens[:-1]]))[1].last  # (1, L - 1, D)
    draft = MTPDraft(target, 32)
    draft.accepted(tokens[:4], h0[0, :3], 0)  # a first round saw 3 positions
    draft.propose(tokens[:4], 3, 1.0, np.random.default_rng(0))
    draft.accepted(tokens, h0[0, 3:], 3)  # the next round saw the rest
    drafts, qs = draft.propose(tokens, 4, 1.0, np.random.default_rng(1))
    ext, hs, L = tokens + drafts, [h0], len(tokens)
    for m in (1, 2, 3):
        h, logits, _ = target.mtp.step(target, m, hs[-1], np.array([ext[m:L - 1 + m]]))
        hs.append(h)
        z = logits[0, -1] - logits[0, -1].max()
        np.testing.assert_allclose(qs[m - 1], np.exp(z) / np.exp(z).sum(), rtol=0, atol=1e-12)
    # the fourth: module 3 at position L - 1 reading d_3 and its own output at L - 2
    h_in = np.concatenate([hs[2], hs[3][:, -1:]], axis=1)  # (1, L, D)
    _, logits, _ = target.mtp.step(target, 3, h_in, np.array([ext[3:L + 3]]))
    z = logits[0, -1] - logits[0, -1].max()
    np.testing.assert_allclose(qs[3], np.exp(z) / np.exp(z).sum(), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="depth must be 1 .. 3"):
        MTPDraft(target, 32, depth=4)


@pytest.mark.slow
def test_sampled_chained_mtp_speculation_follows_the_target():
    """Two MTP modules chained, k = 2, prompt [1], four tokens: the first from the target
    alone, the next two proposed by modules 1 and 2 and kept by the acceptance rule: the law
    of tokens 2 and 3 (summed over the first) is the target's."""
    counts, proposed, law = _mtp_samples(2, 4, 2, (1, 2), 400, seed=8)
    exact = sum(law([1])[a] * np.outer(law([1, a]), np.ones(4)) *
                np.stack([law([1, a, b]) for b in range(4)]) for a in range(4)).ravel()
    assert proposed >= 800 and chisquare(counts.ravel(), exact * 400).pvalue > 1e-3
