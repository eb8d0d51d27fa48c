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

early_exit_decode does it in a greedy decoding loop: each new token runs blocks until the lens
is confident for every row, and the blocks it skips still get the token in their decoding
state, from the exit's hidden state h (CALM's state propagation): an attention layer of a
pre-norm block appends the k, v of norm1(h) (no query, no attention, no FFN); any other block
runs in full on h (a recurrence must see every token), its output dropped.

Glossary: B batch, T time, L layers, V vocabulary, N new tokens.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.core.ops import softmax_forward
from scratchllm.core.validate import expect_finite, expect_int, expect_integer, expect_ndim
from scratchllm.experiments.tools import logit_lens, propagate_state


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


class ExitDecode(NamedTuple):
    tokens: np.ndarray  # (B, N) the greedy ids
    exit_layer: np.ndarray  # (N,) the blocks run for each new token, 1..L
    blocks_fraction: float  # mean exit_layer / L (1: no saving)
    state: list  # the decoding state after the loop (LM.init_state's, every layer filled)


def early_exit_decode(model, prompt_ids, max_new_tokens, threshold):
    """Greedy decoding with a confidence exit in every step (CALM, Schuster et al. 2022).

    Inputs:  model an LM; prompt_ids (B, T) ints, T >= 1; max_new_tokens >= 1; threshold:
             a step stops after the first block whose logit-lens max probability reaches it
             in every row (>= 1: never early, the model's own greedy decoding).
    Returns: ExitDecode(tokens (B, N), exit_layer (N,), blocks_fraction, state).
    The prompt but its last token is prefilled by the whole model; every new token (the last
    prompt token's prediction first) comes from the loop.
    """
    expect_int("early_exit_decode", "prompt_ids", prompt_ids)
    expect_ndim("early_exit_decode", "prompt_ids", prompt_ids, 2, "(B, T)")
    expect_integer("early_exit_decode", "max_new_tokens", max_new_tokens, 1)
    threshold = expect_finite("early_exit_decode", "threshold", threshold, 0)
    (B, T), L = prompt_ids.shape, len(model.layers)
    if T < 1:
        raise ValueError("early_exit_decode: prompt_ids needs at least one token, got T = 0")
    state = model.init_state(B, T + max_new_tokens)
    if T > 1:
        model.prefill(prompt_ids[:, :-1], state)
    token, tokens, exits = prompt_ids[:, -1], [], []
    for pos in range(T - 1, T - 1 + max_new_tokens):
        x = model._embed_forward(token[:, None], pos)[0][:, 0]  # (B, D) as LM.decode does
        for l, (layer, st) in enumerate(zip(model.layers, state)):
            x = layer.decode(x, st, pos)  # (B, D)
            if l == L - 1 or threshold < 1:
                logits = model.unembed(x)  # (B, V): the lens at block l + 1
                conf = softmax_forward(logits.astype(np.float64))[0].max(-1)  # (B,)
                if l == L - 1 or (conf >= threshold).all():
                    break
        for layer, st in zip(model.layers[l + 1:], state[l + 1:]):
            propagate_state(layer, x, st, pos)
        token = logits.argmax(-1)  # (B,)
        tokens.append(token)
        exits.append(l + 1)
    exits = np.array(exits)
    return ExitDecode(np.stack(tokens, 1), exits, float(exits.mean() / L), state)
