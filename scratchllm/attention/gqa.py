"""Grouped-query attention (GQA, Ainslie et al. 2023, arXiv 2305.13245): the training pair,
one-token decoding with a KV state, and the Attention Module. Covers multi-head (Hkv = H) and
multi-query (Hkv = 1) attention.

Math:
    q = rope(x Wq), k = rope(x Wk), v = x Wv;  query head h reads KV head h // G;
    y = concat_heads(sdpa(q, k, v)) Wo
Options the published checkpoints need: biases on the projections (x Wq + bq, ...: Qwen2,
GPT-2), QK-norm (q = rope(rmsnorm_Dh(x Wq) * gq), an RMSNorm over each head vector before
RoPE: Qwen3, Gemma 3; Dehghani et al. 2023, arXiv 2302.05442), no RoPE (GPT-2's learned
positions), a softmax scale other than Dh^-1/2 (Gemma 3's query_pre_attn_scalar^-1/2) and
soft-capped scores c tanh(S / c) (Gemma 2's attn_logit_softcapping) and an output gate
(concat_heads(o) ⊙ sigmoid(x Wg) before Wo: Qwen3-Next's gated attention, gate.py).
Backward: the linear, sdpa, rope (rotation by -theta) and KV-sharing (a sum over the G query
heads of each group) backwards, each through its own pair.
Decoding keeps the (already rotated) keys and values of past tokens in a KVState (or a
RollingKVState for a sliding window, kv_state.py): a new token computes only its own q, k, v.
A layer's arrays travel as one AttentionWeights (qkv.py), its options as an AttentionSpec
(scratchllm.specs), RoPE as a Rope (rope.py) and the mask as a Mask: the Module passes its
spec unchanged into the pair.

Glossary: B batch, T time, D model width, H query heads, Hkv KV heads, G = H / Hkv,
Dh head dim, W window, S sink tokens.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.flash import flash_sdpa_backward, flash_sdpa_forward
from scratchllm.attention.gate import output_gate_backward, output_gate_forward
from scratchllm.attention.kv_state import KVState, RollingKVState, begin_step, rows_mask
from scratchllm.attention.positions import (alibi_bias, alibi_slopes, relative_bias_backward,
                                           relative_bias_forward, relative_offset_buckets)
from scratchllm.attention.qkv import (AttentionWeights, QKV, QKVCache, project_qkv_backward,
                                      project_qkv_forward)
from scratchllm.attention.rope import make_rope, row_rope
from scratchllm.attention.sdpa import (merge_heads, repeat_kv_backward, repeat_kv_forward,
                                       sdpa_backward, sdpa_forward, split_heads)
from scratchllm.core.nn import Module, Param, normal_init
from scratchllm.core.ops import linear_backward, linear_forward, linear_out
from scratchllm.core.validate import common_float, expect_dout, expect_ndim, expect_shape
from scratchllm.specs import Mask


class GQACache(NamedTuple):
    qkv: QKVCache
    rep: tuple  # RepeatKVCache in gqa_forward_ref; None when sdpa shares the heads itself
    attend: tuple  # the SDPACache, or a FlashCache (spec.impl "flash")
    attend_backward: object  # sdpa_backward or flash_sdpa_backward: the kernel's backward
    lin_o: tuple
    k: np.ndarray  # (B, Hkv, T, Dh) the rotated keys and values attended: what a KV state
    v: np.ndarray  # (B, Hkv, T, Dh) holds after these tokens (Attention.prefill)
    rel: tuple = None  # the relative bias's cache (spec.relative), else None
    q_scale: np.ndarray = None  # (1|B, 1, T, 1) Llama 4's query temperature, else None
    gate: tuple = None  # the output gate's GateCache (spec.output_gate), else None


def query_temperature(spec, positions, dtype):
    """1 + attn_scale log(1 + floor((p + 1) / floor_scale)) at positions ((T,) or (B, T)
    ints), shaped (1|B, 1, T, 1) to scale q (B, H, T, Dh); None without spec.temperature.
    Reference: huggingface/transformers src/transformers/models/llama4/modeling_llama4.py
    Llama4TextAttention (attn_temperature_tuning)."""
    t = spec.temperature
    if t is None:
        return None
    p = np.asarray(positions).reshape(-1, 1, np.shape(positions)[-1], 1)  # (1|B, 1, T, 1)
    return (np.log1p(np.floor((p + 1.0) / t.floor_scale)) * t.attn_scale + 1.0).astype(dtype)


def _attend(q, k, v, spec, mask, w):
    """o = attention of (q, k, v) under `mask` (a Mask, or None: everywhere) with the spec's
    scale, ALiBi or T5's relative bias (w.rel_table) and the sink logits (w.sinks), by the
    spec's kernel: (o (B, H, T, Dh), cache, the kernel's backward, the relative bias's
    cache or None)."""
    H, T, sinks = q.shape[1], q.shape[2], w.sinks
    slopes = alibi_slopes(H).astype(q.dtype) if spec.alibi else None  # (H,)
    if spec.impl == "flash":
        o, cache = flash_sdpa_forward(q, k, v, mask=mask, scale=spec.scale, alibi_slopes=slopes,
                                      sinks=sinks, block=spec.block)
        return o, cache, flash_sdpa_backward, None
    bias, rel = None if slopes is None else alibi_bias(slopes, T, T), None  # (H, T, T)
    if spec.relative is not None:  # S += R[bucket(j - i)]: (1, H, T, T)
        bias, rel = relative_bias_forward(w.rel_table, spec=spec.relative, Tq=T, Tk=T)
    o, cache = sdpa_forward(q, k, v, mask, spec.scale, bias=bias, sinks=sinks,
                            softcap=spec.softcap)
    return o, cache, sdpa_backward, rel


def gqa_forward(x, w, *, spec, rope=None, mask=None, positions=None):
    """Grouped-query self-attention: y = concat_h sdpa(q_h, k_{h//G}, v_{h//G}) @ wo (+ bo).

    Inputs:  x (B, T, D); w an AttentionWeights: wq (D, H*Dh), wk, wv (D, Hkv*Dh),
             wo (H*Dh, D), and the arrays of the spec's options (biases bq, bk, bv, bo;
             QK-norm gains q_norm, k_norm (Dh,); sinks (H,) gpt-oss's sink logits);
             spec an AttentionSpec (heads, head dim, options, scale, ALiBi, kernel "sdpa"
             or "flash", its mask); rope a Rope (rope.py; make_rope) or None: spec.rope
             at positions 0..T-1; mask a Mask, or None: spec.mask (Mask(causal=False)
             attends everywhere); positions (T,) or (B, T) ints, default 0..T-1: where
             spec.temperature (Llama 4's NoPE layers) scales each query by
             query_temperature (its backward: dq times the same scale); with
             spec.output_gate, w.wg (D, H*Dh) (and bg with qkv_bias) gates the merged heads:
             y = (concat_h o_h ⊙ sigmoid(x wg + bg)) @ wo (+ bo) (gate.py's pair).
    Returns: y (B, T, D).  Cache: GQACache (qkv, attention and output-linear caches).
    Fast path: sdpa attends the G query heads of a group to their KV head directly.
    gqa_forward_ref is its twin that copies each KV head G times first (HF repeat_kv).
    """
    return _gqa(x, w, spec, rope, mask, False, positions)


def gqa_forward_ref(x, w, *, spec, rope=None, mask=None, positions=None):
    """gqa_forward with K/V explicitly repeated to H heads (repeat_kv), then plain MHA sdpa."""
    return _gqa(x, w, spec, rope, mask, True, positions)


def _gqa(x, w, spec, rope, mask, expand_kv, positions=None):
    """The body of gqa_forward (expand_kv False) and gqa_forward_ref (True); positions: the
    tokens' positions for a query temperature (default 0..T-1)."""
    x, w = common_float(x, w)
    (q, k, v), qkv = project_qkv_forward(x, w, spec=spec, rope=rope,
                                         caller="gqa")  # (B, H|Hkv, T, Dh)
    expect_shape("gqa", "wo", w.wo, (w.wq.shape[1], x.shape[2]), "(H*Dh, D)")
    q_scale = query_temperature(spec, np.arange(x.shape[1]) if positions is None else
                                positions, q.dtype)  # (1|B, 1, T, 1) or None
    q = q if q_scale is None else q * q_scale  # Llama 4's NoPE layers: q s(p)
    mask = spec.mask if mask is None else mask
    rep, ka, va = None, k, v  # ka, va: what the kernel attends (B, H|Hkv, T, Dh)
    if expand_kv:
        ka, rep = repeat_kv_forward(k, spec.n_heads // spec.n_kv_heads)  # (B, H, T, Dh)
        va, _ = repeat_kv_forward(v, spec.n_heads // spec.n_kv_heads)  # (B, H, T, Dh)
    o, att, att_backward, rel = _attend(q, ka, va, spec, mask, w)  # (B, H, T, Dh)
    o, gate = merge_heads(o), None  # (B, T, H*Dh)
    if spec.output_gate:  # Qwen3-Next: o sigmoid(x wg + bg)
        o, gate = output_gate_forward(x, o, w.wg, w.bg)  # (B, T, H*Dh)
    y, lin_o = linear_forward(o, w.wo, w.bo)  # (B, T, D)
    return y, GQACache(qkv, rep, att, att_backward, lin_o, k, v, rel, q_scale, gate)


def gqa_backward(dy, cache):
    """Reverse of gqa_forward (or gqa_forward_ref) through the pairs: linear, sdpa (or flash),
    the output gate's pair (spec.output_gate), the KV-sharing backward (a sum over each group:
    inside sdpa, or repeat_kv_backward for the ref), rope (rotation by -theta), linear (the
    projections' pair is in qkv.py); the gate's dx adds to the projections'.
    Returns {"x": dx, "w": AttentionWeights of gradients (None where w had None)}.
    Reference: Ainslie et al. 2023 (arXiv 2305.13245); huggingface/transformers
    src/transformers/models/llama/modeling_llama.py repeat_kv."""
    qkv, rep, att, att_backward, lin_o, _, _, rel, q_scale, gate = cache
    expect_dout("gqa_backward", dy, *linear_out(lin_o), name="dy")
    g_o = linear_backward(dy, lin_o)  # fwd: y = merge_heads(o) @ wo + bo (o gated)
    g_gate = None if gate is None else output_gate_backward(g_o["x"], gate)  # fwd: o sigma(.)
    do = split_heads(g_o["x"] if gate is None else g_gate["o"], qkv.n_heads)  # (B, H, T, Dh)
    g_att = att_backward(do, att)  # fwd: o = sdpa(q, k, v) (or flash_sdpa)
    dk, dv = g_att["k"], g_att["v"]  # (B, Hkv, T, Dh), or (B, H, T, Dh) for the ref
    if rep is not None:
        dk = repeat_kv_backward(dk, rep)["kv"]  # fwd: k = repeat(k) -> sum over the group
        dv = repeat_kv_backward(dv, rep)["kv"]  # (B, Hkv, T, Dh)
    dq = g_att["q"] if q_scale is None else g_att["q"] * q_scale  # fwd: q = q s(p)
    g = project_qkv_backward(QKV(dq, dk, dv), qkv)  # fwd: q, k, v = project_qkv(x)
    # the output linear's wo, bo and the sink logits (fwd: softmax([S, sinks]) in sdpa)
    dw = g["w"]._replace(wo=g_o["W"], bo=g_o.get("b"), sinks=g_att.get("sinks"))
    if rel is not None:  # fwd: bias = R[bucket] (T5), added to the scores in sdpa
        dw = dw._replace(rel_table=relative_bias_backward(g_att["bias"], rel)["table"])
    if g_gate is not None:  # fwd: gate = sigmoid(x wg + bg): its dx adds to the projections'
        dw = dw._replace(wg=g_gate["wg"], bg=g_gate.get("bg"))
        return {"x": g["x"] + g_gate["x"], "w": dw}
    return {"x": g["x"], "w": dw}


# ---------------------------------------------------------------------------- decoding
def gqa_decode(x_t, w, state, position, *, spec, rope=None):
    """One decoding step of gqa_forward for the token at `position`; appends to `state`.

    Inputs:  x_t (B, D); w, spec as gqa_forward; state a KVState, or a RollingKVState for a
             sliding window (spec.mask's window and n_sink); position the token's absolute
             index: an int, or (B,) ints, one per row (a KVState's rows then hold sequences
             of different lengths, kv_state.begin_step); rope a Rope at those positions, or
             None: spec.rope there.
    Returns: y_t (B, D), equal to the corresponding row of the full causal forward.
    A chunked mask (spec.mask.chunk C) attends the state's keys at positions from
    C floor(position / C) on (the state keeps every token; the others are masked).
    The state holds exactly the keys the token may attend; rows of different lengths mask
    each shorter row's stale slots (state.key_mask(); a state without one keeps its rows in
    step: n_seen, append, kv and positions are the whole protocol). A state with an
    `attend(q, scale, softcap, sinks)` method (a quantised serving cache that reads its codes
    in a kernel, serve/views.py) attends itself when the mask is plain causal, no bias.
    """
    expect_ndim("gqa_decode", "x_t", x_t, 2, "(B, D)")
    position = begin_step("gqa_decode", state, position)  # int, or (B,) int64
    if spec.rope is not None and rope is None:
        rope = row_rope("gqa_decode", spec.rope, spec.dh(x_t.shape[-1]), position)
    (q, k, v), _ = project_qkv_forward(x_t[:, None], w, spec=spec, rope=rope,
                                       caller="gqa_decode")  # (B, H|Hkv, 1, Dh)
    if spec.temperature is not None:  # Llama 4's query temperature at the token's position
        q = q * query_temperature(spec, np.reshape(position, (-1, 1)), q.dtype)
    state.append(k, v)
    if getattr(state, "attend", None) is not None and spec.mask.chunk is None \
            and not spec.alibi and spec.relative is None:  # a serving cache's own kernel
        scale = q.shape[-1] ** -0.5 if spec.scale is None else spec.scale
        o = state.attend(q, scale, spec.softcap, w.sinks)  # (B, H, 1, Dh)
    else:
        o = _attend_state(q, state, position, w, spec)  # (B, H, 1, Dh)
    o = merge_heads(o)  # (B, 1, H*Dh)
    if spec.output_gate:  # o sigmoid(x_t wg + bg)
        o = output_gate_forward(x_t[:, None], o, w.wg, w.bg)[0]
    y, _ = linear_forward(o, w.wo, w.bo)  # (B, 1, D)
    return y[:, 0]  # (B, D)


def _attend_state(q, state, position, w, spec):
    """gqa_decode's attention of q (B, H, 1, Dh) over the state's keys (masks and biases as
    the spec says) -> o (B, H, 1, Dh)."""
    K, V = state.kv()  # (B, Hkv, L, Dh); every cached key is at or before `position`
    bias, keep = None, rows_mask(state)  # keep None, or (B, 1, 1, L)
    if spec.mask.chunk is not None:  # only the keys of the token's own chunk
        start = np.reshape(position, (-1, 1, 1, 1)) // spec.mask.chunk * spec.mask.chunk
        in_chunk = state.positions() >= start  # (B|1, 1, 1, L)
        keep = in_chunk if keep is None else keep & in_chunk
    if spec.alibi:  # -slope |position - j| over the kept keys' positions
        slopes = alibi_slopes(spec.n_heads).astype(q.dtype)  # (H,)
        dist = np.abs(np.reshape(position, (-1, 1, 1, 1)) - state.positions())  # (B|1,1,1,L)
        bias = -slopes[:, None, None] * dist  # (B|1, H, 1, L)
    if spec.relative is not None:  # R[bucket(key position - position)] over the kept keys
        n = state.positions() - np.reshape(position, (-1, 1, 1, 1))  # (B|1, 1, 1, L)
        buckets = relative_offset_buckets(n[:, 0, 0], spec=spec.relative)  # (B|1, L)
        bias = w.rel_table[buckets].transpose(0, 2, 1)[:, :, None, :]  # (B|1, H, 1, L)
    o, _ = sdpa_forward(q, K, V, None if keep is None else Mask(array=keep), spec.scale,
                        bias=bias, sinks=w.sinks, softcap=spec.softcap)  # (B, H, 1, Dh)
    return o


# ---------------------------------------------------------------------------- module
def _expect_empty(fn, state):
    """Prefill starts a sequence: the state must not hold tokens yet."""
    held = getattr(state, "length", None) or getattr(state, "n_seen", 0)
    if held:
        raise ValueError(f"{fn}: the state already holds {held} tokens; prefill fills a "
                         f"fresh state from init_state")


class Attention(Module):
    """GQA self-attention layer owning wq, wk, wv, wo (and, as the AttentionSpec says, bq,
    bk, bv, bo, q_norm, k_norm, sinks, the output gate's wg and bg); calls gqa_forward /
    gqa_backward / gqa_decode with its spec unchanged.

    RoPE (spec.rope) is made per call by make_rope (cheap), so that "dynamic" scaling sees
    the current length. QK-norm gains start at 1 - spec.norm_offset (gain = offset + g is 1);
    sink logits at zero; matrices ~ N(0, 1/d_in).
    """

    def __init__(self, d_model, spec, *, rng, dtype=np.float32):
        H, Hkv, Dh = spec.n_heads, spec.n_kv_heads, spec.dh(d_model)
        self.wq = Param(normal_init(rng, (d_model, H * Dh), d_model ** -0.5, dtype))
        self.wk = Param(normal_init(rng, (d_model, Hkv * Dh), d_model ** -0.5, dtype))
        self.wv = Param(normal_init(rng, (d_model, Hkv * Dh), d_model ** -0.5, dtype))
        self.wo = Param(normal_init(rng, (H * Dh, d_model), (H * Dh) ** -0.5, dtype))
        zeros = lambda n, on: Param(np.zeros(n, dtype)) if on else None  # noqa: E731
        self.bq, self.bk = zeros(H * Dh, spec.qkv_bias), zeros(Hkv * Dh, spec.qkv_bias)
        self.bv, self.bo = zeros(Hkv * Dh, spec.qkv_bias), zeros(d_model, spec.o_bias)
        self.sinks = zeros(H, spec.sinks)  # (H,) or None
        self.wg = Param(normal_init(rng, (d_model, H * Dh), d_model ** -0.5, dtype)) \
            if spec.output_gate else None  # (D, H*Dh): the output gate
        self.bg = zeros(H * Dh, spec.output_gate and spec.qkv_bias)
        relative = spec.relative  # T5's bias table (num_buckets, H), from zero
        self.rel_table = None if relative is None else Param(
            np.zeros((relative.num_buckets, H), dtype))
        gain = 1.0 - spec.norm_offset
        nq, nk = (H * Dh, Hkv * Dh) if spec.qk_norm == "full" else (Dh, Dh)
        gains = spec.qk_norm not in (False, "l2")  # "l2" normalises without gains
        self.q_norm = Param(np.full(nq, gain, dtype)) if gains else None
        self.k_norm = Param(np.full(nk, gain, dtype)) if gains else None
        self.spec, self.head_dim = spec, Dh

    def _weights(self):
        """The Params' arrays as the pair's AttentionWeights (None for an option that is off)."""
        params = (getattr(self, name) for name in AttentionWeights._fields)
        return AttentionWeights(*(None if p is None else p.data for p in params))

    def forward(self, x, positions=None, mask=None):
        """x (B, T, D) at `positions` ((T,) or (B, T) ints; default 0..T-1) under `mask` (a
        Mask; default spec.mask) -> (y, cache)."""
        rope = None
        if positions is not None and self.spec.rope is None and self.spec.temperature is None:
            raise ValueError("Attention.forward: positions act only through RoPE (or a query "
                             "temperature), and spec has neither")
        if positions is not None and self.spec.rope is not None:
            rope = make_rope(self.spec.rope, self.head_dim, positions)
        return gqa_forward(x, self._weights(), spec=self.spec, rope=rope, mask=mask,
                           positions=positions)

    def backward(self, dy, cache):
        g = gqa_backward(dy, cache)
        return self.add_grads(dict(g["w"]._asdict(), x=g["x"]))

    def init_state(self, batch, max_len):
        """The decoding state: a KVState (also for chunks: gqa_decode masks the keys of
        earlier chunks), or a RollingKVState(window, n_sink) for a window."""
        mask = self.spec.mask
        if not mask.causal or mask.block is not None or mask.array is not None:
            raise ValueError(f"Attention.init_state: decoding keeps the keys of a causal mask, "
                             f"with a window and sinks or chunks at most, so "
                             f"spec.mask={mask!r} cannot decode (its forward would differ)")
        dt = self.wq.data.dtype
        if mask.window is None:
            return KVState(batch, self.spec.n_kv_heads, self.head_dim, max_len, dt)
        return RollingKVState(mask.window, mask.n_sink, batch, self.spec.n_kv_heads,
                              self.head_dim, dt)

    def prefill(self, x, state, positions=None, mask=None):
        """The whole prompt x (B, T, D) at positions 0..T-1 (or forward's `positions`, under
        forward's `mask`) in one forward: returns y (B, T, D) and appends its (rotated) keys
        and values, which gqa_forward's cache names k and v, to the empty `state`, as T
        decode calls would."""
        _expect_empty("Attention.prefill", state)
        y, cache = self.forward(x, positions, mask)  # (B, T, D)
        state.append(cache.k, cache.v)  # (B, Hkv, T, Dh) each
        return y

    def decode(self, x_t, state, position, rope=None):
        """One token (B, D) -> (B, D), appending its k, v to `state` (from init_state); rope:
        gqa_decode's (a Rope at other positions than the state's: M-RoPE's)."""
        return gqa_decode(x_t, self._weights(), state, position, spec=self.spec, rope=rope)
