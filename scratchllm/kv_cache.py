"""KV caches and one-token GQA decoding (inference only, no backward).

Autoregressive decoding recomputes nothing for past tokens: each layer keeps the (already
rotated) keys and values of every past token, and a new token only computes its own q, k, v:
    k_t, v_t appended;  o_t = softmax(q_t K^T / sqrt(Dh)) V;  y_t = o_t Wo
KVCache is preallocated to max_len (2 Hkv Dh itemsize bytes per token per layer).
RollingKVCache keeps only the first n_sink tokens and a ring buffer of the last `window`
(StreamingLLM, Xiao et al. 2023, arXiv 2309.17453; Mistral's rolling buffer): memory
O(window), and attending to it equals attention_sink_mask(T, window, n_sink) attention.

Glossary: B batch, D model width, H query heads, Hkv KV heads, G = H / Hkv, Dh head dim,
L cached length, W window, S sink tokens.
"""
import numpy as np

from scratchllm.attention import merge_heads, project_qkv, sdpa_forward
from scratchllm.ops import linear_forward
from scratchllm.validate import expect_shape


class KVCache:
    """Per-layer cache of keys and values, preallocated to max_len tokens.

    Inputs: batch, n_kv_heads, head_dim, max_len, dtype.
    Holds:  k, v (B, Hkv, max_len, Dh); `length` tokens filled so far.
    """

    def __init__(self, batch, n_kv_heads, head_dim, max_len, dtype=np.float32):
        self.k = np.zeros((batch, n_kv_heads, max_len, head_dim), dtype)  # (B, Hkv, L, Dh)
        self.v = np.zeros((batch, n_kv_heads, max_len, head_dim), dtype)  # (B, Hkv, L, Dh)
        self.length = 0

    @property
    def max_len(self):
        return self.k.shape[2]

    @property
    def nbytes(self):
        """Bytes held: max_len * B * 2 * Hkv * Dh * itemsize."""
        return self.k.nbytes + self.v.nbytes

    def append(self, k, v):
        """Store k, v (B, Hkv, t, Dh) after the filled part; ValueError when it would overflow."""
        expect_shape("KVCache.append", "k", k, self.k.shape[:2] + (None, self.k.shape[3]),
                     "(B, Hkv, t, Dh) of this cache")
        expect_shape("KVCache.append", "v", v, k.shape, "like k")
        t = k.shape[2]
        if self.length + t > self.max_len:
            raise ValueError(f"KVCache is full: it holds {self.length} of max_len="
                             f"{self.max_len} tokens and cannot take {t} more; allocate it "
                             f"with a larger max_len or use RollingKVCache")
        self.k[:, :, self.length:self.length + t] = k
        self.v[:, :, self.length:self.length + t] = v
        self.length += t

    def kv(self):
        """Views of the filled keys and values, (B, Hkv, length, Dh) each."""
        return self.k[:, :, :self.length], self.v[:, :, :self.length]


class RollingKVCache:
    """The first n_sink tokens plus a ring buffer of the last `window` tokens.

    Attending to kv() after appending token i equals row i of
    attention_sink_mask(T, window, n_sink) attention. Memory: (n_sink + window) tokens.
    """

    def __init__(self, window, n_sink, batch, n_kv_heads, head_dim, dtype=np.float32):
        if window < 1 or n_sink < 0:
            raise ValueError(f"RollingKVCache: need window >= 1 and n_sink >= 0, got "
                             f"window={window}, n_sink={n_sink}")
        shape = (batch, n_kv_heads, 0, head_dim)
        self.sink_k = np.zeros(shape[:2] + (n_sink,) + shape[3:], dtype)  # (B, Hkv, S, Dh)
        self.sink_v = np.zeros_like(self.sink_k)  # (B, Hkv, S, Dh)
        self.ring_k = np.zeros(shape[:2] + (window,) + shape[3:], dtype)  # (B, Hkv, W, Dh)
        self.ring_v = np.zeros_like(self.ring_k)  # (B, Hkv, W, Dh)
        self.window, self.n_sink, self.n_seen = window, n_sink, 0

    @property
    def nbytes(self):
        """Bytes held: (n_sink + window) * B * 2 * Hkv * Dh * itemsize, whatever the length."""
        return sum(a.nbytes for a in (self.sink_k, self.sink_v, self.ring_k, self.ring_v))

    def append(self, k, v):
        """Store k, v (B, Hkv, t, Dh) token by token, overwriting the oldest ring slot."""
        expect_shape("RollingKVCache.append", "k", k,
                     self.ring_k.shape[:2] + (None, self.ring_k.shape[3]), "(B, Hkv, t, Dh)")
        expect_shape("RollingKVCache.append", "v", v, k.shape, "like k")
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


def gqa_decode(x_t, wq, wk, wv, wo, cache, position, *, n_heads, n_kv_heads, inv_freq=None,
               rope_style="half", attention_factor=1.0):
    """One decoding step of gqa_forward for the token at `position`; appends to `cache`.

    Inputs:  x_t (B, D); weights as gqa_forward; cache a KVCache or RollingKVCache; position
             int (the token's absolute index, used by RoPE).
    Returns: y_t (B, D), equal to the corresponding row of the full causal forward.
    """
    pos = np.array([position])  # (1,)
    q, k, v, _ = project_qkv(x_t[:, None], wq, wk, wv, n_heads, n_kv_heads, pos, inv_freq,
                             rope_style, attention_factor)  # (B, H, 1, Dh), (B, Hkv, 1, Dh)
    cache.append(k, v)
    K, V = cache.kv()  # (B, Hkv, L, Dh); every cached key is at or before `position`
    o, _ = sdpa_forward(q, K, V)  # (B, H, 1, Dh), query head h reads KV head h // G
    y, _ = linear_forward(merge_heads(o), wo)  # (B, 1, D)
    return y[:, 0]  # (B, D)
