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


class KVState:
    """Per-layer keys and values of past tokens, preallocated to max_len tokens.

    Inputs: batch, n_kv_heads, head_dim, max_len, dtype.
    Holds:  k, v (B, Hkv, max_len, Dh); `length` tokens filled so far.
    """

    def __init__(self, batch, n_kv_heads, head_dim, max_len, dtype=np.float32):
        names = ("batch", "n_kv_heads", "max_len", "head_dim")
        shape = (batch, n_kv_heads, max_len, head_dim)
        self.k = _zeros("KVState", shape, dtype, names)  # (B, Hkv, L, Dh)
        self.v = _zeros("KVState", shape, dtype, names)  # (B, Hkv, L, Dh)
        self.length = 0

    @property
    def max_len(self):
        return self.k.shape[2]

    @property
    def n_seen(self):
        """Tokens appended so far (the position of the next one)."""
        return self.length

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
        t = k.shape[2]
        if self.length + t > self.max_len:
            raise ValueError(f"KVState is full: it holds {self.length} of max_len="
                             f"{self.max_len} tokens and cannot take {t} more; allocate it "
                             f"with a larger max_len or use RollingKVState")
        self.k[:, :, self.length:self.length + t] = k
        self.v[:, :, self.length:self.length + t] = v
        self.length += t

    def kv(self):
        """Views of the filled keys and values, (B, Hkv, length, Dh) each."""
        return self.k[:, :, :self.length], self.v[:, :, :self.length]

    def positions(self):
        """The token positions of kv()'s keys, (length,) (ALiBi's distances)."""
        return np.arange(self.length)  # (length,)


class RollingKVState:
    """The first n_sink tokens plus a ring buffer of the last `window` tokens.

    Attending to kv() after appending token i equals row i of
    attention_sink_mask(T, window, n_sink) attention. Memory: (n_sink + window) tokens.
    """

    def __init__(self, window, n_sink, batch, n_kv_heads, head_dim, dtype=np.float32):
        expect_integer("RollingKVState", "n_sink", n_sink, 0)
        names = ("batch", "n_kv_heads", "window", "head_dim")
        self.ring_k = _zeros("RollingKVState", (batch, n_kv_heads, window, head_dim), dtype,
                             names)  # (B, Hkv, W, Dh)
        self.sink_k = np.zeros((batch, n_kv_heads, n_sink, head_dim), dtype)  # (B, Hkv, S, Dh)
        self.sink_v = np.zeros_like(self.sink_k)  # (B, Hkv, S, Dh)
        self.ring_v = np.zeros_like(self.ring_k)  # (B, Hkv, W, Dh)
        self.window, self.n_sink, self.n_seen = window, n_sink, 0

    @property
    def nbytes(self):
        """Bytes held: (n_sink + window) * B * 2 * Hkv * Dh * itemsize, whatever the length."""
        return sum(a.nbytes for a in (self.sink_k, self.sink_v, self.ring_k, self.ring_v))

    def append(self, k, v):
        """Store k, v (B, Hkv, t, Dh) token by token, overwriting the oldest ring slot."""
        expect_float("RollingKVState.append", "k", k)
        expect_float("RollingKVState.append", "v", v)
        expect_shape("RollingKVState.append", "k", k,
                     self.ring_k.shape[:2] + (None, self.ring_k.shape[3]), "(B, Hkv, t, Dh)")
        expect_shape("RollingKVState.append", "v", v, k.shape, "like k")
        for j in range(k.shape[2]):
            n = self.n_seen
            if n < self.n_sink:
                self.sink_k[:, :, n], self.sink_v[:, :, n] = k[:, :, j], v[:, :, j]
            self.ring_k[:, :, n % self.window] = k[:, :, j]
            self.ring_v[:, :, n % self.window] = v[:, :, j]
            self.n_seen += 1

    def kv(self):
        """Keys and values in position order: sinks no longer in the window, then the window.

        Returns: k, v (B, Hkv, n_kept, Dh).
        """
        n, W = self.n_seen, self.window
        n_sink_out = max(0, min(self.n_sink, n - W))  # sinks that fell out of the window
        order = np.arange(max(0, n - W), n) % W  # ring slots, oldest first
        k = np.concatenate([self.sink_k[:, :, :n_sink_out], self.ring_k[:, :, order]], axis=2)
        v = np.concatenate([self.sink_v[:, :, :n_sink_out], self.ring_v[:, :, order]], axis=2)
        return k, v  # (B, Hkv, n_kept, Dh) each

    def positions(self):
        """The token positions of kv()'s keys in its order, (n_kept,)."""
        n, W = self.n_seen, self.window
        sinks = np.arange(max(0, min(self.n_sink, n - W)))  # (n_sink_out,)
        return np.concatenate([sinks, np.arange(max(0, n - W), n)])  # (n_kept,)


class LatentKVState:
    """One MLA layer's absorbed-form decoding state, preallocated: latents[b, t] = [kv_norm(c_kv) | k_pe]
    (Dc + dr numbers per token, shared by all heads). `nbytes` is the memory it holds."""

    def __init__(self, batch, max_len, kv_lora_rank, qk_rope_head_dim, dtype=np.float32):
        for name, n in (("batch", batch), ("max_len", max_len), ("kv_lora_rank", kv_lora_rank),
                        ("qk_rope_head_dim", qk_rope_head_dim)):
            expect_positive("LatentKVState", name, n)
        self.latents = np.zeros((batch, max_len, kv_lora_rank + qk_rope_head_dim), dtype)  # (B, L, Dc+dr)
        self.kv_lora_rank = kv_lora_rank
        self.length = 0

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
        if self.length == L:
            raise ValueError(f"LatentKVState.append: the state is full ({L} tokens = max_len); "
                             f"make a larger state")
        self.latents[:, self.length, :self.kv_lora_rank] = ckv
        self.latents[:, self.length, self.kv_lora_rank:] = k_pe
        self.length += 1
