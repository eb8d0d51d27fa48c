"""Sampling from an LM one token at a time through its per-layer decoding states (KVState for
GQA, RollingKVState for sliding-window attention, LatentKVState for MLA in the absorbed form,
MambaState for Mamba): the library behind `python -m scratchllm sample`.

Sampling one token from logits z (V,):
    z = z / temperature                     (temperature 0 = greedy argmax)
    keep the top_k largest                  (top-k, Fan et al. 2018)
    keep the smallest prefix of the sorted probabilities with mass >= top_p   (nucleus,
                                             Holtzman et al. 2019); renormalise; draw.
Text streams as it is produced: token bytes go through an incremental UTF-8 decoder, so a
character split across two tokens appears once both have arrived.

Glossary: B batch, V vocabulary, P prompt length.
"""
import codecs

import numpy as np

from scratchllm.lm.padding import prefill_padded
from scratchllm.lm.seq2seq import Seq2SeqLM
from scratchllm.tokenizer import EOT, heal_table, token_bytes


def sample_next(logits, rng, temperature=1.0, top_k=None, top_p=None):
    """Draw one id from logits (V,) with temperature, top-k and top-p filtering."""
    if temperature < 0 or (top_k is not None and top_k < 1) or \
            (top_p is not None and not 0 < top_p <= 1):
        raise ValueError(f"sample: need temperature >= 0, top_k >= 1, 0 < top_p <= 1; got "
                         f"temperature={temperature}, top_k={top_k}, top_p={top_p}")
    z = np.asarray(logits, dtype=np.float64)  # (V,)
    if np.isnan(z).any() or not np.isfinite(z).any():
        raise ValueError(f"sample: the logits hold NaN or no finite value ({np.isnan(z).sum()} "
                         f"NaN of {z.size}); the model's weights are probably non-finite")
    if temperature == 0:
        return int(np.argmax(z))
    z = (z - z.max()) / temperature  # (V,) shift first: a tiny temperature gives 0 and -inf
    if top_k is not None and top_k < z.size:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z >= kth, z, -np.inf)  # (V,)
    p = np.exp(z)  # (V,) the max entry is exp(0) = 1: the sum is >= 1
    p /= p.sum()
    if top_p is not None and top_p < 1:
        order = np.argsort(-p, kind="stable")  # (V,)
        cum = np.cumsum(p[order])  # (V,)
        cut = int(np.searchsorted(cum, top_p)) + 1  # smallest prefix with mass >= top_p
        keep = np.zeros_like(p, dtype=bool)
        keep[order[:cut]] = True
        p = np.where(keep, p, 0.0)
        p /= p.sum()
    return int(rng.choice(p.size, p=p))


def generate_ids(model, prompt_ids, max_new_tokens, rng, stop_ids=(), first_allowed=None,
                 **sampling):
    """Yield up to max_new_tokens sampled ids after prompt_ids (a non-empty list), feeding
    the prompt through model.prefill (one forward) and each new token through model.decode,
    with one state per layer; a sampled id in stop_ids ends it (and is not yielded).
    first_allowed: a boolean mask (V,) of the ids the first sampled token may be (token
    healing), or None."""
    if not prompt_ids:
        raise ValueError("generate: the prompt must hold at least one token")
    state = model.init_state(batch=1, max_len=len(prompt_ids) + max_new_tokens)
    logits = model.prefill(np.array([prompt_ids]), state)[:, -1]  # (1, V)
    for pos in range(len(prompt_ids), len(prompt_ids) + max_new_tokens):
        z = logits[0]
        if first_allowed is not None and pos == len(prompt_ids):
            z = np.where(first_allowed[:z.size], z, -np.inf)  # (V,)
        t = sample_next(z, rng, **sampling)
        if t in stop_ids:
            return
        yield t
        if pos + 1 < len(prompt_ids) + max_new_tokens:
            logits = model.decode(np.array([t]), state, pos)  # (1, V)


