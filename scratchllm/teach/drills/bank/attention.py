"""The drills of scratchllm.attention: the sdpa and RoPE backwards, the GQA forward, the
sliding-window mask, the ALiBi bias, flash attention's forward."""
import tracemalloc

import numpy as np

from scratchllm import attention
from scratchllm.attention import rope
from scratchllm.specs import AttentionSpec, Mask
from scratchllm.teach.drills.bank._common import (assert_close, causal_check, drill,
                                                  gradient_check, seeded_rng)


# ---------------------------------------------------------------------------- sdpa
def _sdpa_inputs(masked_row=False):
    r = seeded_rng(4)
    mask = attention.causal_mask(5)
    if masked_row:
        mask = mask.copy()
        mask[2] = False
    return dict(q=r.standard_normal((2, 3, 5, 4)), k=r.standard_normal((2, 3, 5, 4)),
                v=r.standard_normal((2, 3, 5, 4)), mask=mask, scale=0.5)


def _sdpa_forward(q, k, v, mask, scale):
    """The library's sdpa_forward with the drill's boolean mask."""
    return attention.sdpa_forward(q, k, v, Mask(array=mask), scale)


@drill("sdpa_backward", 15, "scratchllm/attention/sdpa.py", '''
    def sdpa_backward(dout, q, k, v, mask, scale):
        """Backward of out = softmax(q k^T * scale, masked) v.

        q, k, v, dout (B, H, T, Dh); mask (T, T) bool, True = may attend (a fully masked row
        outputs zeros).  Return (dq, dk, dv), each (B, H, T, Dh).
        Reach: P = softmax(S);  dv = P^T dout;  dP = dout v^T;
               dS = P * (dP - rowsum(dP * P));  dq = scale dS k;  dk = scale dS^T q
        """
''', [
    ("gradient check, causal mask", lambda fn: gradient_check(
        _sdpa_forward, lambda d, kw: fn(d, **kw), ["q", "k", "v"], **_sdpa_inputs())),
    ("fully masked row: finite, zero gradient for its query", lambda fn: _sdpa_masked_row(fn)),
])
def _sdpa_backward(dout, q, k, v, mask, scale):
    g = attention.sdpa_backward(dout, _sdpa_forward(q, k, v, mask, scale)[1])
    return g["q"], g["k"], g["v"]


def _sdpa_masked_row(fn):
    inp = _sdpa_inputs(masked_row=True)
    dq, dk, dv = fn(seeded_rng(5).standard_normal(inp["q"].shape), **inp)
    if not all(np.isfinite(a).all() for a in (dq, dk, dv)):
        raise AssertionError("gradients contain NaN or inf")
    if np.abs(dq[:, :, 2]).max() != 0:
        raise AssertionError("dq of the fully masked query row must be exactly 0")
    return gradient_check(_sdpa_forward, lambda d, kw: fn(d, **kw), ["q", "k", "v"], **inp)


# ---------------------------------------------------------------------------- rope
def _rope_inputs():
    inv_freq, _ = rope.rope_frequencies(6)
    return dict(x=seeded_rng(6).standard_normal((2, 5, 6)), positions=np.array([0, 1, 2, 7, 9]),
                inv_freq=inv_freq)


def _rope_forward(x, positions, inv_freq):
    """The library's rope_forward, "half" pairing, for the drill's arguments."""
    return rope.rope_forward(x, rope.Rope(inv_freq, "half", 1.0, positions))


@drill("rope_backward", 10, "scratchllm/attention/rope.py", '''
    def rope_backward(dy, positions, inv_freq):
        """Backward of RoPE, "half" pairing (HF rotate_half): pairs (i, i + Dh/2) of x rotated
        by theta_{t,i} = positions[t] * inv_freq[i].

        dy (..., T, Dh); positions (T,) ints; inv_freq (Dh/2,).  Return dx (..., T, Dh).
        Reach: the rotation is orthogonal, so dx = R(-theta) dy:
               dx = dy * cos - rotate_half(dy * sin),  rotate_half(u) = cat(-u2, u1)
        """
''', [
    ("gradient check", lambda fn: gradient_check(
        _rope_forward, lambda d, kw: fn(d, kw["positions"], kw["inv_freq"]), ["x"],
        **_rope_inputs())),
    ("norm preserved: |dx| == |dy| per position", lambda fn: _rope_norm(fn)),
])
def _rope_backward(dy, positions, inv_freq):
    cache = _rope_forward(np.zeros_like(dy), positions, inv_freq)[1]
    return rope.rope_backward(dy, cache)["x"]


def _rope_norm(fn):
    inp = _rope_inputs()
    dy = seeded_rng(7).standard_normal(inp["x"].shape)
    dx = fn(dy, inp["positions"], inp["inv_freq"])
    return assert_close(np.linalg.norm(dx, axis=-1), np.linalg.norm(dy, axis=-1), what="|dx|")


