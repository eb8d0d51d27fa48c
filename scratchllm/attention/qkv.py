"""The shared projections of GQA (Ainslie et al. 2023, arXiv 2305.13245) as one pair: q, k, v
heads of x, with optional biases (Qwen2), QK-norm over each head (Qwen3: Dehghani et al. 2023,
arXiv 2302.05442) or over the whole projection (OLMo 2: spec.qk_norm "full") and RoPE on q
and k. gqa.py attends with them; decoding projects one token.
A layer's arrays travel as one AttentionWeights, its options as the AttentionSpec
(scratchllm.specs) that says which of the optional arrays it has.

    q = rope(qk_norm(split_heads(x Wq + bq))),  k likewise with Wk, bk,  v = split_heads(x Wv + bv)

Glossary: B batch, T time, D model width, H query heads, Hkv KV heads, Dh head dim.
"""
from typing import NamedTuple

import numpy as np

from scratchllm.attention.rope import make_rope, rope_backward, rope_forward
from scratchllm.attention.rope_heads import ROPE_HEADS
from scratchllm.attention.sdpa import merge_heads, split_heads
from scratchllm.core.ops import (linear_backward, linear_forward, linear_out, rmsnorm_backward,
                                 rmsnorm_forward)
from scratchllm.core.validate import expect_douts, expect_float, expect_ndim, expect_shape
from scratchllm.specs import AttentionSpec


class AttentionWeights(NamedTuple):
    """One GQA layer's arrays, named as the Attention Module's Params; None = option off."""
    wq: np.ndarray  # (D, H*Dh)
    wk: np.ndarray  # (D, Hkv*Dh)
    wv: np.ndarray  # (D, Hkv*Dh)
    wo: np.ndarray  # (H*Dh, D)
    bq: np.ndarray = None  # (H*Dh,)    spec.qkv_bias
    bk: np.ndarray = None  # (Hkv*Dh,)
    bv: np.ndarray = None  # (Hkv*Dh,)
    bo: np.ndarray = None  # (D,)       spec.o_bias
    q_norm: np.ndarray = None  # (Dh,)  spec.qk_norm: gains spec.norm_offset + q_norm
    k_norm: np.ndarray = None  # (Dh,)  ("full": q_norm (H*Dh,), k_norm (Hkv*Dh,))
    sinks: np.ndarray = None  # (H,)    spec.sinks: one sink logit per query head
    rel_table: np.ndarray = None  # (num_buckets, H)  spec.relative: T5's bias table
    wg: np.ndarray = None  # (D, H*Dh)  spec.output_gate: the gate's projection (gate.py)
    bg: np.ndarray = None  # (H*Dh,)    spec.output_gate with spec.qkv_bias


_OPTIONS = (("qkv_bias", ("bq", "bk", "bv")), ("o_bias", ("bo",)),
            ("qk_norm", ("q_norm", "k_norm")), ("sinks", ("sinks",)),
            ("relative", ("rel_table",)), ("output_gate", ("wg",)))


def check_attention_weights(fn, w, spec):
    """w is an AttentionWeights whose optional fields are given exactly where the
    AttentionSpec spec turns their option on."""
    if not isinstance(spec, AttentionSpec):
        raise TypeError(f"{fn}: spec must be an AttentionSpec, got {type(spec).__name__}")
    if not isinstance(w, AttentionWeights):
        raise TypeError(f"{fn}: w must be an AttentionWeights, got {type(w).__name__}")
    for name, a in zip(w._fields, w):
        if a is not None:
            expect_float(fn, name, a)
    for option, names in _OPTIONS:
        for name in names:
            on = getattr(spec, option) not in (None, False, "l2")  # qk_norm True or "full"
            if (getattr(w, name) is not None) != on:
                raise ValueError(f"{fn}: spec.{option}={on}, but w.{name} is "
                                 f"{'None' if on else 'given'}")
    if (w.bg is not None) != (spec.output_gate and spec.qkv_bias):
        raise ValueError(f"{fn}: w.bg (the output gate's bias) goes with spec.output_gate and "
                         f"spec.qkv_bias (here {spec.output_gate} and {spec.qkv_bias}), but it "
                         f"is {'given' if w.bg is not None else 'None'}")


