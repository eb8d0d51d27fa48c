"""Longer contexts for a RoPE model: raise the base and keep training on longer sequences
(adjusted base frequency, "ABF": Xiong et al. 2023, "Effective Long-Context Scaling of
Foundation Models", arXiv 2309.16039, base 10,000 -> 500,000; Code Llama, Rozière et al. 2023,
arXiv 2308.12950, base 1,000,000; Llama 3's recipe) against position interpolation (PI: the
positions divided by s, Chen et al. 2023, arXiv 2306.15595; `rope_scaling` "linear") and
YaRN (Peng et al. 2023, arXiv 2309.00071: interpolate only the low frequencies, and scale the
logits), with "none" (RoPE unchanged) as the baseline.

A small dense model trains on the bundled corpus's bytes at length L0. Each method then
continues from those weights for the same steps on sequences of s L0 (s = 4, the same tokens
per step, the same batches), its RoPE changed as the method says (attention/rope.py has
every scaling: HF's modeling_rope_utils). Perplexity exp(CE) is read on the validation split
at lengths L0, 2 L0, 4 L0 and 8 L0 (the last beyond the continued length), before the
continuation (ppl_zero_shot: the method applied to the trained model as is) and after it
(ppl). Metrics: ppl[method][length], ppl_zero_shot[method][length]; methods "none", "pi",
"yarn", "abf"; lengths as strings of integers.
"""
import numpy as np

from scratchllm.experiments.base import Experiment, Outcome, byte_corpus, pick
from scratchllm.experiments.loop import train_curve
from scratchllm.lm import LM
from scratchllm.specs import preset
from scratchllm.train import corpus
from scratchllm.train.settings import Settings
from scratchllm.train.trainer import evaluate

_NAME = "abf"
_CLAIM = ("raising the RoPE base and continuing on longer sequences (ABF) extends the context "
          "at least as well as position interpolation and YaRN, and without either the "
          "perplexity blows up past the training length")
METHODS = ("none", "pi", "yarn", "abf")
S = 4  # the extension factor
ABF_BASE = 500_000.0  # Xiong et al. 2023's base (from 10,000)


def method_rope(method, L0):
    """The flat-name overrides (rope_base, rope_scaling) of a method at training length L0."""
    if method not in METHODS:
        raise ValueError(f"abf: method must be one of {METHODS}, got {method!r}")
    return {"none": {}, "abf": {"rope_base": ABF_BASE},
            "pi": {"rope_scaling": {"rope_type": "linear", "factor": float(S)}},
            "yarn": {"rope_scaling": {"rope_type": "yarn", "factor": float(S),
                                      "original_max_position_embeddings": L0}}}[method]


def with_rope(model, method, L0, size):
    """A copy of model (same weights) whose RoPE is the method's."""
    cfg = preset("dense", **size, **method_rope(method, L0))
    new = LM(cfg, rng=np.random.default_rng(0), dtype=model.dtype)
    for (_, p), (_, q) in zip(model.named_parameters(), new.named_parameters()):
        q.data[...] = p.data
    return new


def perplexities(model, val_ids, lengths, tokens):
    """{length: exp(validation CE)} over `tokens` targets at each length."""
    return {T: float(np.exp(evaluate(model, corpus.eval_batches(val_ids, 4, T, tokens))))
            for T in lengths}


def _run(mode, seed):
    L0 = pick(mode, 8, 32, 64)
    base_steps, cont_steps = pick(mode, 3, 150, 600), pick(mode, 2, 40, 150)
    batch = pick(mode, 4, 8, 8)
    size = dict(vocab_size=256, d_model=pick(mode, 16, 64, 64), n_layers=2, n_heads=4,
                n_kv_heads=4, d_ff=pick(mode, 32, 128, 192))
    train_ids, val_ids = byte_corpus(pick(mode, 50_000, None, None))
    tokens = pick(mode, 256, 4096, 16384)
    lengths = [L0, 2 * L0, S * L0, 2 * S * L0]
    base = LM(preset("dense", **size), rng=np.random.default_rng(seed), dtype=np.float32)
    s0 = Settings(steps=base_steps, batch_size=batch, seq_len=L0, lr=4e-3,
                  warmup=min(30, base_steps), eval_every=base_steps + 1, seed=seed, threads=1)
    train_curve(base, s0, train_ids, corpus.eval_batches(val_ids, 4, L0, tokens), 1,
                desc=f"base at {L0}")
    s1 = Settings(steps=cont_steps, batch_size=max(batch // S, 1), seq_len=S * L0, lr=2e-3,
                  warmup=min(10, cont_steps), eval_every=cont_steps + 1, seed=seed + 1,
                  threads=1)
    ppl, zero = {}, {}
    for method in METHODS:
        model = with_rope(base, method, L0, size)
        zero[method] = perplexities(model, val_ids, lengths, tokens)
        train_curve(model, s1, train_ids, corpus.eval_batches(val_ids, 4, S * L0, tokens), 1,
                    desc=f"{method} at {S * L0}")
        ppl[method] = perplexities(model, val_ids, lengths, tokens)
    head = f"{'method':<8}" + "".join(f"{'T=' + str(T):>10}" for T in lengths)
    lines = [f"perplexity (bytes) after {cont_steps} steps at {S * L0} (trained at {L0}):",
             head] + [f"{m:<8}" + "".join(f"{ppl[m][T]:>10.2f}" for T in lengths)
                      for m in METHODS]
    lines += ["before the continuation (the method applied as is):", head]
    lines += [f"{m:<8}" + "".join(f"{zero[m][T]:>10.2f}" for T in lengths) for m in METHODS]
    far = lengths[-1]
    best = min(METHODS, key=lambda m: ppl[m][S * L0])
    verdict = (f"at {S * L0} (the continued length) perplexity is " +
               ", ".join(f"{m} {ppl[m][S * L0]:.2f}" for m in METHODS) +
               f" (best: {best}); at {far}, beyond it: " +
               ", ".join(f"{m} {ppl[m][far]:.2f}" for m in METHODS) +
               f"; untouched, 'none' reads {zero['none'][S * L0]:.2f} at {S * L0} against "
               f"{zero['none'][L0]:.2f} at {L0}")
    config = dict(train_len=L0, factor=S, base_steps=base_steps, continue_steps=cont_steps,
                  batch_size=batch, continue_batch_size=s1.batch_size, abf_base=ABF_BASE,
                  eval_tokens=tokens, **size)
    return Outcome(dict(ppl=ppl, ppl_zero_shot=zero), config, "\n".join(lines), verdict)


def _figure(fig, outcome):
    axes = fig.subplots(1, 2, sharey=True)
    m, L0 = outcome.metrics, outcome.config["train_len"]
    for ax, key, title in zip(axes, ("ppl_zero_shot", "ppl"),
                              ("applied as is", f"after continuing at {S * L0}")):
        for method in METHODS:
            lengths = sorted(m[key][method], key=int)
            ax.plot([int(T) for T in lengths], [m[key][method][T] for T in lengths], "o-",
                    label=method)
        ax.axvline(L0, ls="--", c="gray")
        ax.set(xscale="log", xlabel="evaluation length", title=title)
        ax.set_xticks([int(T) for T in lengths], [str(T) for T in lengths])
        ax.minorticks_off()
    axes[0].set(ylabel="perplexity (bytes)")
    axes[1].legend()


ABF = Experiment(_NAME, _CLAIM, _run, _figure)
