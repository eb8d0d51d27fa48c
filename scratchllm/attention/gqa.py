"""Grouped-query attention (GQA, Ainslie et al. 2023, arXiv 2305.13245): the training pair,
one-token decoding with a KV state, and the Attention Module. Covers multi-head (Hkv = H) and
multi-query (Hkv = 1) attention.

Math:
    q = rope(x Wq), k = rope(x Wk), v = x Wv;  query head h reads KV head h // G;
    y = concat_heads(sdpa(q, k, v)) Wo
Options the published checkpoints need: biases on the projections (x Wq + bq, ...: Qwen2,
GPT-2), QK-norm (q = rope(rmsnorm_Dh(x Wq) * gq), an RMSNorm over each head vector before
RoPE: Qwen3, Gemma 3; Dehghani et al. 2023, arXiv 2302.05442), no RoPE (GPT-2's learned
positions), and a softmax scale other than Dh^-1/2 (Gemma 3's query_pre_attn_scalar^-1/2).
Backward: the linear, sdpa, rope (rotation by -theta) and KV-sharing (a sum over the G query
heads of each group) backwards, each through its own pair.
Decoding keeps the (already rotated) keys and values of past tokens in a KVState (or a
RollingKVState for a sliding window, kv_state.py): a new token computes only its own q, k, v.

Glossary: B batch, T time, D model width, H query heads, Hkv KV heads, G = H / Hkv,
Dh head dim, W window, S sink tokens.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.flash import FlashCache, flash_sdpa_backward, flash_sdpa_forward
from scratchllm.attention.kv_state import KVState, RollingKVState
from scratchllm.attention.masks import attention_sink_mask, causal_mask, sliding_window_mask
from scratchllm.attention.positions import alibi_bias, alibi_slopes
from scratchllm.attention.qkv import QKV, QKVCache, project_qkv_backward, project_qkv_forward
from scratchllm.attention.rope import rope_frequencies
from scratchllm.attention.sdpa import (SDPACache, merge_heads, repeat_kv_backward,
                                       repeat_kv_forward, sdpa_backward, sdpa_forward,
                                       split_heads)
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import linear_backward, linear_forward, linear_out
from scratchllm.core.validate import expect_dout, expect_integer, expect_shape


class GQACache(NamedTuple):
    qkv: QKVCache
    rep: tuple  # RepeatKVCache in gqa_forward_ref; None when sdpa shares the heads itself
    sdpa: SDPACache  # or a FlashCache (attn_impl="flash")
    lin_o: tuple
    k: np.ndarray  # (B, Hkv, T, Dh) the rotated keys and values attended: what a KV state
    v: np.ndarray  # (B, Hkv, T, Dh) holds after these tokens (Attention.prefill)


def _resolve_mask(mask, window, T):
    """A mask name ("causal", "sliding" with window, "none"/None) or a bool array. A window
    acts on "causal" (it becomes "sliding"); with any other mask it would be ignored: an
    error."""
    if window is not None and not (isinstance(mask, str) and mask in ("causal", "sliding")):
        shown = "a mask array" if isinstance(mask, np.ndarray) else repr(mask)
        raise ValueError(f"gqa: window={window!r} has no effect with mask={shown}; give "
                         f"mask='causal' or 'sliding', or build the mask with "
                         f"sliding_window_mask / attention_sink_mask")
    if mask is None or (isinstance(mask, str) and mask == "none"):
        return None
    if isinstance(mask, str) and mask == "causal" and window is None:
        return causal_mask(T)  # (T, T)
    if isinstance(mask, str) and mask in ("causal", "sliding"):
        if window is None or window < 1:
            raise ValueError(f"gqa: mask='sliding' needs window >= 1, got window={window!r}")
        return sliding_window_mask(T, window)  # (T, T)
    if isinstance(mask, np.ndarray):
        return mask
    raise ValueError(f"gqa: mask must be 'causal', 'sliding', 'none', None or a bool array, "
                     f"got {mask!r}")


class AttnOptions(NamedTuple):
    """How gqa attends (issue 14's options; the defaults are plain sdpa)."""
    impl: str = "sdpa"      # "sdpa" (dense, mask arrays allowed) | "flash" (tiled, named masks)
    alibi: np.ndarray = None  # (H,) fixed ALiBi slopes, or None
    n_sink: int = 0         # sink tokens kept beside mask="sliding"
    block: int = 128        # flash's block_q = block_k


def _attend(q, k, v, mask, window, attn, scale=None, sinks=None):
    """sdpa or flash_sdpa of (q, k, v) under the named (or array) mask, ALiBi slopes and
    sink logits."""
    T = q.shape[2]
    if attn.impl == "sdpa":
        if attn.n_sink:  # the window is inside the sink mask
            mask, window = attention_sink_mask(T, window, attn.n_sink), None  # (T, T)
        bias = None if attn.alibi is None else alibi_bias(attn.alibi, T, T)  # (H, T, T)
        return sdpa_forward(q, k, v, _resolve_mask(mask, window, T), scale, bias=bias,
                            sinks=sinks)
    if attn.impl != "flash" or not (mask is None or isinstance(mask, str)):
        raise ValueError(f"gqa: attn.impl must be 'sdpa' or 'flash' (flash takes a mask name, "
                         f"not an array), got impl={attn.impl!r}, mask {type(mask).__name__}")
    _resolve_mask(mask, window, 1)  # the same checks of the name and window
    named = {"causal": dict(causal=True), "sliding": dict(causal=True, window=window,
                                                          n_sink=attn.n_sink)}
    return flash_sdpa_forward(q, k, v, attn.alibi, **named.get(mask, {}), scale=scale,
                              block_q=attn.block, block_k=attn.block, sinks=sinks)


def gqa_forward(x, wq, wk, wv, wo, bq=None, bk=None, bv=None, bo=None, q_norm=None,
                k_norm=None, sinks=None, *, n_heads, n_kv_heads, positions=None, inv_freq=None,
                rope_style="half", attention_factor=1.0, mask="causal", window=None,
                scale=None, norm_eps=1e-6, attn=None):
    """Grouped-query self-attention: y = concat_h sdpa(q_h, k_{h//G}, v_{h//G}) @ wo (+ bo).

    Inputs:  x (B, T, D); wq (D, H*Dh); wk, wv (D, Hkv*Dh); wo (H*Dh, D); optional biases bq,
             bk, bv, bo and QK-norm gains q_norm, k_norm (Dh,) (project_qkv_forward);
             sinks (H,) gpt-oss's learned sink logits (sdpa_forward) or None;
             positions (T,) or (B, T) ints (default arange(T)); inv_freq (Dh/2,) or None for
             no RoPE; mask "causal" | "sliding" (with window) | "none" | bool array
             broadcastable to (B, H, T, T); scale: softmax scale (default Dh^-1/2); attn None
             (sdpa), or an AttnOptions: ALiBi slopes, n_sink beside a sliding window, impl
             "flash" (flash_sdpa, mask by name) or "sdpa".
    Returns: y (B, T, D).  Cache: GQACache (qkv, sdpa and output-linear caches).
    Fast path: sdpa attends the G query heads of a group to their KV head directly.
    gqa_forward_ref is its twin that copies each KV head G times first (HF repeat_kv).
    """
    return _gqa(locals(), expand_kv=False)


def gqa_forward_ref(x, wq, wk, wv, wo, bq=None, bk=None, bv=None, bo=None, q_norm=None,
                    k_norm=None, sinks=None, *, n_heads, n_kv_heads, positions=None, inv_freq=None,
                    rope_style="half", attention_factor=1.0, mask="causal", window=None,
                    scale=None, norm_eps=1e-6, attn=None):
    """gqa_forward with K/V explicitly repeated to H heads (repeat_kv), then plain MHA sdpa."""
    return _gqa(locals(), expand_kv=True)


def _gqa(a, expand_kv):
    """The body of gqa_forward(_ref); `a` is the caller's arguments by name."""
    x, wq, wo, n_heads, n_kv_heads = a["x"], a["wq"], a["wo"], a["n_heads"], a["n_kv_heads"]
    qkv_args = {n: a[n] for n in ("wk", "wv", "bq", "bk", "bv", "q_norm", "k_norm",
                                  "positions", "inv_freq", "rope_style", "attention_factor",
                                  "norm_eps")}
    (q, k, v), qkv = project_qkv_forward(x, wq, n_heads=n_heads, n_kv_heads=n_kv_heads,
                                         **qkv_args)  # (B, H|Hkv, T, Dh)
    expect_shape("gqa", "wo", wo, (wq.shape[1], x.shape[2]), "(H*Dh, D)")
    rep, ka, va = None, k, v  # ka, va: what sdpa attends (B, H|Hkv, T, Dh)
    if expand_kv:
        ka, rep = repeat_kv_forward(k, n_heads // n_kv_heads)  # (B, H, T, Dh)
        va, _ = repeat_kv_forward(v, n_heads // n_kv_heads)  # (B, H, T, Dh)
    o, sd = _attend(q, ka, va, a["mask"], a["window"], a["attn"] or AttnOptions(),
                    a["scale"], a["sinks"])  # (B, H, T, Dh)
    y, lin_o = linear_forward(merge_heads(o), wo, a["bo"])  # (B, T, D)
    return y, GQACache(qkv, rep, sd, lin_o, k, v)


def gqa_backward(dy, cache):
    """Reverse of gqa_forward (or gqa_forward_ref) through the pairs: linear, sdpa, the
    KV-sharing backward (a sum over each group: inside sdpa, or repeat_kv_backward for the
    ref), rope (rotation by -theta), linear (the projections' pair is in qkv.py).
    Reference: Ainslie et al. 2023 (arXiv 2305.13245); huggingface/transformers
    src/transformers/models/llama/modeling_llama.py repeat_kv."""
    qkv, rep, sd, lin_o, _, _ = cache
    expect_dout("gqa_backward", dy, *linear_out(lin_o), name="dy")
    g_o = linear_backward(dy, lin_o)  # fwd: y = merge_heads(o) @ wo
    do = split_heads(g_o["x"], qkv.n_heads)  # (B, H, T, Dh)
    attend_backward = flash_sdpa_backward if isinstance(sd, FlashCache) else sdpa_backward
    g_sd = attend_backward(do, sd)  # fwd: o = sdpa(q, k, v) (or flash_sdpa)
    dk, dv = g_sd["k"], g_sd["v"]  # (B, Hkv, T, Dh), or (B, H, T, Dh) for the ref
    if rep is not None:
        dk = repeat_kv_backward(dk, rep)["kv"]  # fwd: k = repeat(k) -> sum over the group
        dv = repeat_kv_backward(dv, rep)["kv"]  # (B, Hkv, T, Dh)
    grads = project_qkv_backward(QKV(g_sd["q"], dk, dv), qkv)
    grads["wo"] = g_o["W"]
    if "sinks" in g_sd:
        grads["sinks"] = g_sd["sinks"]  # fwd: softmax([S, sinks]) (sdpa's sink column)
    if "b" in g_o:
        grads["bo"] = g_o["b"]  # fwd: y = merge_heads(o) @ wo + bo
    return grads


# ---------------------------------------------------------------------------- decoding
def gqa_decode(x_t, wq, wk, wv, wo, state, position, bq=None, bk=None, bv=None, bo=None,
               q_norm=None, k_norm=None, sinks=None, *, n_heads, n_kv_heads, inv_freq=None,
               rope_style="half", attention_factor=1.0, scale=None, norm_eps=1e-6, alibi=None):
    """One decoding step of gqa_forward for the token at `position`; appends to `state`.

    Inputs:  x_t (B, D); weights as gqa_forward; state a KVState or RollingKVState; position
             int (the token's absolute index, used by RoPE); alibi (H,) slopes or None.
    Returns: y_t (B, D), equal to the corresponding row of the full causal forward.
    """
    expect_integer("gqa_decode", "position", position, 0)
    if position != state.n_seen:
        raise ValueError(f"gqa_decode: position={position}, but the state holds {state.n_seen} "
                         f"tokens: the next token is at position {state.n_seen}")
    pos = None if inv_freq is None else np.array([position])  # (1,)
    (q, k, v), _ = project_qkv_forward(x_t[:, None], wq, wk, wv, bq, bk, bv, q_norm, k_norm,
                                       n_heads=n_heads, n_kv_heads=n_kv_heads, positions=pos,
                                       inv_freq=inv_freq, rope_style=rope_style,
                                       attention_factor=attention_factor,
                                       norm_eps=norm_eps)  # (B, H|Hkv, 1, Dh)
    state.append(k, v)
    K, V = state.kv()  # (B, Hkv, L, Dh); every cached key is at or before `position`
    bias = None
    if alibi is not None:  # -slope |position - j| over the kept keys' positions
        bias = -alibi[:, None, None] * np.abs(position - state.positions())  # (H, 1, L)
    o, _ = sdpa_forward(q, K, V, scale=scale, bias=bias, sinks=sinks)  # (B, H, 1, Dh)
    y, _ = linear_forward(merge_heads(o), wo, bo)  # (B, 1, D)
    return y[:, 0]  # (B, D)


# ---------------------------------------------------------------------------- module
def _expect_empty(fn, state):
    """Prefill starts a sequence: the state must not hold tokens yet."""
    held = getattr(state, "length", None) or getattr(state, "n_seen", 0)
    if held:
        raise ValueError(f"{fn}: the state already holds {held} tokens; prefill fills a "
                         f"fresh state from init_state")


class Attention(Module):
    """GQA self-attention layer owning wq, wk, wv, wo; calls gqa_forward / gqa_backward.

    RoPE frequencies come from rope_frequencies(head_dim, rope_base, rope_scaling), recomputed
    per call (cheap) so that "dynamic" scaling sees the current length. use_rope=False: none.
    A window (mask "sliding") with n_sink > 0 also keeps the first n_sink tokens (sinks).
    attn_impl "flash" attends with flash_sdpa (tiles of flash_block); alibi=True adds ALiBi's
    fixed biases (alibi_slopes(n_heads)); with use_rope=False and no ALiBi it is NoPE.
    Options: qkv_bias (bq, bk, bv), o_bias (bo), qk_norm (gains norm_offset + q_norm,
    norm_offset + k_norm over Dh, with eps norm_eps), scale (softmax scale; None = Dh^-1/2),
    sinks (a learned sink logit per head, gpt-oss: Param `sinks` (H,), zeros at init).
    """

    def __init__(self, d_model, n_heads, n_kv_heads, *, rng, head_dim=None, use_rope=True,
                 rope_base=10000.0, rope_scaling=None, rope_style="half", mask="causal",
                 window=None, n_sink=0, qkv_bias=False, o_bias=False, qk_norm=False,
                 norm_eps=1e-6, norm_offset=0.0, scale=None, dtype=np.float32, attn_impl="sdpa",
                 alibi=False, flash_block=128, sinks=False):
        if not use_rope and (rope_scaling is not None or rope_style != "half"):
            raise ValueError(f"Attention: rope_scaling={rope_scaling!r} and rope_style="
                             f"{rope_style!r} act only through RoPE, and use_rope=False")
        Dh = head_dim or d_model // n_heads
        self.wq = Param(normal_init(rng, (d_model, n_heads * Dh), d_model ** -0.5, dtype))
        self.wk = Param(normal_init(rng, (d_model, n_kv_heads * Dh), d_model ** -0.5, dtype))
        self.wv = Param(normal_init(rng, (d_model, n_kv_heads * Dh), d_model ** -0.5, dtype))
        self.wo = Param(normal_init(rng, (n_heads * Dh, d_model), (n_heads * Dh) ** -0.5, dtype))
        zeros = lambda n, on: Param(np.zeros(n, dtype)) if on else None  # noqa: E731
        self.bq, self.bk = zeros(n_heads * Dh, qkv_bias), zeros(n_kv_heads * Dh, qkv_bias)
        self.bv, self.bo = zeros(n_kv_heads * Dh, qkv_bias), zeros(d_model, o_bias)
        self.sinks = zeros(n_heads, sinks)  # (H,) or None
        self.q_norm = Param(np.full(Dh, 1.0 - norm_offset, dtype)) if qk_norm else None
        self.k_norm = Param(np.full(Dh, 1.0 - norm_offset, dtype)) if qk_norm else None
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, Dh
        self.use_rope, self.rope_base, self.rope_scaling = use_rope, rope_base, rope_scaling
        self.rope_style, self.mask, self.window, self.n_sink = rope_style, mask, window, n_sink
        self.attn_impl, self.flash_block = attn_impl, flash_block
        self.alibi = alibi_slopes(n_heads).astype(dtype) if alibi else None  # (H,)
        self.norm_eps, self.norm_offset, self.scale = norm_eps, norm_offset, scale

    def _rope_kwargs(self, seq_len):
        if not self.use_rope:
            return {}
        inv_freq, af = rope_frequencies(self.head_dim, self.rope_base, self.rope_scaling,
                                        seq_len)
        return {"inv_freq": inv_freq, "attention_factor": af, "rope_style": self.rope_style}

    def _weights(self):
        return self.wq.data, self.wk.data, self.wv.data, self.wo.data

    def _options(self):
        """The optional arrays (biases, QK-norm gains) and the scale, as keyword arguments."""
        opt = {n: getattr(self, n) for n in ("bq", "bk", "bv", "bo", "q_norm", "k_norm",
                                             "sinks")}
        out = {n: None if p is None else p.data for n, p in opt.items()}
        if self.q_norm is not None and self.norm_offset:  # the gains are offset + g (Gemma)
            out.update(q_norm=out["q_norm"] + self.norm_offset,
                       k_norm=out["k_norm"] + self.norm_offset)
        return dict(out, scale=self.scale, norm_eps=self.norm_eps)

    def forward(self, x, positions=None):
        T = x.shape[1]
        pos = np.arange(T) if positions is None and self.use_rope else positions
        seq_len = int(np.max(pos)) + 1 if pos is not None and np.size(pos) else T
        attn = AttnOptions(self.attn_impl, self.alibi, self.n_sink, self.flash_block)
        return gqa_forward(x, *self._weights(), n_heads=self.n_heads,
                           n_kv_heads=self.n_kv_heads, positions=pos, mask=self.mask,
                           window=self.window, attn=attn, **self._options(),
                           **self._rope_kwargs(seq_len))

    def backward(self, dy, cache):
        return self.add_grads(gqa_backward(dy, cache))

    def init_state(self, batch, max_len):
        """The decoding state: a KVState, or a RollingKVState(window, n_sink) for a window."""
        if self.mask not in ("causal", "sliding"):
            raise ValueError(f"Attention.init_state: decoding is causal, so mask={self.mask!r} "
                             f"cannot decode (its forward would differ)")
        dt = self.wq.data.dtype
        if self.window is None:
            return KVState(batch, self.n_kv_heads, self.head_dim, max_len, dt)
        return RollingKVState(self.window, self.n_sink, batch, self.n_kv_heads, self.head_dim,
                              dt)

    def prefill(self, x, state):
        """The whole prompt x (B, T, D) at positions 0..T-1 in one forward: returns y (B, T, D)
        and appends its (rotated) keys and values, which gqa_forward's cache names k and v, to
        the empty `state`, as T decode calls would."""
        _expect_empty("Attention.prefill", state)
        y, cache = self.forward(x)  # (B, T, D)
        state.append(cache.k, cache.v)  # (B, Hkv, T, Dh) each
        return y

    def decode(self, x_t, state, position):
        """One token (B, D) -> (B, D), appending its k, v to `state` (from init_state)."""
        return gqa_decode(x_t, *self._weights(), state, position, n_heads=self.n_heads,
                          n_kv_heads=self.n_kv_heads, alibi=self.alibi, **self._options(),
                          **self._rope_kwargs(position + 1))