def _check_qkv_inputs(fn, x, w, spec, rope):
    """What project_qkv_forward reads, checked under the caller's name `fn` (project_qkv,
    gqa, gqa_decode ...): x (B, T >= 1, D) float; w an AttentionWeights with the spec's
    options and wq (D, H*Dh), wk, wv (D, Hkv*Dh), QK-norm gains (Dh,) or, for "full",
    (H*Dh,), (Hkv*Dh,); the relative-bias table (num_buckets, H); rope only with spec.rope."""
    expect_float(fn, "x", x)
    expect_ndim(fn, "x", x, 3, "(B, T, D)")
    B, T, D = x.shape
    if T < 1:
        raise ValueError(f"{fn}: x has shape {x.shape}: no time steps (T must be >= 1)")
    check_attention_weights(fn, w, spec)
    H, Hkv, Dh = spec.n_heads, spec.n_kv_heads, spec.dh(D)
    expect_shape(fn, "wq", w.wq, (D, H * Dh), f"(D, H*Dh) = (D, {H}*{Dh})")
    expect_shape(fn, "wk", w.wk, (D, Hkv * Dh), f"(D, Hkv*Dh) = (D, {Hkv}*{Dh})")
    expect_shape(fn, "wv", w.wv, (D, Hkv * Dh), f"(D, Hkv*Dh) = (D, {Hkv}*{Dh})")
    if spec.qk_norm and spec.qk_norm != "l2":  # "l2" has no gains
        full = spec.qk_norm == "full"
        expect_shape(fn, "q_norm", w.q_norm, ((H if full else 1) * Dh,),
                     "(H*Dh,)" if full else "(Dh,)")
        expect_shape(fn, "k_norm", w.k_norm, ((Hkv if full else 1) * Dh,),
                     "(Hkv*Dh,)" if full else "(Dh,)")
    for name, width in (("bq", H * Dh), ("bk", Hkv * Dh), ("bv", Hkv * Dh)):
        if getattr(w, name) is not None:
            expect_shape(fn, name, getattr(w, name), (width,), f"({width},)")
    if spec.output_gate:
        expect_shape(fn, "wg", w.wg, (D, H * Dh), f"(D, H*Dh) = (D, {H}*{Dh})")
        if w.bg is not None:
            expect_shape(fn, "bg", w.bg, (H * Dh,), f"({H * Dh},)")
    if spec.relative is not None:
        expect_shape(fn, "rel_table", w.rel_table, (spec.relative.num_buckets, H),
                     "(num_buckets, H)")
    if spec.rope is None and rope is not None:
        raise ValueError(f"{fn}: rope is given, but spec.rope is None (no RoPE); drop rope or "
                         f"give the spec a RopeSpec")


# ---------------------------------------------------------------------------- projections
class QKV(NamedTuple):
    """The output of project_qkv_forward (and the shape of its backward's dout)."""
    q: np.ndarray  # (B, H, T, Dh)
    k: np.ndarray  # (B, Hkv, T, Dh)
    v: np.ndarray  # (B, Hkv, T, Dh)


class QKVCache(NamedTuple):
    lin_q: tuple
    lin_k: tuple
    lin_v: tuple
    rope_q: tuple  # None without RoPE
    rope_k: tuple
    n_heads: int
    n_kv_heads: int
    norm_q: tuple  # RMSNormCache of the QK-norm, None without it
    norm_k: tuple
    rope_heads: bool  # RoPE went with the head split (ROPE_HEADS; rope_q, rope_k its caches)
    norm_full: bool = False  # the QK-norm went over the whole projection, before the split
    norm_gains: bool = True  # the QK-norm had gains (False: qk_norm "l2", no Params)