# ---------------------------------------------------------------------------- gqa
def _gqa_inputs(n_heads=6, n_kv_heads=2):
    r, D, Dh = seeded_rng(8), 10, 4
    return dict(x=r.standard_normal((2, 5, D)), wq=r.standard_normal((D, n_heads * Dh)),
                wk=r.standard_normal((D, n_kv_heads * Dh)),
                wv=r.standard_normal((D, n_kv_heads * Dh)),
                wo=r.standard_normal((n_heads * Dh, D)), n_heads=n_heads, n_kv_heads=n_kv_heads)


@drill("gqa_forward", 20, "scratchllm/attention/gqa.py", '''
    def gqa_forward(x, wq, wk, wv, wo, n_heads, n_kv_heads):
        """Causal grouped-query self-attention, no RoPE, scale Dh^-1/2.

        x (B, T, D); wq (D, H*Dh); wk, wv (D, Hkv*Dh); wo (H*Dh, D).  Return y (B, T, D).
        Reach: q = x wq split into H heads (B, H, T, Dh), k, v into Hkv heads;
               query head h reads KV head h // (H / Hkv);
               o_h = softmax(q_h k^T / sqrt(Dh) + causal mask) v;  y = concat_h(o_h) wo
        """
''', [
    ("equals scratchllm.attention.gqa_forward (H=6, Hkv=2)", lambda fn: _gqa_vs_library(fn, 2)),
    ("MQA (Hkv=1) and MHA (Hkv=H) too", lambda fn: _gqa_vs_library(fn, 1)
     + "; " + _gqa_vs_library(fn, 6)),
    ("causal: a future token changes no earlier output", lambda fn: _gqa_causal(fn)),
])
def _gqa_forward(x, wq, wk, wv, wo, n_heads, n_kv_heads):
    spec = AttentionSpec(n_heads, n_kv_heads, head_dim=wq.shape[1] // n_heads, rope=None)
    return attention.gqa_forward(x, attention.AttentionWeights(wq, wk, wv, wo), spec=spec)[0]


def _gqa_vs_library(fn, n_kv_heads):
    inp = _gqa_inputs(n_kv_heads=n_kv_heads)
    return assert_close(fn(**inp), _gqa_forward(**inp), what=f"y (Hkv={n_kv_heads})")


def _gqa_causal(fn):
    return causal_check(fn, _gqa_inputs(), 3)


# ---------------------------------------------------------------------------- masks, alibi, flash
@drill("sliding_window_mask", 5, "scratchllm/attention/masks.py", '''
    def sliding_window_mask(T, window):
        """(T, T) bool, True = may attend: causal, and only the last `window` keys (Mistral).

        Reach: query i sees key j iff  i - window < j <= i.
        """
''', [
    ("equals scratchllm.attention.sliding_window_mask (T 7, W 1..8)",
     lambda fn: _mask_vs_library(fn)),
    ("a bool array; window >= T is the causal mask", lambda fn: _mask_properties(fn)),
])
def _sliding_window_mask(T, window):
    return attention.sliding_window_mask(T, window)


def _mask_vs_library(fn):
    for W in range(1, 9):
        got = np.asarray(fn(7, W))
        if got.dtype != bool or not np.array_equal(got, attention.sliding_window_mask(7, W)):
            raise AssertionError(f"window {W}: got {got.astype(int).tolist()}")
    return "8 windows equal"


def _mask_properties(fn):
    got = fn(6, 10)
    if not isinstance(got, np.ndarray) or got.dtype != bool:
        raise AssertionError(f"expected a bool array, got {getattr(got, 'dtype', type(got))}")
    if not np.array_equal(got, np.tril(np.ones((6, 6), bool))):
        raise AssertionError("window 10 >= T 6 must give the causal mask")
    return "ok"


@drill("document_mask", 10, "scratchllm/attention/sparse_masks.py", '''
    def document_mask(doc_ids):
        """Packed sequences (Llama 3): doc_ids (T,) ints, the document of each token, each
        run of equal ids one document. Return (mask (T, T) bool, positions (T,) ints).

        Reach: query i sees key j iff j <= i and doc_ids[j] == doc_ids[i]; a token's position
        counts the tokens of its own document before it (0 at each document's start), so
        RoPE sees what the document alone would.
        """
''', [
    ("equals document_mask and document_positions on random packings",
     lambda fn: _packing_vs_library(fn)),
    ("one document is the causal mask at positions 0..T-1", lambda fn: _packing_one_doc(fn)),
])
def _document_mask(doc_ids):
    return attention.document_mask(doc_ids), attention.document_positions(doc_ids)


def _packing_vs_library(fn):
    r = seeded_rng(31)
    for _ in range(5):
        doc = np.sort(r.integers(0, 4, 11))  # (T,) non-decreasing: runs are documents
        mask, pos = fn(doc)
        if np.asarray(mask).dtype != bool or not np.array_equal(mask,
                                                                attention.document_mask(doc)):
            raise AssertionError(f"doc_ids {doc.tolist()}: mask {np.asarray(mask, int)}")
        if not np.array_equal(pos, attention.document_positions(doc)):
            raise AssertionError(f"doc_ids {doc.tolist()}: positions {list(pos)}")
    return "5 packings equal"


def _packing_one_doc(fn):
    mask, pos = fn(np.zeros(6, int))
    if not np.array_equal(mask, np.tril(np.ones((6, 6), bool))) or list(pos) != list(range(6)):
        raise AssertionError("one document must give the causal mask and positions 0..5")
    return "ok"


@drill("alibi_bias", 5, "scratchllm/attention/positions.py", '''
    def alibi_bias(n_heads, T):
        """ALiBi's (H, T, T) bias added to the attention scores (Press et al. 2021), H a power
        of two.

        Reach: slopes m_h = 2^(-8 h / H) for h = 1..H;  bias[h, i, j] = -m_h |i - j|
        """
''', [
    ("equals alibi_bias(alibi_slopes(H), T, T) for H = 8", lambda fn: assert_close(
        fn(8, 6), attention.alibi_bias(attention.alibi_slopes(8), 6, 6), what="bias (H=8)")),
    ("and for H = 4, T = 3", lambda fn: assert_close(
        fn(4, 3), attention.alibi_bias(attention.alibi_slopes(4), 3, 3), what="bias (H=4)")),
])
def _alibi_bias(n_heads, T):
    return attention.alibi_bias(attention.alibi_slopes(n_heads), T, T)


def _flash_inputs(T=13):
    r = seeded_rng(21)
    return [r.standard_normal((3, T, 4)) for _ in range(3)]


@drill("flash_attention_forward", 20, "scratchllm/attention/flash.py", '''
    def flash_attention_forward(q, k, v, block):
        """Causal attention, tiled: never build the (T, T) score matrix. Scale Dh^-1/2.

        q, k, v (H, T, Dh); block: rows and keys per tile (T need not be a multiple).
        Return (out (H, T, Dh), lse (H, T)), lse = log sum_j exp(S_ij) over the allowed keys.
        Reach: per query block, running m (row max), l (row sum), acc (H, bq, Dh); per key
               block S = q k^T scale (masked j > i to -inf), m' = max(m, rowmax S),
               l = exp(m - m') l + rowsum exp(S - m'), acc = exp(m - m') acc + exp(S - m') v,
               m = m'; at the end out = acc / l, lse = m + log l.
        """
''', [
    ("out equals causal sdpa (T 13, blocks 4 and 5)", lambda fn: _flash_vs_sdpa(fn)),
    ("lse is the row logsumexp of the masked scores", lambda fn: _flash_lse(fn)),
    ("peak memory at T = 1024 far below the T x T matrix", lambda fn: _flash_memory(fn)),
])
def _flash_attention_forward(q, k, v, block):
    out, cache = attention.flash_sdpa_forward(q[None], k[None], v[None], mask=Mask(),
                                              block=block)
    return out[0], cache.lse[0, :, :, 0]


def _flash_vs_sdpa(fn):
    q, k, v = _flash_inputs()
    want = attention.sdpa_forward(q[None], k[None], v[None], Mask())[0][0]
    for block in (4, 5):
        assert_close(fn(q, k, v, block)[0], want, what=f"out (block {block})")
    return "blocks 4, 5 equal"


def _flash_lse(fn):
    q, k, v = _flash_inputs()
    s = np.where(attention.causal_mask(13), q @ k.swapaxes(-1, -2) / 2.0, -np.inf)  # Dh 4
    m = s.max(-1, keepdims=True)
    want = (m + np.log(np.exp(s - m).sum(-1, keepdims=True)))[..., 0]  # (H, T)
    return assert_close(fn(q, k, v, 4)[1], want, what="lse")


def _flash_memory(fn):
    q, k, v = [a.repeat(79, axis=1)[:, :1024] for a in _flash_inputs()]
    tracemalloc.start()
    try:
        fn(q, k, v, 64)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    matrix = 3 * 1024 * 1024 * 8
    if not peak < matrix / 4:
        raise AssertionError(f"peak {peak / 2**20:.1f} MiB, the (H, T, T) matrix is "
                             f"{matrix / 2**20:.0f} MiB: a tile is not a row")
    return f"peak {peak / 2**20:.1f} MiB of {matrix / 2**20:.0f}"
