"""A lean decoding step for the plain pre-norm decoder (Llama, SmolLM, Mistral without a
window, Qwen2): LM.decode's layers, the same math as the general path (Block.body around
gqa_decode and the FFN's forward), with the per-op checks and caches left out.

Batch-1 decoding reads every weight once per token, so it is bound by memory and by the
Python work around each small product: the general path makes ~600 calls per layer (input
checks on every op, a Rope and its angles per layer, caches that decoding drops). Here each
layer is ~25 NumPy calls, the inputs are checked once per step (LM.decode), and RoPE's
cos/sin are made once per step for all layers. Per layer, for x (B, D) at position p:

    a = x / rms(x) * g1                               (RMSNorm; rms in float64 as the fused twin)
    q, k, v = a Wq (+ bq), a Wk (+ bk), a Wv (+ bv)   heads (B, H|Hkv, Dh)
    q, k = q C + q[perm] S                            RoPE at p: C, S the (af-scaled) cos and
                                                      +-sin per number, perm its pair partner
    K, V = the state's keys and values with k, v appended at p    (B, Hkv, p + 1, Dh)
    o = softmax(scale q K^T) V                        the G query heads of a KV head stacked
    x = x + o Wo (+ bo)
    a = x / rms(x) * g2;  x = x + (silu(a W1) * (a W3)) W2

It takes a model only when every layer is that block (lean_layers) and the step is plain
(one int position every row of every KVState is at); anything else runs the general path,
which is also its twin: tests/lm/test_lean_decode.py checks they agree, and
SCRATCHLLM_READABLE=1 runs the general path only.

Glossary: B batch, D model width, H query heads, Hkv KV heads, G = H/Hkv, Dh head dim,
P = Dh/2 pairs, F FFN hidden, L keys held.
"""
import numpy as np

from scratchllm.attention.gqa import Attention
from scratchllm.attention.kv_state import KVState
from scratchllm.attention.rope import rope_angles, row_rope
from scratchllm.core.nn import RMSNorm
from scratchllm.core.twins import use_fused
from scratchllm.lm.ffn import SwiGLUFFN


def _plain_attention(spec):
    """An AttentionSpec the lean step covers: causal, no window, chunks, block pattern or mask
    array; no QK-norm, sinks, soft-cap, output gate, position bias or M-RoPE."""
    mask, rope = spec.mask, spec.rope
    return (mask.causal and mask.window is None and mask.chunk is None and mask.block is None
            and mask.array is None and not spec.qk_norm and not spec.sinks
            and spec.softcap is None and not spec.output_gate and spec.position_bias is None
            and (rope is None or (rope.mrope_section is None and not rope.axial)))


def lean_layers(model):
    """True when every layer of `model` (an LM) is a pre-norm block of an RMSNorm, GQA
    attention of a plain spec and a SwiGLU FFN: the blocks lean_decode runs."""
    for layer in model.layers:
        if not (type(layer.mixer) is Attention and type(layer.ffn) is SwiGLUFFN
                and type(layer.norm1) is RMSNorm and type(layer.norm2) is RMSNorm
                and layer.cross is None and layer.spec.placement == "pre"
                and layer.spec.out_scale == 1.0 and _plain_attention(layer.mixer.spec)):
            return False
    return True


def lean_step(model, state, position):
    """Whether lean_decode may run this step: the fused twins on, `position` one int, every
    layer lean (lean_layers) and every state a KVState whose rows all hold `position`
    tokens with room for one more."""
    if np.ndim(position) or not use_fused() or not lean_layers(model):
        return False
    for st in state:
        if type(st) is not KVState or st.max_len <= position or \
                (st.lengths != position).any():
            return False
    return True


def _rotation(spec, head_dim, position, dtype):
    """RoPE at `position` as (C, S, perm) over a head's Dh numbers (rotation's, one row)."""
    C, S, perm = rotation(row_rope("LM.decode", spec, head_dim, position), head_dim, dtype)
    return C[0], S[0], perm  # (Dh,), (Dh,), (Dh,)


