"""A small continuous-batching engine over a paged (or contiguous) KV cache, greedy decoding.

Each step:
    1. admit    waiting requests, oldest first, while their blocks are free: point their
                table at the cached blocks of their prefix, compute the rest (LM.prefill for
                a fresh prompt, rows.forward_rows in one chunk after a prefix hit; with
                batch_prefill every admitted prompt's rest in one padded forward,
                rows.prefill_rows), and take the first new token from the last logits
    2. reserve  one slot for every running request's next token; when no block is free,
                preempt the most recently admitted request (free its blocks, put it back at
                the front of the queue: it is recomputed from its prompt and the tokens it
                has made when readmitted)
    3. decode   every running request in one call at its own position (rows.decode_rows);
                or, with rows=False (or a model decode_rows does not serve), requests holding
                the same number of tokens share one LM.decode call, the layers' states being
                GroupState views of the cache
    4. retire   finished requests (exactly max_new_tokens each; no early stop) free blocks
Every request's tokens equal its own unbatched greedy decode (model.prefill, then
model.decode, one state per layer) up to floating-point ties: batching, paging, prefix
sharing and preemption change where numbers live, never which numbers are computed.
Reference: arXiv 2309.06180 (PagedAttention, vLLM's scheduler: admission, preemption by
recomputation).

Glossary: P prompt length, N new tokens, bs block size.
"""
from collections import deque

import numpy as np

from scratchllm.serve.blocks import OutOfBlocks
from scratchllm.serve.pool import (KV_DTYPES, ContiguousCache, PagedCache, StateCache,
                                  paged_supported)
from scratchllm.serve.rows import decode_rows, forward_rows, prefill_rows, rows_supported


class Request:
    """One prompt's progress: its tokens so far (prompt + out) and how many it must make."""

    def __init__(self, rid, prompt, max_new):
        self.rid, self.prompt, self.max_new = rid, list(prompt), max_new
        self.out = []
        self.held = 0  # tokens of prompt + out[:-1] in the cache (the last new one is fed next)

    @property
    def done(self):
        return len(self.out) >= self.max_new