def generate_seq2seq_ids(model, source_ids, max_new_tokens, rng, stop_ids=(), **sampling):
    """Yield up to max_new_tokens ids an encoder-decoder (Seq2SeqLM) samples after its
    decoder start id, given source_ids (a non-empty list): the encoder runs once
    (init_state keeps each decoder layer's cross-attention keys and values), then one decode
    per token; a sampled id in stop_ids ends it (and is not yielded)."""
    if not source_ids:
        raise ValueError("generate: the source must hold at least one token")
    state = model.init_state(1, max(max_new_tokens, 1), input_ids=np.array([source_ids]))
    t = model.cfg.decoder_start_id
    for pos in range(max_new_tokens):
        t = sample_next(model.decode(np.array([t]), state, pos)[0], rng, **sampling)
        if t in stop_ids:
            return
        yield t


def generate_batch_ids(model, input_ids, attention_mask, max_new_tokens, rng, stop_ids=(),
                       **sampling):
    """Sample after a batch of prompts of different lengths, padded as transformers pads
    them: input_ids (B, T) ints with attention_mask (B, T) 0/1 (1 = a real token; None: no
    padding). An LM takes left padding (lm/padding.py prefill_padded: each row's state holds
    its own tokens, then one position per row); an encoder-decoder (Seq2SeqLM) the padded sources (its
    encoder and cross-attention mask the padding). rng: a Generator, or a list of B of them
    (row b draws from rng[b]). Returns B lists, each row's ids, up to max_new_tokens, ending
    before the row's first id in stop_ids; each equals generate_ids / generate_seq2seq_ids
    on the row alone (with its own Generator when sampled; greedy, temperature 0, always)."""
    B = np.shape(input_ids)[0]
    rngs = list(rng) if isinstance(rng, (list, tuple)) else [rng] * B
    if len(rngs) != B:
        raise ValueError(f"generate_batch_ids: rng is a list of {len(rngs)} Generators for "
                         f"{B} rows (one per row, or one Generator)")
    out, live = [[] for _ in range(B)], np.ones(B, bool)
    if isinstance(model, Seq2SeqLM):
        state = model.init_state(B, max(max_new_tokens, 1), input_ids=input_ids,
                                 attention_mask=attention_mask)
        logits = model.decode(np.full(B, model.cfg.decoder_start_id), state, 0)  # (B, V)
        pos = 1
    else:
        state = model.init_state(B, np.shape(input_ids)[1] + max_new_tokens)
        mask = np.ones(np.shape(input_ids), np.int64) if attention_mask is None else \
            attention_mask  # None: no padding
        logits, pos = prefill_padded(model, input_ids, mask, state)  # (B, V), (B,)
    for step in range(max_new_tokens):
        t = np.array([sample_next(z, r, **sampling) for z, r in zip(logits, rngs)])  # (B,)
        for b in np.flatnonzero(live):
            live[b] = int(t[b]) not in stop_ids
            if live[b]:
                out[b].append(int(t[b]))
        if not live.any() or step + 1 == max_new_tokens:
            break
        logits = model.decode(t, state, pos)  # (B, V)
        pos = pos + 1
    return out


def heal(tokenizer, prompt_ids, vocab_size):
    """Token healing (Lundberg 2023, the guidance library's "token healing"): a prompt that
    ends mid-word ("https:") ends on a token the model rarely saw there, since training text
    was tokenized whole ("https://" is one token). Back up over the last prompt token, and let
    the first sampled token be any token whose bytes start with the removed token's bytes, so
    the model itself chooses how the boundary is spelled. Returns (shorter prompt ids, mask
    (V,) of the allowed first ids, the removed bytes); the prompt unchanged and None when the
    tokenizer does not expose its tokens' bytes or the prompt has one token."""
    table = token_bytes(tokenizer)
    if table is None or len(prompt_ids) < 2 or prompt_ids[-1] not in table:
        return list(prompt_ids), None, b""
    shorter, allowed = heal_table(table, prompt_ids, vocab_size)
    return shorter, allowed, table[prompt_ids[-1]]


