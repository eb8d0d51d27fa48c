"""A lean prefill for the plain pre-norm decoder (the stacks lm/lean_decode.py covers: Llama,
SmolLM, Mistral without a window, Qwen2): LM.prefill's layers over fresh KV states, the same
math as the general path (Block.prefill around Attention.prefill: gqa_forward, the fused
RMSNorm and SwiGLU twins), with the training caches, the per-op checks and the per-layer
RoPE tables left out, on two threads over the prompt's time axis.

The general path splits each GEMM over OpenBLAS's two threads and runs everything else (the
norms, the gate, the softmax, the residual adds, RoPE) on one: a quarter of a 256-token
prefill's wall time on two cores. Here the prompt's T positions are cut into one span per
thread and each thread runs its span with BLAS at one thread, every layer in two phases
with a barrier after each (attention needs the keys of every earlier position):

    A (span t0..t1):  a = rmsnorm(x) g1;  q, k, v = a Wq (+ bq), a Wk (+ bk), a Wv (+ bv)
                      q, k = q C + q[perm] S   (RoPE at t0..t1, tables made once per prefill)
                      K[t0:t1], V[t0:t1] = k, v    (into the layer's KVState)
    B (span t0..t1):  o = softmax(scale q K[:t1]^T, causal) V[:t1]    G query heads stacked
                      h = x + o Wo (+ bo);  x' = h + swiglu(rmsnorm(h) g2)

Row for row these are the general path's products (each row's dot products by BLAS in its
own order): tests/lm/test_lean_prefill.py checks the two agree in float64 (logits and the
states' keys and values) for the options lean_decode covers. SCRATCHLLM_READABLE=1 runs the
general path only.

Glossary: B batch, T prompt length, D model width, H query heads, Hkv KV heads, G = H/Hkv,
Dh head dim, t a span's positions, F FFN hidden.
"""
import threading

import numpy as np

from scratchllm.attention.kv_state import KVState
from scratchllm.attention.rope import make_rope
from scratchllm.core import fused
from scratchllm.core.blas import blas_threads, run_tasks
from scratchllm.core.twins import use_fused
from scratchllm.lm.lean_decode import lean_layers, rotation

MIN_SPAN = 32  # positions per thread below which one thread runs the whole prompt


def lean_prefill_ok(model, state, T):
    """Whether lean_prefill may fill `state` with T positions: the fused twins on, every
    layer lean (lean_decode.lean_layers) and every state a fresh KVState with room for T."""
    if T < 1 or not use_fused() or not lean_layers(model):
        return False
    return all(type(st) is KVState and st.max_len >= T and not st.lengths.any()
               for st in state)