class Engine:
    """Requests in, greedy tokens out; `stats` counts steps, preemptions, prefix hits, the
    peak blocks in use and the peak running batch."""

    def __init__(self, model, cache, rows=None, batch_prefill=False):
        self.model, self.cache = model, cache
        self.paged = isinstance(cache, PagedCache)
        self.rows = cache.batchable and (rows_supported(model) if rows is None else rows)
        self.batch_prefill = batch_prefill and self.rows  # one forward for a step's admissions
        self.waiting, self.running, self.finished = deque(), [], {}
        self.stats = dict(steps=0, preemptions=0, decode_calls=0, prefill_calls=0,
                          peak_blocks=0, peak_batch=0, peak_bytes=0)

    def submit(self, rid, prompt, max_new):
        if not prompt:
            raise ValueError(f"serve: request {rid!r} has an empty prompt")
        if self.paged:
            bm = self.cache.blocks
            need = bm.blocks_for(len(prompt) + max_new - 1)
            if need > bm.n_blocks:
                raise ValueError(f"serve: request {rid!r} needs {need} blocks of "
                                 f"{bm.block_size} tokens ({len(prompt)} prompt + {max_new} "
                                 f"new) and the cache has n_blocks={bm.n_blocks}")
        req = Request(rid, prompt, max_new)
        (self.finished.__setitem__(rid, req) if req.done else self.waiting.append(req))

    def run(self):
        """Step until every request is finished; returns {rid: new ids}."""
        while self.waiting or self.running:
            self.step()
        return {rid: r.out for rid, r in self.finished.items()}

    def step(self):
        self.stats["steps"] += 1
        self._admit()
        self._reserve()
        groups = {}
        for r in self.running:
            key = "all" if self.rows else r.held if self.cache.batchable else (r.held, r.rid)
            groups.setdefault(key, []).append(r)
        for reqs in groups.values():
            seqs, ids = [r.rid for r in reqs], np.array([r.out[-1] for r in reqs])  # (B,)
            if self.rows:
                positions = np.array([r.held for r in reqs])  # (B,)
                logits = decode_rows(self.model, ids, self.cache, seqs, positions)  # (B, V)
            else:
                held = reqs[0].held  # the same for the whole group
                logits = self.model.decode(ids, self.cache.views(seqs, held), held)  # (B, V)
            self.stats["decode_calls"] += 1
            for r, row in zip(reqs, logits):
                r.held += 1
                r.out.append(int(np.argmax(row)))
                self._commit(r)
        self._note_peaks()
        for r in [r for r in self.running if r.done]:
            self.running.remove(r)
            self._release(r)
            self.finished[r.rid] = r

    # ------------------------------------------------------------------ the phases
    def _admit(self):
        batch = []  # (request, tokens, start) placed for one batched prefill
        while self.waiting:
            r = self.waiting[0]
            tokens = r.prompt + r.out  # recomputation after a preemption includes r.out
            if self.paged and not self.cache.blocks.fits(tokens, extra=1):
                break
            self.waiting.popleft()
            if self.batch_prefill:
                batch.append((r, tokens, self._place(r, tokens)))
                continue
            self._prefill(r, tokens)
            self._started(r)
        if batch:  # every admitted prompt's rest in one forward (rows.prefill_rows)
            logits = prefill_rows(self.model, [t[s:] for _, t, s in batch], self.cache,
                                  [r.rid for r, _, _ in batch],
                                  np.array([s for _, _, s in batch]))  # (B, V)
            self.stats["prefill_calls"] += 1
            for (r, tokens, _), row in zip(batch, logits):
                self._first_token(r, tokens, row)
                self._started(r)

    def _started(self, r):
        if r.done:  # max_new == 1, or preempted just before its last token
            self._release(r)
            self.finished[r.rid] = r
        else:
            self.running.append(r)

    def _place(self, r, tokens):
        """Blocks (or arrays) for a request's tokens -> how many are already cached."""
        if self.paged:
            start = self.cache.blocks.add(r.rid, tokens)
            self.cache.blocks.reserve(r.rid, len(tokens) - start)  # fits() said they are free
            return start
        self.cache.add(r.rid, len(r.prompt) + r.max_new)
        return 0

    def _first_token(self, r, tokens, logits):
        r.held = len(tokens)
        r.out.append(int(np.argmax(logits)))
        self._commit(r)

    def _prefill(self, r, tokens):
        start = self._place(r, tokens)
        self.stats["prefill_calls"] += 1
        views = self.cache.views([r.rid], start)
        if start == 0:
            logits = self.model.prefill(np.array([tokens]), views)[:, -1]  # (1, V)
        elif self.rows:  # a prefix hit: the rest in one chunk after the shared blocks
            logits = forward_rows(self.model, np.array([tokens[start:]]), self.cache, [r.rid],
                                  np.array([start]))[:, -1]  # (1, V)
        else:  # the rest token by token
            for p in range(start, len(tokens)):
                logits = self.model.decode(np.array([tokens[p]]), views, p)  # (1, V)
        self._first_token(r, tokens, logits[0])

    def _reserve(self):
        """One slot per running request (copying shared blocks first); preempt on shortage."""
        if not self.paged:
            return
        i = 0
        while i < len(self.running):
            r = self.running[i]
            try:
                self.cache.copy_blocks(self.cache.blocks.reserve(r.rid, 1))
                i += 1
            except OutOfBlocks:
                victim = self.running.pop()  # the most recently admitted (maybe r itself)
                self._release(victim)
                victim.held = 0
                self.waiting.appendleft(victim)
                self.stats["preemptions"] += 1

    def _commit(self, r):
        if self.paged:
            self.cache.blocks.commit(r.rid, (r.prompt + r.out)[:r.held])

    def _release(self, r):
        (self.cache.blocks if self.paged else self.cache).release(r.rid)

    def _note_peaks(self):
        s = self.stats
        s["peak_batch"] = max(s["peak_batch"], len(self.running))
        if self.paged:
            s["peak_blocks"] = max(s["peak_blocks"], self.cache.blocks.blocks_in_use())
        else:
            s["peak_bytes"] = max(s["peak_bytes"], self.cache.nbytes())


