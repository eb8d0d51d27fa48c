"""Decoding state of attention layers: the memory that autoregressive decoding keeps per layer
(inference only, no backward). In this library "cache" always means what a backward pass
needs; what decoding keeps across tokens is a *state* (the KV cache of the literature).

    KVState          keys and values of every past token, preallocated to max_len:
                     2 Hkv Dh numbers per token per layer
    RollingKVState   the first n_sink tokens plus a ring buffer of the last `window`
                     (StreamingLLM, Xiao et al. 2023, arXiv 2309.17453; Mistral's rolling
                     buffer): memory O(window); attending to it equals attention_sink_mask
    LatentKVState    MLA's absorbed-form memory: [kv_norm(c_kv) | k_pe], Dc + dr numbers per
                     token per layer, shared by all heads (DeepSeek-V2, arXiv 2405.04434)

Each row of a state is one sequence with its own length: decoding takes one position per row
((B,) ints, begin_step) as well as one int for all, so requests at different lengths share a
batch; a row whose position is 0 starts a new sequence (its old tokens are dropped). kv()
then spans the longest row and key_mask() hides each shorter row's stale slots.

Glossary: B batch, Hkv KV heads, Dh head dim, L cached length, W window, S sink tokens,
Dc KV latent, dr rope dim.
"""
import numpy as np

from scratchllm.core.validate import expect_float, expect_integer, expect_positive, expect_shape


def _zeros(fn, shape, dtype, names):
    """np.zeros(shape, dtype) for a state, each size checked to be an integer >= 1 (`names`);
    a state too large for memory raises MemoryError naming the sizes and the bytes."""
    for name, n in zip(names, shape):
        expect_integer(fn, name, n, 1)
    try:
        return np.zeros(shape, dtype)
    except MemoryError:
        gib = np.prod(shape, dtype=np.float64) * np.dtype(dtype).itemsize / 2 ** 30
        raise MemoryError(f"{fn}: {dict(zip(names, shape))} needs {gib:.3g} GiB per array, "
                          f"more than this machine can allocate") from None


def begin_step(fn, state, position):
    """Check the position of the token about to be appended to `state` (one per row) and
    return it: an int (every row; it must be the tokens every row holds) as given, or (B,)
    ints as an int64 array (row b at position[b]: 0 restarts the row, anything else must be
    the tokens the row holds)."""
    if np.ndim(position) == 0:
        expect_integer(fn, "position", position, 0)
        seen = state.n_seen  # (computed once: this runs in every layer of every step)
        if np.ndim(seen) or position != seen:
            raise ValueError(f"{fn}: position={position}, but the state holds {seen} "
                             f"tokens: the next token is at position {seen}")
        return position
    if not hasattr(state, "lengths"):
        raise ValueError(f"{fn}: this {type(state).__name__} keeps one length for all rows; "
                         f"give one int position")
    pos = np.asarray(position)
    if pos.dtype.kind not in "iu" or pos.shape != state.lengths.shape or (pos < 0).any():
        raise ValueError(f"{fn}: position must be an int or {state.lengths.shape} ints >= 0 "
                         f"(one per row), got {pos.dtype} {pos.shape}")
    state.restart(pos == 0)
    bad = np.flatnonzero(state.lengths != pos)
    if bad.size:
        b = bad[0]
        raise ValueError(f"{fn}: position[{b}]={pos[b]}, but row {b} holds "
                         f"{state.lengths[b]} tokens: its next token is at position "
                         f"{state.lengths[b]} (or 0, to start a new sequence there)")
    return pos.astype(np.int64)


def rows_mask(state):
    """state.key_mask(): None, or (B, 1, 1, L) bool when the rows hold different lengths. A
    state of the plain protocol (n_seen, append, kv, positions; one length for all rows, like
    a paged cache's view) has no key_mask: None."""
    key_mask = getattr(state, "key_mask", None)
    return None if key_mask is None else key_mask()


