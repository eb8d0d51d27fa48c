"""Early exit in a decoding loop (Schuster et al. 2022, "Confident Adaptive Language
Modeling", arXiv 2207.07061; Elbayad et al. 2020, arXiv 1910.10073): a byte-level model is
trained, then greedy-decodes validation prompts with early_exit_decode at several thresholds.
Each token runs blocks until its logit-lens max probability reaches the threshold; the skipped
blocks get the token's keys and values from the exit's hidden state. The exits are the model's
own final norm and head (no exit heads trained, as CALM's are): the untrained read-out is the
weak end of the method. The speed is CPU time per token (one BLAS thread, the fastest of 3
runs; wall time on a shared machine is mostly the other jobs'), which also pays each tried
exit's read-out (a D x V matmul).
Metrics: agreement[threshold] (the share of decoded tokens equal to the full model's greedy
decode at the same position), blocks_fraction[threshold] (blocks run / L), ms_per_token
[threshold] (CPU), lens_agreement[threshold] (teacher-forced on validation text: early_exit's
agreement with the model's argmax), val_loss.
"""
import time

import numpy as np

from scratchllm.core.blas import one_blas_thread
from scratchllm.experiments.base import Experiment, Outcome, byte_corpus, pick
from scratchllm.experiments.early_exit import early_exit_decode, early_exit_tradeoff
from scratchllm.experiments.loop import train_curve
from scratchllm.lm import LM
from scratchllm.specs import preset
from scratchllm.train import corpus
from scratchllm.train.settings import Settings

_NAME = "early_exit"
_CLAIM = ("exiting at the first confident block saves blocks for the tokens the early layers "
          "already predict, at a small cost in agreement with the full model; at threshold 1 "
          "it is the full model")
THRESHOLDS = (1.0, 0.95, 0.9, 0.8, 0.6, 0.4, 0.0)


def _sizes(mode):
    return dict(steps=pick(mode, 3, 300, 400), d_model=pick(mode, 32, 64, 128),
                n_layers=pick(mode, 2, 6, 8), batch=pick(mode, 4, 16, 8),
                seq_len=pick(mode, 32, 64, 128), prompts=pick(mode, 2, 8, 8),
                prompt_len=pick(mode, 8, 32, 64), new_tokens=pick(mode, 4, 48, 96),
                repeats=pick(mode, 1, 3, 3))


def _decode(model, prompts, n, threshold):
    """Each prompt decoded alone (batch 1: every token exits on its own confidence): the
    tokens (P, n) and the mean fraction of blocks run."""
    runs = [early_exit_decode(model, p[None], n, threshold) for p in prompts]
    return (np.concatenate([r.tokens for r in runs]),
            float(np.mean([r.blocks_fraction for r in runs])))