def make_engine(model, kv="paged", block_size=16, n_blocks=None, kv_dtype="float32",
                max_tokens=None, rows=None, batch_prefill=False):
    """An Engine over a paged cache of n_blocks blocks (default: room for max_tokens tokens,
    every request's whole length at once) or over contiguous per-request arrays; rows as
    Engine's (None: decode_rows where it serves the model, else LM.decode per group);
    batch_prefill: the prompts admitted in one step share one forward (rows.prefill_rows;
    requests admitted together do not share each other's prefix blocks)."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"serve: kv_dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")
    if kv == "contiguous":
        if kv_dtype == "float32" and not paged_supported(model):
            return Engine(model, StateCache(model), rows=False)  # windows, recurrences
        return Engine(model, ContiguousCache(model, kv_dtype), rows, batch_prefill)
    if kv != "paged":
        raise ValueError(f"serve: kv must be 'paged' or 'contiguous', got {kv!r}")
    if n_blocks is None:
        n_blocks = max(1, -(-(max_tokens or block_size) // block_size))
    return Engine(model, PagedCache(model, n_blocks, block_size, kv_dtype), rows,
                  batch_prefill)


def generate_batch(model, prompts, max_new_tokens, *, kv="paged", block_size=16,
                   n_blocks=None, kv_dtype="float32", batch_prefill=False):
    """Greedy continuation of every prompt through the continuous-batching engine.

    Inputs:  model an LM (kv "paged" or a quantised kv_dtype: every layer full causal GQA
             attention or MLA: pool.cache_layers); prompts a list of non-empty
             lists of ids; max_new_tokens an int or one int per prompt; kv "paged" (blocks of
             block_size tokens, n_blocks of them: default room for every request at once;
             fewer forces preemption by recomputation) or "contiguous" (one array per request
             sized prompt + max_new_tokens; for a model with sliding windows, DSA's indexer
             or recurrent layers, each request's own model.init_state, decoded one request
             per call); kv_dtype "float32" (unquantised: the model's own
             dtype), "int8", "fp8" or "int4" (per token per head; int4 in groups);
             batch_prefill: the prompts admitted in one step are prefilled in one
             right-padded forward (rows.prefill_rows; the models decode_rows serves) instead
             of one LM.prefill each; the tokens are the same.
    Returns: one list per prompt of exactly its max_new_tokens new ids (no early stop).
    """
    prompts = [list(map(int, p)) for p in prompts]
    news = [max_new_tokens] * len(prompts) if np.ndim(max_new_tokens) == 0 \
        else list(max_new_tokens)
    if len(news) != len(prompts):
        raise ValueError(f"generate_batch: {len(news)} max_new_tokens for {len(prompts)} "
                         f"prompts")
    if any(int(n) != n or n < 0 for n in news):
        raise ValueError(f"generate_batch: max_new_tokens must be ints >= 0, got {news}")
    bs = block_size
    total = sum(-(-(len(p) + n) // bs) * bs for p, n in zip(prompts, news))
    engine = make_engine(model, kv, block_size, n_blocks, kv_dtype, max_tokens=total,
                         batch_prefill=batch_prefill)
    if batch_prefill and not engine.batch_prefill:
        raise ValueError("generate_batch: batch_prefill=True needs a model decode_rows serves "
                         "(full causal GQA or MLA attention, RoPE without dynamic scaling) on "
                         "a paged or contiguous cache; this one is decoded one request per call")
    for i, (p, n) in enumerate(zip(prompts, news)):
        engine.submit(i, p, int(n))
    out = engine.run()
    return [out[i] for i in range(len(prompts))]