class _Rows:
    """Per-row lengths shared by KVState and LatentKVState: `lengths` (B,) tokens each row
    holds; `length` the longest (kv()'s extent; setting it sets every row)."""

    @property
    def length(self):
        return int(self.lengths.max())

    @length.setter
    def length(self, n):
        self.lengths[:] = n

    @property
    def n_seen(self):
        """The position of each row's next token: an int while the rows are in step, else
        the (B,) lengths."""
        same = (self.lengths == self.lengths[0]).all()
        return int(self.lengths[0]) if same else self.lengths.copy()

    def restart(self, rows):
        """Drop the tokens of `rows` (a (B,) bool mask or indices): new sequences start there."""
        self.lengths[rows] = 0

    def key_mask(self):
        """None while the rows are in step, else (B, 1, 1, length) bool: key j of row b is
        one of its tokens (j < lengths[b]), broadcastable to attention's (B, H, Tq, Tk)."""
        if np.ndim(self.n_seen) == 0:
            return None
        return (np.arange(self.length) < self.lengths[:, None])[:, None, None, :]

    def _check_room(self, longest, t):
        if longest + t > self.max_len:
            raise ValueError(f"{type(self).__name__} is full: it holds {longest} of max_len="
                             f"{self.max_len} tokens and cannot take {t} more; allocate it "
                             f"with a larger max_len or use RollingKVState")

    def _slots(self, t):
        """(rows (B, 1), slots (B, t)): where each row's next t tokens go."""
        self._check_room(self.length, t)
        return np.arange(len(self.lengths))[:, None], self.lengths[:, None] + np.arange(t)


class KVState(_Rows):
    """Per-layer keys and values of past tokens, preallocated to max_len tokens.

    Inputs: batch, n_kv_heads, head_dim, max_len, dtype.
    Holds:  k, v (B, Hkv, max_len, Dh); `length` tokens filled so far.
    """

    def __init__(self, batch, n_kv_heads, head_dim, max_len, dtype=np.float32):
        names = ("batch", "n_kv_heads", "max_len", "head_dim")
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.k = _zeros("KVState", shape, dtype, names)  # (B, Hkv, L, Dh)
        self.v = _zeros("KVState", shape, dtype, names)  # (B, Hkv, L, Dh)
        self.lengths = np.zeros(batch, np.int64)  # (B,) tokens each row holds

    @property
    def max_len(self):
        return self.k.shape[2]

    @property
    def nbytes(self):
        """Bytes held: max_len * B * 2 * Hkv * Dh * itemsize."""
        return self.k.nbytes + self.v.nbytes

    def append(self, k, v):
        """Store k, v (B, Hkv, t, Dh) after the filled part; ValueError when it would overflow."""
        expect_float("KVState.append", "k", k)
        expect_float("KVState.append", "v", v)
        expect_shape("KVState.append", "k", k, self.k.shape[:2] + (None, self.k.shape[3]),
                     "(B, Hkv, t, Dh) of this state")
        expect_shape("KVState.append", "v", v, k.shape, "like k")
        t, seen = k.shape[2], self.n_seen
        if np.ndim(seen) == 0:  # the rows in step: one slice
            self._check_room(seen, t)
            self.k[:, :, seen:seen + t] = k
            self.v[:, :, seen:seen + t] = v
        else:  # each row after its own tokens: (B, t, Hkv, Dh) in the indexed order
            rows, slots = self._slots(t)  # (B, 1), (B, t)
            self.k[rows, :, slots] = k.transpose(0, 2, 1, 3)
            self.v[rows, :, slots] = v.transpose(0, 2, 1, 3)
        self.lengths += t

    def kv(self):
        """Views of the filled keys and values, (B, Hkv, length, Dh) each (a shorter row's
        slots past its own length are stale: key_mask())."""
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def positions(self):
        """The token positions of kv()'s keys, (length,) (ALiBi's distances)."""
        return np.arange(self.length)  # (length,)


