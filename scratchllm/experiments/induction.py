"""Induction heads form in a 2-layer attention-only model (Olsson et al. 2022, "In-context
Learning and Induction Heads", arXiv 2209.11895; Elhage et al. 2021).

Task: sequences r r of m random tokens seen twice, m drawn each step from n/2..n (a fixed m
lets one head copy from the fixed offset m - 1 by position alone: the loss falls, but no head
scores as an induction head). The first half is unpredictable (loss ln V at best, above it
when the model copies from chance repeats); the second half is predictable by copying: a
previous-token head in layer 0 writes "my predecessor was a" into each position, and an
induction head in layer 1 finds the position whose predecessor matches the current token and
copies the token there. The in-context loss on the repeated half falls far below the first
half's once the heads form, in a sudden bump of the training curve.
Metrics: induction_score[layer][head] and previous-token scores (experiments/tools.py
head_scores) on held-out sequences; loss_first_half over targets 1..n-1, loss_second_half
over targets n+1..2n-1 (target n, the second copy's first token, is unpredictable too);
bump_step: the first evaluated step where the second half's loss is below the first half's
by half the final gap.
"""
import numpy as np

from scratchllm.core import clip_grad_norm, cosine_schedule
from scratchllm.core.ops import log_softmax_forward
from scratchllm.experiments.base import Experiment, Outcome, pick
from scratchllm.experiments.tools import head_scores
from scratchllm.lm import LM
from scratchllm.specs import AttentionSpec, LayerSpec, ModelConfig
from scratchllm.train.settings import Settings
from scratchllm.train.trainer import make_optimizer

_NAME = "induction"
_CLAIM = ("a 2-layer attention-only model forms a previous-token head and an induction head, "
         "and its loss on the repeated half falls far below the first half's")


def repeated(rng, batch, n, vocab):
    """(batch, 2n) ints: n random tokens, then the same n again."""
    r = rng.integers(0, vocab, (batch, n))
    return np.concatenate([r, r], axis=1)


def half_losses(model, seqs):
    """(first-half loss, second-half loss) in nats/token of next-token prediction."""
    n = seqs.shape[1] // 2
    logits, _ = model.forward(seqs[:, :-1])  # (B, 2n-1, V)
    logp = log_softmax_forward(logits.astype(np.float64))[0]
    nll = -np.take_along_axis(logp, seqs[:, 1:, None], axis=-1)[..., 0]  # (B, 2n-1)
    return float(nll[:, :n - 1].mean()), float(nll[:, n:].mean())


def _sizes(mode):
    """The settings of a mode: vocab, n, steps, batch, d_model, heads, lr."""
    return dict(vocab=pick(mode, 16, 32, 32), n=pick(mode, 8, 16, 16),
                steps=pick(mode, 10, 500, 1500), batch=pick(mode, 4, 32, 32),
                d_model=pick(mode, 16, 64, 64), heads=4, lr=1e-2)


def _run(mode, seed, z=None):
    z = _sizes(mode) if z is None else z
    vocab, n, steps, batch = z["vocab"], z["n"], z["steps"], z["batch"]
    d_model, heads = z["d_model"], z["heads"]
    mixer = AttentionSpec(n_heads=heads, n_kv_heads=heads)
    cfg = ModelConfig(name="attn-only", vocab_size=vocab, d_model=d_model,
                      layers=(LayerSpec(mixer=mixer, ffn=None),) * 2)
    s = Settings(steps=steps, batch_size=batch, seq_len=2 * n, lr=z["lr"], warmup=min(30, steps),
                 weight_decay=0.01, seed=seed)
    model = LM(cfg, rng=np.random.default_rng(seed), dtype=np.float32)
    opt = make_optimizer(model, s)
    rng, eval_rng = np.random.default_rng([seed, 1]), np.random.default_rng([seed, 2])
    held_out = repeated(eval_rng, pick(mode, 4, 64, 128), n, vocab)
    every = max(steps // 20, 1)
    curve = []  # (step, first half, second half)
    for step in range(1, steps + 1):
        seqs = repeated(rng, batch, int(rng.integers(n // 2, n + 1)), vocab)
        model.zero_grad()
        loss, cache = model.loss(seqs[:, :-1], seqs[:, 1:])
        model.loss_backward(1.0, cache)
        clip_grad_norm(model.parameters(), s.clip)
        opt.lr = cosine_schedule(step, s.lr, s.lr / 10, s.warmup, steps)
        opt.step()
        if step % every == 0 or step == steps:
            curve.append((step, *half_losses(model, held_out)))
    first, second = curve[-1][1], curve[-1][2]
    gap = first - second
    bump = next((st for st, a, b in curve if a - b >= gap / 2), steps) if gap > 0 else None
    scores = head_scores(model, held_out[:, :-1])
    ind, prev = scores["induction"], scores["previous_token"]
    lines = [f"{'layer':<6}{'head':>5}{'prev-token':>12}{'induction':>11}"]
    lines += [f"{layer:<6}{h:>5}{prev[layer][h]:>12.3f}{ind[layer][h]:>11.3f}"
              for layer in sorted(ind) for h in range(heads)]
    lines.append(f"loss first half {first:.3f}, second half {second:.3f} nats/token "
                 f"(ln V = {np.log(vocab):.3f}); bump at step {bump}")
    best = max(float(ind[1].max()), float(ind[0].max()))
    verdict = (f"best induction score {best:.2f} (layer 1: {float(ind[1].max()):.2f}), best "
               f"previous-token score in layer 0 {float(prev[0].max()):.2f}; the repeated half's "
               f"loss is {second:.2f} against {first:.2f} for the first half")
    per_head = lambda s: {str(layer): {str(h): float(v) for h, v in enumerate(s[layer])}  # noqa
                          for layer in sorted(s)}
    metrics = dict(induction_score=per_head(ind), previous_token_score=per_head(prev),
                   loss_first_half=first, loss_second_half=second, bump_step=bump,
                   curve=[list(c) for c in curve])
    config = dict(vocab_size=vocab, half_length=n, steps=steps, batch_size=batch,
                  d_model=d_model, n_heads=heads, n_layers=2, lr=s.lr)
    return Outcome(metrics, config, "\n".join(lines), verdict)


def _figure(fig, outcome):
    ax1, ax2 = fig.subplots(1, 2)
    m = outcome.metrics
    steps, first, second = zip(*m["curve"])
    ax1.plot(steps, first, label="first half")
    ax1.plot(steps, second, label="repeated half")
    ax1.set(xlabel="step", ylabel="loss (nats/token)", title="in-context loss")
    ax1.legend()
    grid = np.array([list(heads.values()) for heads in m["induction_score"].values()])
    im = ax2.imshow(grid, vmin=0, vmax=1, cmap="viridis")
    ax2.set(xlabel="head", ylabel="layer", title="induction score")
    fig.colorbar(im, ax=ax2)


INDUCTION = Experiment(_NAME, _CLAIM, _run, _figure)