def rotation(rope, head_dim, dtype):
    """RoPE at rope's positions (n,) as (C, S, perm): y = x C + x[..., perm] S over a head's
    Dh numbers, C, S (n, Dh). "half" pairs (i, i + P): C = [cos, cos], S = [-sin, sin], perm
    swaps the halves; "interleaved" pairs (2i, 2i + 1): C, S interleave the same way; a
    partial rotary width Dr leaves the numbers past it with C = 1, S = 0."""
    cos, sin = rope_angles(rope, 3, dtype)  # (n, P) each, af folded in
    n, P = cos.shape
    C, S = np.ones((n, head_dim), dtype), np.zeros((n, head_dim), dtype)  # (n, Dh)
    perm = np.arange(head_dim)  # (Dh,)
    if rope.style == "half":
        C[:, :P], C[:, P:2 * P], S[:, :P], S[:, P:2 * P] = cos, cos, -sin, sin
        perm[:2 * P] = np.concatenate([np.arange(P, 2 * P), np.arange(P)])
    else:
        C[:, 0:2 * P:2], C[:, 1:2 * P:2], S[:, 0:2 * P:2], S[:, 1:2 * P:2] = cos, cos, -sin, sin
        perm[0:2 * P:2], perm[1:2 * P:2] = np.arange(1, 2 * P, 2), np.arange(0, 2 * P, 2)
    return C, S, perm


def _rmsnorm(x, norm):
    """x (B, D) / rms(x) * (offset + g): the sum of squares in float64 (exact squares), the
    reciprocal rounded to x's dtype, as core.fused's RMSNorm twin."""
    ms = np.einsum("bd,bd->b", x, x, dtype=np.float64) / x.shape[1]  # (B,)
    r = (1.0 / np.sqrt(ms + norm.eps)).astype(x.dtype)[:, None]  # (B, 1)
    g = norm.g.data + norm.offset if norm.offset else norm.g.data  # (D,)
    return x * r * g  # (B, D)


def _linear(a, W, b):
    """a W (+ b) with the Params W and b (None: no bias)."""
    y = a @ W.data
    return y if b is None else y + b.data


def _attend(layer, x, st, position, rot):
    """The attention sub-layer's output o Wo (+ bo) for x (B, D) normed, appending the
    token's k, v to the KVState st at `position`."""
    at, spec = layer.mixer, layer.mixer.spec
    B, Dh = x.shape[0], at.head_dim
    H, Hkv = spec.n_heads, spec.n_kv_heads
    q = _linear(x, at.wq, at.bq).reshape(B, H, Dh)  # (B, H, Dh)
    k = _linear(x, at.wk, at.bk).reshape(B, Hkv, Dh)  # (B, Hkv, Dh)
    v = _linear(x, at.wv, at.bv).reshape(B, Hkv, Dh)  # (B, Hkv, Dh)
    if rot is not None:
        C, S, perm = rot
        q = q * C + q[..., perm] * S  # (B, H, Dh)
        k = k * C + k[..., perm] * S  # (B, Hkv, Dh)
    st.k[:, :, position] = k
    st.v[:, :, position] = v
    st.lengths += 1
    L = position + 1
    K, V = st.k[:, :, :L], st.v[:, :, :L]  # (B, Hkv, L, Dh) views
    s = q.reshape(B, Hkv, H // Hkv, Dh) @ K.swapaxes(-1, -2)  # (B, Hkv, G, L)
    s *= s.dtype.type(Dh ** -0.5 if spec.scale is None else spec.scale)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s, out=s)  # (B, Hkv, G, L)
    p /= p.sum(axis=-1, keepdims=True)
    o = (p @ V).reshape(B, H * Dh)  # (B, H*Dh)
    return _linear(o, at.wo, at.bo)  # (B, D)


def lean_decode(model, x, state, position):
    """The layers of one decoding step: x_0 (B, D) at `position` -> x_L (B, D), each layer's
    KVState taking the token (lean_step(model, state, position) must hold)."""
    with np.errstate(over="ignore"):  # exp(-h) = inf for h << 0: silu(h) = h / inf = -0
        return _layers(model, x, state, position)


def _layers(model, x, state, position):
    made = (None, None, None)  # (RopeSpec, head dim, rotation) of the last rotation made
    for layer, st in zip(model.layers, state):
        rope, Dh = layer.mixer.spec.rope, layer.mixer.head_dim
        if rope is not None and (Dh != made[1] or rope != made[0]):  # usually once a step
            made = (rope, Dh, _rotation(rope, Dh, position, x.dtype))
        rot = None if rope is None else made[2]
        x = x + _attend(layer, _rmsnorm(x, layer.norm1), st, position, rot)  # (B, D)
        f = layer.ffn
        a = _rmsnorm(x, layer.norm2)  # (B, D)
        h = a @ f.W1.data  # (B, F)
        m = h / (1 + np.exp(-h)) * (a @ f.W3.data)  # (B, F) silu(a W1) * (a W3)
        x = x + m @ f.W2.data  # (B, D)
    return x