class RollingKVState(_Rows):
    """The first n_sink tokens plus a ring buffer of the last `window` tokens, per row.

    Attending to kv() after appending token i equals row i of
    attention_sink_mask(T, window, n_sink) attention. Memory: (n_sink + window) tokens.
    Rows that have seen different numbers of tokens keep different keys: kv() pads the rows
    that keep fewer, key_mask() hides the padding.
    """

    def __init__(self, window, n_sink, batch, n_kv_heads, head_dim, dtype=np.float32):
        expect_integer("RollingKVState", "n_sink", n_sink, 0)
        names = ("batch", "n_kv_heads", "window", "head_dim")
        self.ring_k = _zeros("RollingKVState", (batch, n_kv_heads, window, head_dim), dtype,
                             names)  # (B, Hkv, W, Dh)
        self.sink_k = np.zeros((batch, n_kv_heads, n_sink, head_dim), dtype)  # (B, Hkv, S, Dh)
        self.sink_v = np.zeros_like(self.sink_k)  # (B, Hkv, S, Dh)
        self.ring_v = np.zeros_like(self.ring_k)  # (B, Hkv, W, Dh)
        self.window, self.n_sink = window, n_sink
        self.lengths = np.zeros(batch, np.int64)  # (B,) tokens each row has seen

    @property
    def nbytes(self):
        """Bytes held: (n_sink + window) * B * 2 * Hkv * Dh * itemsize, whatever the length."""
        return sum(a.nbytes for a in (self.sink_k, self.sink_v, self.ring_k, self.ring_v))

    def append(self, k, v):
        """Store k, v (B, Hkv, t, Dh) token by token, overwriting each row's oldest ring slot."""
        expect_float("RollingKVState.append", "k", k)
        expect_float("RollingKVState.append", "v", v)
        expect_shape("RollingKVState.append", "k", k,
                     self.ring_k.shape[:2] + (None, self.ring_k.shape[3]), "(B, Hkv, t, Dh)")
        expect_shape("RollingKVState.append", "v", v, k.shape, "like k")
        rows = np.arange(k.shape[0])
        for j in range(k.shape[2]):
            n = self.lengths  # (B,) the position of each row's token j
            sink = n < self.n_sink  # (B,) rows whose token is still a sink
            self.sink_k[rows[sink], :, n[sink]] = k[sink, :, j]  # (rows, Hkv, Dh)
            self.sink_v[rows[sink], :, n[sink]] = v[sink, :, j]
            self.ring_k[rows, :, n % self.window] = k[:, :, j]  # (B, Hkv, Dh)
            self.ring_v[rows, :, n % self.window] = v[:, :, j]
            self.lengths += 1

    def _kept(self, n):
        """(indices into [sinks | ring], positions) of the keys a row that has seen n tokens
        keeps, in position order: the sinks no longer in the window, then the window."""
        W = self.window
        sinks = np.arange(max(0, min(self.n_sink, n - W)))  # (n_sink_out,)
        window = np.arange(max(0, n - W), n)  # (min(n, W),)
        return (np.concatenate([sinks, self.n_sink + window % W]),
                np.concatenate([sinks, window]))

    def _rows(self):
        """(B, n_kept) indices and positions of every row's kept keys, padded with 0 (the
        padding is what key_mask() hides); and (B,) how many each row keeps."""
        kept = [self._kept(int(n)) for n in self.lengths]
        count = np.array([len(i) for i, _ in kept])
        index, pos = (np.zeros((len(kept), count.max()), np.int64) for _ in range(2))
        for b, (i, p) in enumerate(kept):
            index[b, :len(i)], pos[b, :len(p)] = i, p
        return index, pos, count

    def kv(self):
        """Keys and values in position order: sinks no longer in the window, then the window.

        Returns: k, v (B, Hkv, n_kept, Dh) (rows in step; else n_kept is the most any row
        keeps).
        """
        if np.ndim(self.n_seen) == 0:  # the rows in step: slices, no padding
            n, W = self.n_seen, self.window
            n_sink_out = max(0, min(self.n_sink, n - W))  # sinks that fell out of the window
            order = np.arange(max(0, n - W), n) % W  # ring slots, oldest first
            k = np.concatenate([self.sink_k[:, :, :n_sink_out], self.ring_k[:, :, order]], 2)
            v = np.concatenate([self.sink_v[:, :, :n_sink_out], self.ring_v[:, :, order]], 2)
            return k, v  # (B, Hkv, n_kept, Dh) each
        index = self._rows()[0][:, None, :, None]  # (B, 1, n_kept, 1)
        k = np.take_along_axis(np.concatenate([self.sink_k, self.ring_k], axis=2), index, 2)
        v = np.take_along_axis(np.concatenate([self.sink_v, self.ring_v], axis=2), index, 2)
        return k, v  # (B, Hkv, n_kept, Dh) each

    def positions(self):
        """The token positions of kv()'s keys in its order: (n_kept,), or (B, 1, 1, n_kept)
        when the rows differ."""
        if np.ndim(self.n_seen) == 0:
            return self._kept(self.n_seen)[1]  # (n_kept,)
        return self._rows()[1][:, None, None, :]  # (B, 1, 1, n_kept)

    def key_mask(self):
        """None while the rows are in step, else (B, 1, 1, n_kept) bool: the keys each row
        keeps (not kv()'s padding)."""
        if np.ndim(self.n_seen) == 0:
            return None
        count = self._rows()[2]  # (B,)
        return (np.arange(count.max()) < count[:, None])[:, None, None, :]