def project_qkv_forward(x, w, *, spec, rope=None, caller="project_qkv"):
    """q, k, v heads of x, with QK-norm (spec.qk_norm) and then RoPE on q and k.
    spec.qk_norm "full" (OLMo 2) normalises q = x Wq (+ bq) over all H*Dh numbers of a token
    (gains q_norm (H*Dh,), k_norm (Hkv*Dh,)) before the head split.

    Inputs:  x (B, T, D); w an AttentionWeights (wq (D, H*Dh), wk/wv (D, Hkv*Dh), and as
             the spec says bq (H*Dh,), bk/bv (Hkv*Dh,), q_norm/k_norm (Dh,) RMSNorm gains
             over each head vector, used as spec.norm_offset + gain, eps spec.norm_eps);
             spec an AttentionSpec (heads, head dim, options); rope a Rope (rope.py), or
             None: spec.rope at positions 0..T-1 (no RoPE when spec.rope is None).
    Returns: QKV(q (B, H, T, Dh), k (B, Hkv, T, Dh), v (B, Hkv, T, Dh)).  Cache: QKVCache.
    Its backward's w has gradients for the fields used here, None for wo, bo and sinks.
    RoPE without QK-norm at positions (T,) goes with the head split in one pass
    (rope_heads.py: the same bits as split_heads then rope). caller: the name its input
    checks give (gqa and gqa_decode pass theirs, so the inputs are checked once, by name).
    """
    _check_qkv_inputs(caller, x, w, spec, rope)
    B, T, D = x.shape
    H, Hkv, Dh = spec.n_heads, spec.n_kv_heads, spec.dh(D)
    if spec.rope is not None and rope is None:
        rope = make_rope(spec.rope, Dh, np.arange(T))
    q, lin_q = linear_forward(x, w.wq, w.bq)  # (B, T, H*Dh)
    k, lin_k = linear_forward(x, w.wk, w.bk)  # (B, T, Hkv*Dh)
    v, lin_v = linear_forward(x, w.wv, w.bv)  # (B, T, Hkv*Dh)
    if rope is not None and not spec.qk_norm and np.ndim(rope.positions) == 1 and (
            rope.rotary is None):  # the fused split + RoPE turns whole heads
        q, rope_q = ROPE_HEADS.forward(q, rope, H)  # (B, H, T, Dh)
        k, rope_k = ROPE_HEADS.forward(k, rope, Hkv)  # (B, Hkv, T, Dh)
        return QKV(q, k, split_heads(v, Hkv)), QKVCache(
            lin_q, lin_k, lin_v, rope_q, rope_k, H, Hkv, None, None, True)
    full = spec.qk_norm == "full"
    norm_q = norm_k = None
    if spec.qk_norm == "l2":  # no gains: gain 1 (Llama 4)
        gq = gk = np.ones(Dh, q.dtype)  # (Dh,)
    elif spec.qk_norm:
        off = spec.norm_offset
        gq, gk = (w.q_norm + off, w.k_norm + off) if off else (w.q_norm, w.k_norm)  # (Dh,)
    if full:  # OLMo 2: over the whole projection, then the heads
        q, norm_q = rmsnorm_forward(q, gq, spec.norm_eps)  # (B, T, H*Dh)
        k, norm_k = rmsnorm_forward(k, gk, spec.norm_eps)  # (B, T, Hkv*Dh)
    q, k, v = split_heads(q, H), split_heads(k, Hkv), split_heads(v, Hkv)
    if spec.qk_norm and not full:
        q, norm_q = rmsnorm_forward(q, gq, spec.norm_eps)  # (B, H, T, Dh)
        k, norm_k = rmsnorm_forward(k, gk, spec.norm_eps)  # (B, Hkv, T, Dh)
    rope_q = rope_k = None
    if rope is not None:  # after QK-norm ("l2": Llama 4 normalises after RoPE; the same)
        q, rope_q = rope_forward(q, rope)  # (B, H, T, Dh)
        k, rope_k = rope_forward(k, rope)  # (B, Hkv, T, Dh)
    return QKV(q, k, v), QKVCache(lin_q, lin_k, lin_v, rope_q, rope_k, H, Hkv, norm_q, norm_k,
                                  False, full, spec.qk_norm != "l2")


