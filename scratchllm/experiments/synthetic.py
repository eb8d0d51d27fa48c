"""The synthetic tasks of the recall and needle experiments, and the loop that trains a model
on one with a loss only where the task asks something.

A task draws (ids, targets), both (B, T) ints, targets IGNORE (-100) wherever nothing is
asked; the loss is the cross-entropy over the asked positions (LM.loss skips IGNORE), and the
accuracy is the share of asked positions where the argmax of the logits is the target.

    multi-query associative recall (Arora et al. 2023, "Zoology", arXiv 2312.04927):
        k1 v1 k2 v2 ... kn vn  q1 a1 q2 a2 ...   (q a key seen before, a its value: asked)
    copying (Jelassi et al. 2024, "Repeat After Me", arXiv 2402.01032):
        filler  COPY  x1 ... xn  COPY  x1 ... xn  (the second copy asked; n varies)
    needle: filler tokens, one needle token at distance d before the end, then QUERY:
        the needle is asked at the QUERY.
"""

import numpy as np
from tqdm import tqdm

from scratchllm.core import clip_grad_norm, cosine_schedule
from scratchllm.core.blas import one_blas_thread
from scratchllm.train.settings import Settings
from scratchllm.train.trainer import make_optimizer

IGNORE = -100


def _asked(seq, ask):
    """(ids, targets) of next-token prediction on seq (B, T + 1), targets IGNORE where ask
    (B, T) is False."""
    return seq[:, :-1], np.where(ask, seq[:, 1:], IGNORE)


def recall_batch(rng, batch, seq_len, n_pairs, n_keys):
    """Multi-query associative recall: keys in [0, n_keys), values in [n_keys, 2 n_keys);
    n_pairs distinct keys with their values, then queries of those keys up to seq_len, each
    followed by its value (the value asked at the query). -> (ids, targets) (batch, seq_len)."""
    if not 0 < n_pairs <= n_keys or 2 * n_pairs + 2 > seq_len:
        raise ValueError(f"recall_batch: need 0 < n_pairs <= n_keys and room for a query "
                         f"(2 n_pairs + 2 <= seq_len); got n_pairs={n_pairs}, "
                         f"n_keys={n_keys}, seq_len={seq_len}")
    n_queries = (seq_len + 1 - 2 * n_pairs + 1) // 2
    keys = np.argsort(rng.random((batch, n_keys)), axis=1)[:, :n_pairs]  # distinct per row
    values = rng.integers(n_keys, 2 * n_keys, (batch, n_pairs))
    pick = rng.integers(0, n_pairs, (batch, n_queries))
    rows = np.arange(batch)[:, None]
    pairs = np.stack([keys, values], -1).reshape(batch, -1)  # (B, 2n): k1 v1 k2 v2 ...
    queries = np.stack([keys[rows, pick], values[rows, pick]], -1).reshape(batch, -1)
    seq = np.concatenate([pairs, queries], 1)[:, :seq_len + 1]  # (B, T + 1)
    t = np.arange(seq_len)
    ask = (t >= 2 * n_pairs) & ((t - 2 * n_pairs) % 2 == 0)  # at each query key
    return _asked(seq, np.broadcast_to(ask, (batch, seq_len)))


def copy_batch(rng, batch, seq_len, n_symbols, copy_token):
    """Copying: filler symbols, COPY, n symbols, COPY, the same n symbols again (each asked
    from the second COPY on), n drawn per row from [seq_len / 4, (seq_len - 2) / 2]: the copy
    sits a varying distance back, so no fixed offset does the job (it takes an induction head
    or a state that holds the whole span). Symbols in [0, n_symbols).
    -> (ids, targets) (batch, seq_len)."""
    if seq_len < 8:
        raise ValueError(f"copy_batch: seq_len must be >= 8, got {seq_len}")
    seq = rng.integers(0, n_symbols, (batch, seq_len + 1))
    ask = np.zeros((batch, seq_len), bool)
    for b, n in enumerate(rng.integers(seq_len // 4, (seq_len - 2) // 2 + 1, batch)):
        start = seq_len + 1 - (2 * n + 2)  # the first COPY
        seq[b, start + n + 2:] = seq[b, start + 1:start + n + 1]
        seq[b, [start, start + n + 1]] = copy_token
        ask[b, start + n + 1:] = True  # from the second COPY on
    return _asked(seq, ask)


def needle_batch(rng, batch, seq_len, depths, n_fill, n_needles):
    """The needle: seq_len - 1 filler tokens of [0, n_fill), one of them replaced by a needle
    of [n_fill, n_fill + n_needles) at distance depths[b] before the QUERY token
    n_fill + n_needles, which ends the sequence and asks for the needle. depths (batch,)
    ints in [1, seq_len - 1]. -> (ids, targets) (batch, seq_len)."""
    depths = np.asarray(depths)
    if depths.shape != (batch,) or depths.min() < 1 or depths.max() > seq_len - 1:
        raise ValueError(f"needle_batch: depths must be {batch} ints in [1, {seq_len - 1}], "
                         f"got shape {depths.shape}, range [{depths.min()}, {depths.max()}]")
    seq = rng.integers(0, n_fill, (batch, seq_len + 1))
    needle = rng.integers(n_fill, n_fill + n_needles, batch)
    rows = np.arange(batch)
    seq[rows, seq_len - 1 - depths] = needle
    seq[:, seq_len - 1] = n_fill + n_needles  # QUERY
    seq[:, seq_len] = needle  # what the QUERY asks
    ask = np.arange(seq_len) == seq_len - 1
    return _asked(seq, np.broadcast_to(ask, (batch, seq_len)))


def accuracy(model, ids, targets):
    """Share of the asked positions (targets != IGNORE) where the argmax is the target (run
    with one BLAS thread)."""
    with one_blas_thread():
        logits, _ = model.forward(ids)  # (B, T, V)
    asked = targets != IGNORE
    return float((logits.argmax(-1)[asked] == targets[asked]).mean())


def train_task(model, sample, steps, lr, desc="train", on_step=None):
    """AdamW (weight decay 0.01, warmup min(30, steps), cosine to lr / 10, clip 1) on the
    loss over the asked positions of sample(step) -> (ids, targets), with one BLAS thread
    (restored after); on_step(step), if given, runs after each update (a probe along
    training). Returns the losses."""
    s = Settings(steps=steps, lr=lr, warmup=min(30, steps), weight_decay=0.01)
    opt = make_optimizer(model, s)
    losses = []
    with one_blas_thread():  # small matrices: a second BLAS thread costs more than it brings
        for step in tqdm(range(1, steps + 1), desc=desc, leave=False, mininterval=1.0):
            ids, targets = sample(step)
            model.zero_grad()
            loss, cache = model.loss(ids, targets)
            model.loss_backward(1.0, cache)
            clip_grad_norm(model.parameters(), s.clip)
            opt.lr = cosine_schedule(step, s.lr, s.lr / 10, s.warmup, steps)
            opt.step()
            losses.append(float(loss))
            if on_step is not None:
                on_step(step)
    return losses