class LatentKVState(_Rows):
    """One MLA layer's absorbed-form decoding state, preallocated: latents[b, t] = [kv_norm(c_kv) | k_pe]
    (Dc + dr numbers per token, shared by all heads). `nbytes` is the memory it holds."""

    def __init__(self, batch, max_len, kv_lora_rank, qk_rope_head_dim, dtype=np.float32):
        for name, n in (("batch", batch), ("max_len", max_len), ("kv_lora_rank", kv_lora_rank),
                        ("qk_rope_head_dim", qk_rope_head_dim)):
            expect_positive("LatentKVState", name, n)
        self.latents = np.zeros((batch, max_len, kv_lora_rank + qk_rope_head_dim), dtype)  # (B, L, Dc+dr)
        self.kv_lora_rank = kv_lora_rank
        self.lengths = np.zeros(batch, np.int64)  # (B,) tokens each row holds

    @property
    def max_len(self):
        return self.latents.shape[1]

    @property
    def nbytes(self):
        return self.latents.nbytes

    @property
    def kv(self):
        """kv_norm(c_kv) of the cached tokens, (B, t, Dc) view."""
        return self.latents[:, :self.length, :self.kv_lora_rank]

    @property
    def pe(self):
        """The roped shared keys of the cached tokens, (B, t, dr) view."""
        return self.latents[:, :self.length, self.kv_lora_rank:]

    def append(self, ckv, k_pe):
        """Store one token: ckv (B, Dc), k_pe (B, dr)."""
        B, L, W = self.latents.shape
        expect_shape("LatentKVState.append", "ckv", ckv, (B, self.kv_lora_rank), "(B, Dc)")
        expect_shape("LatentKVState.append", "k_pe", k_pe, (B, W - self.kv_lora_rank), "(B, dr)")
        if self.lengths.max() == L:
            raise ValueError(f"LatentKVState.append: the state is full ({L} tokens = max_len); "
                             f"make a larger state")
        rows, slots = self._slots(1)  # each row after its own tokens
        self.latents[rows[:, 0], slots[:, 0], :self.kv_lora_rank] = ckv
        self.latents[rows[:, 0], slots[:, 0], self.kv_lora_rank:] = k_pe
        self.lengths += 1
