"""A tiny embedding model trained for retrieval: a bidirectional encoder (MaskedLM's trunk,
LM.encode), mean pooling, L2 normalisation and the InfoNCE loss with in-batch negatives
(core/pooling.py, core/contrastive.py), on a synthetic task where a query and its document
share no token, so only training can bring them together.

    e = pool(encode(ids)),   ê = e / |e|,   L = InfoNCE(ê_q, ê_d; τ)   (symmetric)
    backward of the normalisation:  de = (dê − ê (ê·dê)) / |e|

The task: topic k owns 4 query tokens and 4 other document tokens (and 16 noise tokens are
shared by all); a query is 5 of its topic's query tokens and 1 noise token, its document 8 of
the topic's document tokens and 2 noise tokens. A batch holds one pair per topic, so no
in-batch negative shares the positive's topic. Retrieval accuracy: the share of held-out
queries whose nearest document (cosine) is their own, among one document per topic (chance
1/16).

Glossary: B pairs, T time, D width, τ temperature.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.contrastive import info_nce_backward, info_nce_forward
from scratchllm.core.optim import AdamW
from scratchllm.core.pooling import pool_backward, pool_forward
from scratchllm.lm.encoder import MaskedLM, masked_lm_config

N_TOPICS, PER_TOPIC, N_NOISE = 16, 4, 16
VOCAB = 2 * N_TOPICS * PER_TOPIC + N_NOISE  # query tokens, document tokens, noise


def topic_pairs(rng, topics):
    """(queries (B, 6), documents (B, 10)) ids, one pair per topic in `topics` (B,)."""
    def draw(topic, offset, n_own, n_noise):
        own = offset + topic * PER_TOPIC + rng.integers(0, PER_TOPIC, n_own)  # (n_own,)
        noise = 2 * N_TOPICS * PER_TOPIC + rng.integers(0, N_NOISE, n_noise)
        return rng.permutation(np.concatenate([own, noise]))
    q = np.stack([draw(k, 0, 5, 1) for k in topics])  # (B, 6)
    d = np.stack([draw(k, N_TOPICS * PER_TOPIC, 8, 2) for k in topics])  # (B, 10)
    return q, d


class SentenceCache(NamedTuple):
    encoder: tuple
    pool: tuple
    e: np.ndarray     # (B, D) before the normalisation
    norm: np.ndarray  # (B, 1) |e|


def sentence_embedding(model, ids):
    """ids (B, T) -> (ê (B, D) unit rows, cache): mean-pooled, L2-normalised."""
    h, c_enc = model.encode(ids)  # (B, T, D)
    e, c_pool = pool_forward(h, kind="mean")  # (B, D)
    n = np.linalg.norm(e, axis=1, keepdims=True)  # (B, 1)
    return e / n, SentenceCache(c_enc, c_pool, e, n)


def sentence_embedding_grads(model, dhat, cache):
    """Param grads (+=) of sentence_embedding, given dê (B, D)."""
    c_enc, c_pool, e, n = cache
    u = e / n  # (B, D)
    de = (dhat - u * np.sum(u * dhat, axis=1, keepdims=True)) / n  # fwd: ê = e / |e|
    model.encode_backward(pool_backward(de, c_pool)["h"], c_enc)  # fwd: e = pool(encode(ids))


def retrieval_accuracy(model, queries, docs):
    """Share of queries whose most similar document (cosine) is their own row's."""
    sim = sentence_embedding(model, queries)[0] @ sentence_embedding(model, docs)[0].T  # (B, B)
    return float(np.mean(np.argmax(sim, axis=1) == np.arange(len(queries))))


def train_embedder(steps=150, *, seed=0, temperature=0.1, lr=3e-3):
    """Train a 1-layer encoder (D 32) on topic_pairs with symmetric InfoNCE; returns (model,
    accuracy before, accuracy after) on 4 held-out sets of one pair per topic."""
    rng = np.random.default_rng(seed)
    model = MaskedLM(masked_lm_config(VOCAB, 32, 1, 2, 64), rng=rng, dtype=np.float64)
    held_out = [topic_pairs(np.random.default_rng([seed, 1, i]), np.arange(N_TOPICS))
                for i in range(4)]

    def accuracy():
        return float(np.mean([retrieval_accuracy(model, q, d) for q, d in held_out]))

    before = accuracy()
    opt = AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(steps):
        q, d = topic_pairs(rng, rng.permutation(N_TOPICS))
        eq, cq = sentence_embedding(model, q)  # (B, D)
        ed, cd = sentence_embedding(model, d)  # (B, D)
        _, c_loss = info_nce_forward(eq, ed, temperature=temperature, symmetric=True)
        g = info_nce_backward(np.asarray(1.0), c_loss)
        model.zero_grad()
        sentence_embedding_grads(model, g["q"], cq)
        sentence_embedding_grads(model, g["k"], cd)
        opt.step()
    return model, before, accuracy()
