"""A padded batch for a causal LM, as transformers takes one: attention_mask (B, T) ints or
bools, 1 = a real token, 0 = padding (left padding, as generation wants; right padding too).

    positions  p[b, t] = (sum_{s <= t} m[b, s]) - 1 at a real token, 0 at padding
               (transformers' generate: generation/utils.py _prepare_position_ids_for_generation,
               `attention_mask.long().cumsum(-1) - 1`, `masked_fill(attention_mask == 0, 0)`,
               which it passes to the model as position_ids)
    keys       a real token attends the real tokens its layer's own mask allows (causal,
               sliding window, chunks by place in the row), never padding

so each row's real tokens get the logits, and their outputs' gradients reach every weight,
as the row alone, unpadded. The mechanism is the packed batch's (lm/block.py Packing): a
padded row is a packed row of up to three documents (the left padding, the real tokens, the
right padding), so each layer's mask is its own pattern within one document and the backward
is the packed path's, unchanged; the positions are the cumulative sum's. A padding token's
output is defined but meaningless (padding attends padding; transformers' padding queries see
no key at all): a loss leaves them out (labels -100), and a test compares the real tokens.
Mamba and Mamba-2 layers run each row's real tokens alone (lm/shifted.py), as transformers'
masked mixers do; other recurrences (RWKV, the linear-attention family) are refused.

Generation of a left-padded batch (prefill_padded): every layer's decoding state must end up
holding each row's own tokens at positions 0..n_b-1, as the row alone would. With KV and MLA
states (KVState, LatentKVState) the rows' real tokens move to the front (right padding),
one prefill runs the batch (causal attention never reads a later token), and each row's state
is cut back to its n_b tokens; a sliding-window state (RollingKVState, whose ring the padding
would overwrite) is filled one column at a time instead, a padding column restarting its row
(decode at position 0: kv_state.begin_step), so the row's first real token starts it afresh.
Decoding then goes on with one position per row, n_b, n_b + 1, ... A Mamba / Mamba-2 model
reads the prompt a column at a time, each padding column setting its row's states back to 0.

Glossary: B batch, T padded length, n_b the real tokens of row b, V vocabulary.
"""
import numpy as np

from scratchllm.core.validate import expect_int, expect_ndim
from scratchllm.lm.block import Packing
from scratchllm.specs import Mamba2Spec, MambaSpec


def padded_positions(attention_mask):
    """Positions of a padded batch's tokens, as transformers' generate computes them:
    attention_mask (B, T) 0/1 -> (B, T) int64, cumsum(m) - 1 at real tokens, 0 at padding."""
    m = np.asarray(attention_mask).astype(np.int64)  # (B, T)
    return np.where(m == 1, np.cumsum(m, axis=1) - 1, 0)  # (B, T)


def check_attention_mask(fn, attention_mask, ids, *, left=False):
    """attention_mask (B, T) of 0/1 (ints or bools) for ids (B, T): each row's real tokens one
    run (padding before and/or after it, never inside), at least one of them; with left=True
    the run ends at the row's last column (left padding, what generation needs). Returns the
    mask as a bool array; ValueError naming fn and the argument otherwise."""
    m = np.asarray(attention_mask)
    expect_ndim(fn, "attention_mask", m, 2, "(B, T)")
    if m.shape != np.shape(ids):
        raise ValueError(f"{fn}: attention_mask has shape {m.shape}; it marks each token of "
                         f"input_ids, shape {np.shape(ids)}")
    if not (m.dtype == np.bool_ or np.issubdtype(m.dtype, np.integer)) or (
            m.size and not np.isin(m, (0, 1)).all()):
        raise ValueError(f"{fn}: attention_mask must hold 0/1 (or bool) values, 1 = a real "
                         f"token, got dtype {m.dtype} with values {np.unique(m)[:5]}")
    m = m.astype(bool)
    empty = np.flatnonzero(~m.any(1))
    if empty.size:
        raise ValueError(f"{fn}: attention_mask row {empty[0]} has no real token (all 0)")
    starts = (m[:, 1:] & ~m[:, :-1]).sum(1) + m[:, 0]  # (B,) runs of real tokens per row
    holes = np.flatnonzero(starts > 1)
    if holes.size:
        b = holes[0]
        raise ValueError(f"{fn}: attention_mask row {b} is {m[b].astype(int).tolist()}: "
                         f"padding inside the real tokens; a padded batch pads before or "
                         f"after each row's tokens (one run of 1s)")
    if left and not m[:, -1].all():
        b = np.flatnonzero(~m[:, -1])[0]
        raise ValueError(f"{fn}: attention_mask row {b} ends in padding: generation needs "
                         f"left padding (each row's last token real, the padding before it), "
                         f"as transformers' generate; got {m[b].astype(int).tolist()}")
    return m


def check_padded_layers(fn, model):
    """ValueError unless every mixer of model takes a padded batch: attention or MLA (the
    padding keys masked), Mamba or Mamba-2 (lm/shifted.py: as transformers' masked mixers)."""
    for i, layer in enumerate(model.layers):
        spec = layer.spec.mixer
        if getattr(spec, "indexer", None) is not None:
            raise ValueError(f"{fn}: attention_mask with a lightning indexer (layer {i}, "
                             f"DeepSeek-V3.2's sparse attention) is not implemented: its "
                             f"top-k picks among the causal keys of the whole row")
        if layer.mixer is not None and not hasattr(spec, "mask") and not isinstance(
                spec, (MambaSpec, Mamba2Spec)):
            raise ValueError(f"{fn}: attention_mask needs attention, MLA, Mamba or Mamba-2 "
                             f"layers; layer {i} is a {type(spec).__name__}, whose recurrence "
                             f"would carry the padding into its state (give the rows one at a "
                             f"time)")


