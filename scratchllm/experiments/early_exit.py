"""Early exit read through the logit lens (Elbayad et al. 2020, "Depth-Adaptive Transformer",
arXiv 1910.10073; Schuster et al. 2022, "Confident Adaptive Language Modeling", arXiv
2207.07061): at each position, stop after the first block whose logit-lens distribution
(tools.logit_lens: the stream read through the final norm and the head) is confident,
    exit(t) = min { l in 1..L : max_v softmax(lens_l[t])_v >= threshold }   (else L)
and predict that row's argmax. The trade-off: a lower threshold runs fewer blocks (the
blocks a decode step would compute, sum exit / (L T)) and agrees less often with the full
model's argmax. An untrained read-out of early layers (no exit heads trained, as CALM's) is
the weak end of the method; a layer whose lens is already right exits at no loss.
A draft for speculative decoding is the same read-out at a fixed layer: logit_lens row l.

Glossary: B batch, T time, L layers, V vocabulary.
"""
import numpy as np

from scratchllm.core.ops import softmax_forward
from scratchllm.core.validate import expect_finite
from scratchllm.experiments.tools import logit_lens


def early_exit(model, ids, threshold, lens=None):
    """Greedy predictions with a confidence exit.

    Inputs:  model an LM; ids (B, T) ints; threshold in [0, 1] (above 1: never exit early);
             lens logit_lens(model, ids) if already computed.
    Returns: {"tokens": (B, T) predicted ids, "exit_layer": (B, T) the blocks run (1..L),
             "agreement": share of positions whose prediction equals the full model's
             argmax, "blocks_fraction": mean blocks run / L (1: no saving)}.
    """
    threshold = expect_finite("early_exit", "threshold", threshold, 0)
    lens = logit_lens(model, ids) if lens is None else lens  # (L + 1, B, T, V)
    L = lens.shape[0] - 1
    conf = softmax_forward(lens[1:].astype(np.float64))[0].max(-1)  # (L, B, T)
    sure = conf >= threshold
    sure[-1] = True  # the last block always answers
    exit_row = sure.argmax(axis=0) + 1  # (B, T) first confident row, 1..L
    picks = lens.argmax(-1)  # (L + 1, B, T)
    tokens = np.take_along_axis(picks, exit_row[None], axis=0)[0]  # (B, T)
    return {"tokens": tokens, "exit_layer": exit_row,
            "agreement": float((tokens == picks[-1]).mean()),
            "blocks_fraction": float(exit_row.mean() / L)}


def early_exit_tradeoff(model, ids, thresholds):
    """[(threshold, agreement, blocks_fraction)] for each threshold, one logit lens shared."""
    lens = logit_lens(model, ids)
    return [(float(th), r["agreement"], r["blocks_fraction"]) for th in thresholds
            for r in [early_exit(model, ids, th, lens)]]
