"""Attention sinks (Xiao et al. 2023, "Efficient Streaming Language Models with Attention
Sinks", arXiv 2309.17453): a model trained with full attention puts much of its attention on
the first tokens, whatever they are, because every query can see them; decode it with a
sliding window that drops them and the softmax loses its resting place, so perplexity jumps;
keep the first 4 tokens beside the window (the sinks) and it stays near the full model's.

A dense model trained on the bytes of the bundled corpus with full attention at length T
(each window opened by a BOS token, as an LLM's documents are) is evaluated on held-out sequences of length T with its every attention layer masked to a window
of W (query i sees keys i - W + 1..i), with and without the first n_sink = 4 keys: the same
numbers a decoder with a rolling cache of W (+ 4) tokens at the original positions computes.
Metrics: ppl_with_sinks[W], ppl_without_sinks[W] (every W below T), ppl_full, sink_share
(the mean attention of queries beyond 4 on the first 4 keys, full model, per layer).
"""
from dataclasses import replace

import numpy as np

from scratchllm.core.blas import one_blas_thread
from scratchllm.experiments.base import Experiment, Outcome, byte_corpus, pick
from scratchllm.experiments.synthetic import train_task
from scratchllm.experiments.tools import attention_patterns
from scratchllm.lm import LM
from scratchllm.specs import Mask, preset
from scratchllm.train import corpus

_NAME = "sinks"
_CLAIM = ("a model trained with full attention, decoded with a sliding window, loses its "
         "perplexity once the first tokens leave the window; keeping 4 sink tokens restores it")
N_SINK = 4
BOS = 256  # the beginning-of-sequence token, after the 256 bytes


def windowed(model, window, n_sink):
    """A copy of LM `model` (its weights) whose attention layers all see a window of `window`
    keys (plus the first n_sink)."""
    cfg = model.cfg
    layers = tuple(replace(layer, mixer=replace(layer.mixer, mask=Mask(
        True, window=window, n_sink=n_sink))) for layer in cfg.layers)
    copy = LM(replace(cfg, layers=layers), rng=np.random.default_rng(0), dtype=model.dtype)
    for (name, p), (other, q) in zip(model.named_parameters(), copy.named_parameters()):
        assert name == other, (name, other)
        q.data[...] = p.data
    return copy


def with_bos(x, y):
    """(ids, targets) of byte windows with BOS put in front: ids [BOS, x], targets [x0, y]."""
    bos = np.full((x.shape[0], 1), BOS, x.dtype)
    return np.concatenate([bos, x], 1), np.concatenate([x[:, :1], y], 1)


def perplexity(model, batches):
    """exp(mean next-token cross-entropy) over the batches (one BLAS thread)."""
    with one_blas_thread():
        total = sum(model.cross_entropy(x, y) * y.size for x, y in batches)
    return float(np.exp(total / sum(y.size for _, y in batches)))


def _sizes(mode):
    return dict(seq_len=pick(mode, 32, 128, 256), windows=pick(mode, (8, 16), (8, 16, 32, 64),
                                                                (16, 32, 64, 128)),
                d_model=pick(mode, 32, 64, 128), n_layers=pick(mode, 1, 3, 4),
                steps=pick(mode, 3, 600, 1500), batch=pick(mode, 4, 16, 16),
                eval_tokens=pick(mode, 256, 16384, 65536), lr=4e-3)


def _run(mode, seed, z=None):
    z = _sizes(mode) if z is None else z
    T = z["seq_len"]
    train_ids, val_ids = byte_corpus(pick(mode, 100_000, None, None))
    cfg = preset("dense", vocab_size=BOS + 1, d_model=z["d_model"], n_layers=z["n_layers"],
                 n_heads=4, n_kv_heads=4, d_ff=3 * z["d_model"])
    model = LM(cfg, rng=np.random.default_rng(seed), dtype=np.float32)
    rng = np.random.default_rng([seed, 1])
    train_task(model, lambda step: with_bos(*corpus.sample_batch(train_ids, z["batch"], T - 1,
                                                                 rng)),
               z["steps"], z["lr"], desc="sinks")
    eval_set = [with_bos(x, y) for x, y in corpus.eval_batches(val_ids, z["batch"], T - 1,
                                                               z["eval_tokens"])]
    full = perplexity(model, eval_set)
    with_sinks = {W: perplexity(windowed(model, W, N_SINK), eval_set) for W in z["windows"]}
    without = {W: perplexity(windowed(model, W, 0), eval_set) for W in z["windows"]}
    patterns = attention_patterns(model, eval_set[0][0])  # {layer: (B, H, T, T)}
    share = {layer: float(P[:, :, N_SINK:, :N_SINK].sum(-1).mean())
             for layer, P in patterns.items()}
    lines = [f"{'window':>7}{'with sinks':>12}{'without':>10}{'ratio':>8}"]
    lines += [f"{W:>7}{with_sinks[W]:>12.2f}{without[W]:>10.2f}{without[W] / with_sinks[W]:>8.2f}"
              for W in z["windows"]]
    lines.append(f"full attention (T={T}): perplexity {full:.2f} per byte; attention on the "
                 f"first {N_SINK} keys (full model, per layer): "
                 + ", ".join(f"{v:.2f}" for v in share.values()))
    worse = [W for W in z["windows"] if without[W] > with_sinks[W]]
    W0 = min(z["windows"])
    jump = without[W0] / with_sinks[W0] - 1
    verdict = (f"at window {W0} perplexity {with_sinks[W0]:.2f} with {N_SINK} sinks against "
               f"{without[W0]:.2f} without ({100 * jump:+.1f}%; full attention {full:.2f}); the "
               f"sink-less window is worse at {len(worse)} of {len(z['windows'])} windows: "
               + ("the claim holds" if len(worse) == len(z["windows"]) and jump > 0.1 else
                  "the direction holds, the jump is small at this size" if worse else
                  "the claim does not hold here")
               + f" (the model puts {max(share.values()):.0%} of a query's attention on the "
                 f"first {N_SINK} keys at most)")
    config = dict(z, n_heads=4, n_sink=N_SINK, tokens="BOS + bytes of the bundled corpus",
                  params=int(model.n_params()))
    metrics = dict(ppl_with_sinks=with_sinks, ppl_without_sinks=without, ppl_full=full,
                   sink_share=share)
    return Outcome(metrics, config, "\n".join(lines), verdict)


def _figure(fig, outcome):
    ax = fig.subplots()
    m = outcome.metrics
    for key, label in (("ppl_with_sinks", f"window + {N_SINK} sinks"),
                       ("ppl_without_sinks", "window alone")):
        ax.plot([int(w) for w in m[key]], list(m[key].values()), "o-", label=label)
    ax.axhline(m["ppl_full"], ls="--", c="gray", label="full attention")
    ax.set(xlabel="window (tokens)", ylabel="perplexity (per byte)", xscale="log", yscale="log",
           title="sliding window with and without attention sinks")
    ax.legend()


SINKS = Experiment(_NAME, _CLAIM, _run, _figure)