def padding_packing(fn, model, ids, attention_mask, positions="shift"):
    """The Packing of a padded batch: doc_ids (B, T) numbering the left padding 0, the real
    tokens 1 and the right padding 2, and its positions: "shift" padded_positions' (the
    mask's cumulative sum), "absolute" 0..T-1 whatever the padding (BERT's), or position_ids
    given, (B, T) or (T,) ints >= 0 (transformers' keyword). fn names the caller."""
    m = check_attention_mask(fn, attention_mask, ids)
    check_padded_layers(fn, model)
    seen = np.cumsum(m, axis=1) > 0  # (B, T) at or after the first real token
    doc_ids = np.where(m, 1, np.where(seen, 2, 0))  # (B, T)
    if isinstance(positions, str) and positions not in ("shift", "absolute"):
        raise ValueError(f"{fn}: positions must be 'shift', 'absolute' or position_ids, got "
                         f"{positions!r}")
    named = isinstance(positions, str)
    if named and positions == "shift":
        return Packing(doc_ids, padded_positions(m), m)
    p = np.arange(m.shape[1]) if named else np.asarray(positions)  # "absolute" or given
    expect_int(fn, "position_ids", p)
    if p.shape not in (m.shape, m.shape[1:]) or (p.size and p.min() < 0):
        raise ValueError(f"{fn}: position_ids must be ints >= 0 of shape {m.shape} or "
                         f"{m.shape[1:]} (one per token), got shape {p.shape}")
    return Packing(doc_ids, np.broadcast_to(p, m.shape), m)


def generates_padded(model):
    """Whether prefill_padded can fill model's decoding states from a left-padded batch:
    attention and MLA layers only, or Mamba / Mamba-2 layers only (not a hybrid of the
    two, nor RWKV or the linear-attention family)."""
    kinds = {type(layer.spec.mixer) for layer in model.layers} - {type(None)}
    recurrent = {MambaSpec, Mamba2Spec}
    return kinds <= recurrent or not any(
        k in recurrent or not hasattr(k, "mask") for k in kinds)


def _rows_states(fn, state):
    """The per-layer states with per-row lengths (KV, rolling, MLA); ValueError for others."""
    rows = [st for st in state if st is not None]
    for st in rows:
        if not hasattr(st, "lengths"):
            raise ValueError(f"{fn}: a left-padded batch decodes with one position per row, "
                             f"which a {type(st).__name__} does not keep (attention and MLA "
                             f"states do); give the rows one at a time")
    return rows


def prefill_padded(model, input_ids, attention_mask, state):
    """Fill a fresh state (model.init_state(B, ...)) with a left-padded prompt batch.

    Inputs:  model an LM; input_ids (B, T) ints; attention_mask (B, T) 0/1, left padding.
    Returns: (logits (B, V) after each row's last token, lengths (B,) int64 the real tokens
             n_b of each row: decoding goes on with model.decode(ids_t, state, lengths),
             then lengths + 1, ...), each row's logits and state those of the row alone.
             A Mamba / Mamba-2 model (no attention) reads the prompt a column at a time, a
             padding column's states set back to zero (transformers' masked inputs keep them
             so), and returns the int T as the next position (its rows stay in step).
    """
    fn = "prefill_padded"
    m = check_attention_mask(fn, attention_mask, input_ids, left=True)
    check_padded_layers(fn, model)
    ids = np.asarray(input_ids)
    B, T = ids.shape
    if all(isinstance(layer.spec.mixer, (MambaSpec, Mamba2Spec, type(None)))
           for layer in model.layers):  # recurrent states: zero until the first real token
        for t in range(T):
            logits = model.decode(ids[:, t], state, t)  # (B, V)
            for st in (st for st in state if st is not None):
                for a in st:  # conv and scan states, (B, ...) each
                    a[~m[:, t]] = 0
        return logits, T
    rows = _rows_states(fn, state)
    n = m.sum(1).astype(np.int64)  # (B,)
    if any(hasattr(st, "window") for st in rows):  # a ring the padding would overwrite
        positions = padded_positions(m)  # (B, T); 0 at padding restarts the row
        for t in range(T):
            logits = model.decode(ids[:, t], state, positions[:, t])  # (B, V)
        return logits, n
    src = np.minimum(np.arange(T) + (T - n)[:, None], T - 1)  # (B, T) real tokens first
    logits = model.prefill(np.take_along_axis(ids, src, axis=1), state)  # (B, T, V)
    for st in rows:  # each row keeps its own n_b tokens (key_mask hides the rest)
        st.lengths[:] = n
    return logits[np.arange(B), n - 1], n  # (B, V)


def pad_rows(rows, *, left=True, pad_id=0):
    """Lists of ids of different lengths as one padded batch, as a transformers tokenizer pads
    them: (input_ids (B, T) int64, attention_mask (B, T) int64, 1 = a real token), T the
    longest row, the padding (pad_id) before each row's ids with left=True (what generation
    takes), after them otherwise."""
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError(f"pad_rows: rows must be non-empty lists of ids, got lengths "
                         f"{[len(r) for r in rows]}")
    T = max(len(r) for r in rows)
    ids = np.full((len(rows), T), pad_id, np.int64)
    mask = np.zeros((len(rows), T), np.int64)
    for b, r in enumerate(rows):
        cols = slice(T - len(r), T) if left else slice(0, len(r))
        ids[b, cols], mask[b, cols] = r, 1
    return ids, mask

