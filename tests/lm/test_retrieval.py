"""Encoder heads: mean and [CLS] pooling and the sequence head against loops, a cross-encoder
reranker's listwise loss, LM.encode's backward against finite differences, and the tiny
embedding model: retrieval accuracy from chance to 1 after 60 InfoNCE steps."""
import numpy as np
import pytest

from scratchllm.core import (HeadWeights, cross_entropy_backward, cross_entropy_forward,
                             pool_forward, sequence_head_backward, sequence_head_forward)
from scratchllm.lm import MaskedLM, masked_lm_config
from scratchllm.lm.retrieval import sentence_embedding, sentence_embedding_grads, train_embedder


def test_pooling_and_the_head_against_loops():
    rng = np.random.default_rng(0)
    h = rng.standard_normal((3, 5, 4))
    mask = np.array([[1, 1, 0, 1, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)
    e, _ = pool_forward(h, mask, kind="mean")
    for b in range(3):
        np.testing.assert_allclose(e[b], np.mean([h[b, t] for t in range(5) if mask[b, t]], 0))
    np.testing.assert_array_equal(pool_forward(h, kind="cls")[0], h[:, 0])
    w = HeadWeights(rng.standard_normal((4, 2)), rng.standard_normal(2))
    logits, _ = sequence_head_forward(h, w, mask, kind="mean")
    np.testing.assert_allclose(logits, e @ w.W + w.b, atol=1e-14)
    with pytest.raises(ValueError, match="rows \\[0\\] have no token"):
        pool_forward(h, np.zeros((3, 5), bool) | (np.arange(3)[:, None] > 0), kind="mean")
    with pytest.raises(ValueError, match="kind='cls' reads the first token only"):
        pool_forward(h, mask, kind="cls")


def test_a_reranker_scores_each_pair_and_learns_by_softmax_over_the_candidates():
    """Q queries with G candidates each (the positive first): one score per (query,
    document) sequence, CE over each query's G scores; its gradient on the scores is
    (softmax − onehot) / Q, so the positive's score goes up and the others' down."""
    rng = np.random.default_rng(1)
    Q, G, T, D = 2, 3, 4, 5
    h = rng.standard_normal((Q * G, T, D))  # an encoder's output on "[CLS] q [SEP] d"
    w = HeadWeights(rng.standard_normal((D, 1)), np.zeros(1))
    scores, c_head = sequence_head_forward(h, w, kind="cls")  # (Q·G, 1)
    loss, c_ce = cross_entropy_forward(scores.reshape(Q, G), np.zeros(Q, int))
    s = scores.reshape(Q, G)
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert float(loss) == pytest.approx(-np.mean(np.log(p[:, 0])), abs=1e-14)
    ds = cross_entropy_backward(np.asarray(1.0), c_ce)["logits"]  # (Q, G)
    np.testing.assert_allclose(ds, (p - np.eye(G)[0]) / Q, atol=1e-15)
    g = sequence_head_backward(ds.reshape(Q * G, 1), c_head)
    np.testing.assert_allclose(g["w"].W[:, 0], h[:, 0].T @ ds.reshape(-1), atol=1e-14)


def test_encode_backward_is_the_gradient_of_the_embedding():
    rng = np.random.default_rng(2)
    model = MaskedLM(masked_lm_config(11, 8, 1, 2, 12), rng=rng, dtype=np.float64)
    ids = rng.integers(0, 11, (3, 5))
    r = rng.standard_normal((3, 8))
    e, cache = sentence_embedding(model, ids)
    model.zero_grad()
    sentence_embedding_grads(model, r, cache)
    params = [p for p in model.parameters() if p is not model.head.W]  # the head is unused
    dirs = [rng.standard_normal(p.data.shape) for p in params]
    analytic = sum(np.sum(p.grad * u) for p, u in zip(params, dirs))

    def loss(sign, eps=1e-6):
        for p, u in zip(params, dirs):
            p.data += sign * eps * u
        value = np.sum(r * sentence_embedding(model, ids)[0])
        for p, u in zip(params, dirs):
            p.data -= sign * eps * u
        return value
    numeric = (loss(1) - loss(-1)) / 2e-6
    assert abs(numeric - analytic) < 1e-7 * abs(numeric)
    assert not model.head.W.grad.any()


def test_a_tiny_embedding_model_learns_to_retrieve():
    _, before, after = train_embedder(60, seed=0)
    assert before < 0.25 and after >= 0.95  # chance is 1/16


def test_the_embed_command_prints_accuracy_before_and_after(capsys):
    from scratchllm import cli
    assert cli.main(["embed", "--steps", "3", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "16 topics, chance 0.062" in out and "after 3 steps" in out