def stream_text(tokenizer, ids, context=()):
    """Yield the text of ids as they arrive. A tokenizer with decode_bytes streams through an
    incremental UTF-8 decoder; any other decodes context + ids so far and yields what was
    added (a trailing U+FFFD, half a character, waits for the next id), so decoders that
    treat the first token specially (Metaspace) see the ids in place."""
    if hasattr(tokenizer, "decode_bytes"):
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for t in ids:
            piece = decoder.decode(tokenizer.decode_bytes([t]))
            if piece:
                yield piece
        tail = decoder.decode(b"", final=True)
        if tail:
            yield tail
        return
    seen, done = list(context), tokenizer.decode(list(context))
    for t in ids:
        seen.append(t)
        text = tokenizer.decode(seen)
        if text.endswith("\ufffd"):
            continue
        k = len(done) if text.startswith(done) else \
            next((j for j, (a, b) in enumerate(zip(text, done)) if a != b), len(done))
        if text[k:]:
            yield text[k:]
        done = text
    text = tokenizer.decode(seen)
    if len(text) > len(done):
        yield text[len(done):]


def encode_prompt(model, tokenizer, prompt, allow_special=False):
    """The ids generate sends for prompt: a list of ids as they are; else the text as
    ordinary text (special-token strings become their ids only with allow_special). An
    encoder-decoder's source ends with the tokenizer's post-processor suffix (T5's </s>); a
    decoder's empty prompt is [<|endoftext|>], the start of a document."""
    if isinstance(prompt, (list, tuple)):
        return [int(i) for i in prompt]
    if isinstance(model, Seq2SeqLM):
        encode = tokenizer.encode if allow_special else tokenizer.encode_ordinary
        extra = {"add_special_tokens": True} if hasattr(tokenizer, "suffix") else {}
        return list(encode(prompt, **extra))
    if not prompt:
        return [tokenizer.special_tokens.get(EOT)]
    if allow_special:
        return list(tokenizer.encode(prompt, allowed_special="all"))
    return list(tokenizer.encode_ordinary(prompt))


def generate(model, tokenizer, prompt, max_new_tokens=100, rng=None, allow_special=False,
             stop_ids=(), **sampling):
    """Yield text pieces as they are sampled (stops early at <|endoftext|> or an id in
    stop_ids, e.g. a Hugging Face config's eos_token_id). prompt: text, or a list of ids
    sent as they are (a chat template's ids, tokenizer.chat.encode_chat). An empty prompt
    starts from <|endoftext|>, i.e. at the start of a document. The prompt text is ordinary
    text (a special-token string in it never becomes the control token) unless allow_special.
    sampling: sample_next's temperature, top_k, top_p, and heal=True for token healing (the
    yielded text then starts with the rest of the healed token; see heal).
    With an encoder-decoder (Seq2SeqLM) the prompt is the source, ended by the tokenizer's
    post-processor suffix (T5's </s>), and the pieces are the decoder's output."""
    rng = np.random.default_rng() if rng is None else rng
    healing = sampling.pop("heal", False)
    eot = tokenizer.special_tokens.get(EOT)
    prompt_ids = encode_prompt(model, tokenizer, prompt, allow_special)
    if isinstance(model, Seq2SeqLM):  # the prompt is the source
        ids = generate_seq2seq_ids(model, prompt_ids, max_new_tokens, rng,
                                   stop_ids={eot, *stop_ids} - {None}, **sampling)
        yield from stream_text(tokenizer, ids)
        return
    allowed, tail = None, b""
    if healing:
        prompt_ids, allowed, tail = heal(tokenizer, prompt_ids, model.cfg.vocab_size)
    stop = {eot, *stop_ids} - {None}
    ids = generate_ids(model, list(prompt_ids), max_new_tokens, rng, stop_ids=stop,
                       first_allowed=allowed, **sampling)
    pieces = stream_text(tokenizer, ids, prompt_ids[-1:])
    if not tail:
        yield from pieces
        return
    skip = tail.decode("utf-8", "replace")  # the prompt already shows the healed token's
    for piece in pieces:                     # start: yield only what extends it
        cut = min(len(skip), len(piece))
        piece, skip = piece[cut:], skip[cut:]
        if piece:
            yield piece