def _run(mode, seed):
    z = _sizes(mode)
    train_ids, val_ids = byte_corpus(pick(mode, 100_000, None, None))
    cfg = preset("dense", vocab_size=256, d_model=z["d_model"], n_layers=z["n_layers"],
                 n_heads=4, n_kv_heads=4, d_ff=4 * z["d_model"])
    model = LM(cfg, rng=np.random.default_rng(seed), dtype=np.float32)
    settings = Settings(steps=z["steps"], batch_size=z["batch"], seq_len=z["seq_len"],
                        lr=4e-3, warmup=min(30, z["steps"]), eval_every=z["steps"] + 1,
                        seed=seed, threads=1)
    eval_set = corpus.eval_batches(val_ids, z["batch"], z["seq_len"], 16 * z["seq_len"])
    curve, _ = train_curve(model, settings, train_ids, eval_set, n_points=1, desc=_NAME)
    rng = np.random.default_rng([seed, 1])
    starts = rng.integers(0, len(val_ids) - z["prompt_len"], z["prompts"])
    prompts = np.stack([val_ids[s:s + z["prompt_len"]] for s in starts]).astype(np.int64)
    agree, blocks, ms = {}, {}, {}
    with one_blas_thread():
        full = _decode(model, prompts, z["new_tokens"], 1.0)[0]
        for th in THRESHOLDS:
            times = []
            for _ in range(z["repeats"]):  # the fastest of a few: load on a shared machine
                t0 = time.process_time()  # CPU time: a loaded machine stretches wall time
                tokens, blocks[th] = _decode(model, prompts, z["new_tokens"], th)
                times.append(time.process_time() - t0)
            ms[th] = 1e3 * min(times) / tokens.size
            agree[th] = float((tokens == full).mean())
        lens = {th: a for th, a, _ in early_exit_tradeoff(model, eval_set[0][0], THRESHOLDS)}
    lines = [f"{'threshold':>9}{'blocks run':>11}{'agreement':>10}{'ms/token':>9}"
             f"{'lens agreement':>15}"]
    lines += [f"{th:>9.2f}{blocks[th]:>11.2f}{agree[th]:>10.2f}{ms[th]:>11.2f}{lens[th]:>15.2f}"
              for th in THRESHOLDS]
    lines.append(f"{z['n_layers']} blocks, d {z['d_model']}, val loss {curve[-1][1]:.3f} "
                 f"nats/byte; {z['prompts']} prompts of {z['prompt_len']} bytes, "
                 f"{z['new_tokens']} new bytes each, decoded one at a time")
    good = [th for th in THRESHOLDS if agree[th] >= 0.9]
    best = min(good, key=lambda th: blocks[th])
    sure = min((th for th in THRESHOLDS if lens[th] >= 0.95), key=lambda th: blocks[th])
    verdict = (f"keeping >= 90% of the full decode's tokens, the lowest cost is threshold "
               f"{best:.2f}: {blocks[best]:.2f} of the blocks, {ms[best]:.2f} CPU ms/token "
               f"against {ms[1.0]:.2f} for the full model (agreement {agree[best]:.2f}); at "
               f"threshold "
               f"{sure:.2f} the exits are right {lens[sure]:.2f} of the time teacher-forced, yet "
               f"the decode keeps {agree[sure]:.2f} of the tokens for {blocks[sure]:.2f} of the "
               f"blocks: the skipped blocks' states, filled from the exit's hidden state, "
               f"{'cost' if agree[sure] < lens[sure] - 0.05 else 'do not cost'} the later "
               f"tokens; block 1 alone (threshold 0) agrees {agree[0.0]:.2f}")
    config = dict(z, thresholds=list(THRESHOLDS), n_heads=4, d_ff=4 * z["d_model"],
                  tokens="bytes of the bundled corpus", batch=1)
    metrics = dict(agreement=agree, blocks_fraction=blocks, ms_per_token=ms,
                   lens_agreement=lens, val_loss=curve[-1][1])
    return Outcome(metrics, config, "\n".join(lines), verdict)


def _figure(fig, outcome):
    ax1, ax2 = fig.subplots(1, 2)
    m = outcome.metrics
    ths = list(m["agreement"])
    ax1.plot([m["blocks_fraction"][t] for t in ths], [m["agreement"][t] for t in ths], "o-",
             label="decode: tokens equal to the full decode")
    for t in ths:
        ax1.annotate(f"{float(t):.2f}", (m["blocks_fraction"][t], m["agreement"][t]),
                     fontsize=7)
    ax1.set(xlabel="fraction of blocks run", ylabel="agreement", ylim=(0, 1.02),
            title="early exit: agreement against blocks")
    ax1.legend(fontsize=7)
    ax2.plot([float(t) for t in ths], [m["ms_per_token"][t] for t in ths], "o-")
    ax2.set(xlabel="threshold", ylabel="CPU ms per token (one thread)", title="decode time")


EARLY_EXIT = Experiment(_NAME, _CLAIM, _run, _figure)