def project_qkv_backward(dout, cache):
    """Reverse of project_qkv_forward: rope backward, QK-norm backward, merge heads, the three
    linear backwards. dout is a QKV of gradients (B, H, T, Dh), (B, Hkv, T, Dh), (B, Hkv, T, Dh).
    Returns {"x": dx, "w": AttentionWeights of gradients, None for wo, bo, sinks and for the
    options that were off}.
    Math: each step is its own pair (rope: rotation by -theta; QK-norm: rmsnorm_backward over
    the head axis Dh, its gain summing over B, heads and T; linear: dW = x^T dy, db = sum dy).
    Reference: Dehghani et al. 2023 (arXiv 2302.05442); huggingface/transformers
    src/transformers/models/qwen3/modeling_qwen3.py Qwen3Attention."""
    lin_q, lin_k, lin_v, rope_q, rope_k, H, Hkv, norm_q, norm_k, rope_heads, full, gains = cache
    expect_douts("project_qkv_backward", dout, {
        "q": _heads_out(lin_q, H), "k": _heads_out(lin_k, Hkv), "v": _heads_out(lin_v, Hkv)})
    dq, dk, dv = (np.zeros(*_heads_out(c, n)) if d is None else d
                  for d, c, n in zip(dout, (lin_q, lin_k, lin_v), (H, Hkv, Hkv)))
    if rope_heads:  # fwd: q = rope_heads(x wq): RoPE and the head split in one
        dq = split_heads(ROPE_HEADS.backward(dq, rope_q)["t"], H)  # (B, H, T, Dh) view
        dk = split_heads(ROPE_HEADS.backward(dk, rope_k)["t"], Hkv)  # (B, Hkv, T, Dh) view
    elif rope_q is not None:
        dq = rope_backward(dq, rope_q)["x"]  # fwd: q = rope(q) -> rotate dq by -theta
        dk = rope_backward(dk, rope_k)["x"]  # fwd: k = rope(k)
    dq_norm = dk_norm = None
    if norm_q is not None and not full:
        g_nq = rmsnorm_backward(dq, norm_q)  # fwd: q = rmsnorm(q) * (offset + q_norm)
        g_nk = rmsnorm_backward(dk, norm_k)  # fwd: k = rmsnorm(k) * (offset + k_norm)
        dq, dk, dq_norm, dk_norm = g_nq["x"], g_nk["x"], g_nq["g"], g_nk["g"]
    dq, dk = merge_heads(dq), merge_heads(dk)  # fwd: q = split_heads(q) (B, T, H*Dh)
    if full:  # fwd: q = rmsnorm_{H*Dh}(x @ wq + bq) * (offset + q_norm), before the split
        g_nq, g_nk = rmsnorm_backward(dq, norm_q), rmsnorm_backward(dk, norm_k)
        dq, dk, dq_norm, dk_norm = g_nq["x"], g_nk["x"], g_nq["g"], g_nk["g"]
    g_q = linear_backward(dq, lin_q)  # fwd: q = x @ wq + bq
    g_k = linear_backward(dk, lin_k)  # fwd: k = x @ wk + bk
    g_v = linear_backward(merge_heads(dv), lin_v)  # fwd: v = split_heads(x @ wv + bv)
    if not gains:  # qk_norm "l2": the gains were constant ones
        dq_norm = dk_norm = None
    dw = AttentionWeights(g_q["W"], g_k["W"], g_v["W"], None, g_q.get("b"), g_k.get("b"),
                          g_v.get("b"), None, dq_norm, dk_norm)
    return {"x": g_q["x"] + g_k["x"] + g_v["x"], "w": dw}


def _heads_out(lin, n_heads):
    """(shape, dtype) of split_heads(linear output, n_heads): (B, n, T, Dh)."""
    (B, T, HD), dtype = linear_out(lin)
    return (B, n_heads, T, HD // n_heads), dtype