def lean_prefill(model, x, state, threads=None):
    """The layers of a prefill: x_0 (B, T, D) at positions 0..T-1 -> x_L (B, T, D), each
    layer's KVState taking the T keys and values (lean_prefill_ok(model, state, T) must
    hold). threads: how many spans of positions run side by side (at least MIN_SPAN
    positions each); None: as many as OpenBLAS has threads (1 inside a data-parallel shard
    or another task that set BLAS to one thread: no threads within threads)."""
    B, T, D = x.shape
    threads = max(blas_threads(), default=1) if threads is None else threads
    n = max(1, min(threads, T // MIN_SPAN))
    cuts = [T * i // n for i in range(n + 1)]
    spans = list(zip(cuts[:-1], cuts[1:]))
    tables = _rope_tables(model, T, x.dtype)
    xs = np.array(x, order="C")  # (B, T, D) the residual stream; each span updates its rows
    barrier = threading.Barrier(len(spans))

    def run(i):
        try:
            with np.errstate(over="ignore"):  # silu of h << 0: exp(-h) = inf, h / inf = -0
                _span(model, state, xs, spans[i], tables, barrier)
        except BaseException:
            barrier.abort()  # the other threads leave their wait (BrokenBarrierError)
            raise
    run_tasks(run, len(spans), len(spans))
    for st in state:
        st.lengths += T
    return xs  # (B, T, D)


def _rope_tables(model, T, dtype):
    """[(C, S, perm) or None per layer]: RoPE at positions 0..T-1 as the general path makes it
    (make_rope over arange(T), dynamic NTK at length T), made once per distinct
    (RopeSpec, Dh) (a RopeSpec with a scaling dict is not hashable: compared by ==)."""
    made, tables = [], []
    for layer in model.layers:
        rope, Dh = layer.mixer.spec.rope, layer.mixer.head_dim
        hit = next((r for spec, dh, r in made if spec == rope and dh == Dh), None)
        if rope is not None and hit is None:
            hit = rotation(make_rope(rope, Dh, np.arange(T)), Dh, dtype)
            made.append((rope, Dh, hit))
        tables.append(hit)
    return tables


def _span(model, state, xs, span, tables, barrier):
    """Every layer for the positions span = (t0, t1) of the residual stream xs (B, T, D),
    in place: phase A, barrier, phase B, barrier. Spans share only the KV states."""
    t0, t1 = span
    x = xs[:, t0:t1]  # (B, t, D) view: this span's rows
    for layer, st, rot in zip(model.layers, state, tables):
        q = _qkv(layer, x, st, span, rot)  # (B, Hkv, G*t, Dh); K, V written
        barrier.wait()
        h = x + _attend(layer, q, st, span)  # (B, t, D)
        f = layer.ffn
        a = fused.fused_rmsnorm_forward(h, _gain(layer.norm2), layer.norm2.eps)[0]  # (B, t, D)
        x[...] = h + fused.fused_swiglu_forward(a, f.W1.data, f.W3.data, f.W2.data)[0]
        barrier.wait()


def _gain(norm):
    """An RMSNorm's gain as the pair sees it: offset + g (Gemma-style 1 + w) or g."""
    return norm.g.data + norm.offset if norm.offset else norm.g.data  # (D,)


def _linear(a, W, b):
    """a (B, t, Din) W (+ b) -> (B, t, Dout), one GEMM over the rows."""
    B, t, _ = a.shape
    y = (a.reshape(B * t, -1) @ W.data).reshape(B, t, -1)  # (B, t, Dout)
    return y if b is None else y + b.data


def _qkv(layer, x, st, span, rot):
    """Phase A: q of the span's positions grouped by KV head, (B, Hkv, G*t, Dh); the span's
    rotated keys and values written into the KVState st."""
    at, spec = layer.mixer, layer.mixer.spec
    t0, t1 = span
    B, t, _ = x.shape
    H, Hkv, Dh = spec.n_heads, spec.n_kv_heads, at.head_dim
    a = fused.fused_rmsnorm_forward(x, _gain(layer.norm1), layer.norm1.eps)[0]  # (B, t, D)
    q = _linear(a, at.wq, at.bq).reshape(B, t, H, Dh)  # (B, t, H, Dh)
    k = _linear(a, at.wk, at.bk).reshape(B, t, Hkv, Dh)  # (B, t, Hkv, Dh)
    v = _linear(a, at.wv, at.bv).reshape(B, t, Hkv, Dh)  # (B, t, Hkv, Dh)
    if rot is not None:
        C, S, perm = rot  # (T, Dh), (T, Dh), (Dh,)
        C, S = C[t0:t1, None], S[t0:t1, None]  # (t, 1, Dh)
        q = q * C + q[..., perm] * S  # (B, t, H, Dh)
        k = k * C + k[..., perm] * S  # (B, t, Hkv, Dh)
    st.k[:, :, t0:t1] = k.transpose(0, 2, 1, 3)  # (B, Hkv, t, Dh)
    st.v[:, :, t0:t1] = v.transpose(0, 2, 1, 3)
    G = H // Hkv
    q = q.reshape(B, t, Hkv, G, Dh).transpose(0, 2, 3, 1, 4)  # (B, Hkv, G, t, Dh)
    return np.ascontiguousarray(q).reshape(B, Hkv, G * t, Dh)  # (B, Hkv, G*t, Dh)


def _attend(layer, q, st, span):
    """Phase B's attention: the span's queries q (B, Hkv, G*t, Dh) against the keys of
    positions 0..t1-1, causal; returns o Wo (+ bo) (B, t, D)."""
    at, spec = layer.mixer, layer.mixer.spec
    t0, t1 = span
    B, Hkv, Gt, Dh = q.shape
    t, H = t1 - t0, spec.n_heads
    K, V = st.k[:, :, :t1], st.v[:, :, :t1]  # (B, Hkv, t1, Dh) views
    s = q @ K.swapaxes(-1, -2)  # (B, Hkv, G*t, t1)
    s *= s.dtype.type(Dh ** -0.5 if spec.scale is None else spec.scale)
    later = np.arange(t1) > np.arange(t0, t1)[:, None]  # (t, t1) key after the query
    np.copyto(s.reshape(B, Hkv, H // Hkv, t, t1), s.dtype.type(-np.inf), where=later)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s, out=s)  # (B, Hkv, G*t, t1)
    p /= p.sum(axis=-1, keepdims=True)
    o = (p @ V).reshape(B, H, t, Dh).transpose(0, 2, 1, 3)  # (B, t, H, Dh)
    return _linear(np.ascontiguousarray(o).reshape(B, t, H * Dh), at.wo, at.bo)  # (B, t, D)
