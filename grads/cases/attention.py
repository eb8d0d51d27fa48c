"""Gradient-check cases of scratchllm.attention: RoPE, scaled dot-product attention (masks,
biases, sinks, flash), cross and sparse attention, GQA with the options of published
checkpoints, MLA. (The tokenizer has nothing to differentiate.)"""
import numpy as np

from grads.cases._common import case
from grads.check import check


@case
def rope(rng):
    from scratchllm.attention import rope_backward, rope_forward, rope_frequencies
    inv_freq, af = rope_frequencies(6, scaling={"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 8})
    x = rng.standard_normal((2, 3, 5, 6))
    return [check(rope_forward, rope_backward, rng=rng, label=f"{style}, {pos.ndim}-d pos",
                  wrt=["x"], x=x, positions=pos, inv_freq=inv_freq, style=style,
                  attention_factor=af)
            for style in ("half", "interleaved")
            for pos in (np.arange(3, 8), rng.integers(0, 50, size=(2, 5)))]


@case
def rope_heads(rng):
    from scratchllm.attention import rope_frequencies
    from scratchllm.attention import rope_heads as rh
    inv_freq, af = rope_frequencies(6, scaling={"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 8})
    t = rng.standard_normal((2, 5, 3 * 6))
    return [check(fwd, bwd, rng=rng, label=f"{label}, {style}", wrt=["t"], t=t,
                  positions=np.arange(3, 8), inv_freq=inv_freq, n_heads=3, style=style,
                  attention_factor=af)
            for label, fwd, bwd in (("fused", rh.rope_heads_forward, rh.rope_heads_backward),
                                    ("ref", rh.rope_heads_forward_ref,
                                     rh.rope_heads_backward_ref))
            for style in ("half", "interleaved")]


@case
def sdpa(rng):
    from scratchllm.attention import causal_mask, sdpa_backward, sdpa_forward
    q, k, v = (rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 7, 4)),
               rng.standard_normal((2, 3, 7, 6)))
    mask = rng.random((2, 1, 5, 7)) < 0.6
    mask[0, 0, 2] = False  # a fully masked row: zeros out, zero gradient
    return [check(sdpa_forward, sdpa_backward, rng=rng, label="no mask", q=q, k=k, v=v),
            check(sdpa_forward, sdpa_backward, rng=rng, label="random mask, scale", q=q, k=k,
                  v=v, mask=mask, scale=0.3),
            check(sdpa_forward, sdpa_backward, rng=rng, label="causal", q=q, k=k[:, :, :5],
                  v=v[:, :, :5], mask=causal_mask(5)),
            check(sdpa_forward, sdpa_backward, rng=rng, label="grouped kv (H=6, Hkv=2), "
                  "per-head mask", q=rng.standard_normal((2, 6, 5, 4)), k=k[:, :2],
                  v=v[:, :2], mask=rng.random((1, 6, 5, 7)) < 0.7)]


@case
def sdpa_bias(rng):
    from scratchllm.attention import alibi_bias, alibi_slopes, causal_mask, sdpa_forward
    from scratchllm.attention import sdpa_backward
    q, k, v = (rng.standard_normal((2, 6, 5, 4)), rng.standard_normal((2, 3, 7, 4)),
               rng.standard_normal((2, 3, 7, 3)))
    return [check(sdpa_forward, sdpa_backward, rng=rng, label="alibi (H, Tq, Tk), causal",
                  q=q, k=k, v=v, mask=causal_mask(7)[2:], bias=alibi_bias(alibi_slopes(6), 5, 7)),
            check(sdpa_forward, sdpa_backward, rng=rng, label="per-batch (B, 1, Tq, Tk) bias",
                  q=q, k=k, v=v, bias=rng.standard_normal((2, 1, 5, 7)))]


@case
def flash_sdpa(rng):
    from scratchllm.attention import alibi_slopes, flash_sdpa_backward, flash_sdpa_forward
    q, k, v = (rng.standard_normal((1, 4, 7, 3)), rng.standard_normal((1, 2, 9, 3)),
               rng.standard_normal((1, 2, 9, 5)))
    blocks = dict(block_q=3, block_k=4)  # ragged: 7 = 3+3+1 rows, 9 = 4+4+1 keys
    slopes = alibi_slopes(4) * (1 + rng.random(4))
    return [check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="no mask, Tq != Tk",
                  q=q, k=k, v=v, **blocks),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="causal, scale",
                  q=q, k=k, v=v, causal=True, scale=0.4, **blocks),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="window 3, 2 sinks",
                  q=q, k=k, v=v, causal=True, window=3, n_sink=2, **blocks),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="learned alibi, causal",
                  q=q, k=k, v=v, alibi_slopes=slopes, causal=True, **blocks),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="alibi bidirectional",
                  q=q, k=k, v=v, alibi_slopes=slopes, **blocks),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="gpt-oss sinks, causal "
                  "(Tq < Tk)", q=q, k=k, v=v, sinks=rng.standard_normal(4), causal=True, **blocks),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="sinks, window 3",
                  q=q, k=k, v=v, sinks=rng.standard_normal(4), causal=True, window=3, **blocks)]


@case
def cross_attention(rng):
    from scratchllm.attention import cross_attention_backward, cross_attention_forward
    B, Tq, Tk, D, Dc, H, Hkv, Dh = 2, 5, 7, 9, 11, 6, 3, 4
    w = dict(x=rng.standard_normal((B, Tq, D)), ctx=rng.standard_normal((B, Tk, Dc)),
             wq=rng.standard_normal((D, H * Dh)), wk=rng.standard_normal((Dc, Hkv * Dh)),
             wv=rng.standard_normal((Dc, Hkv * Dh)), wo=rng.standard_normal((H * Dh, D)))
    pad = np.arange(Tk)[None, None, None, :] < np.array([Tk, 4])[:, None, None, None]
    return [check(cross_attention_forward, cross_attention_backward, rng=rng, label="GQA",
                  **w, n_heads=H, n_kv_heads=Hkv),
            check(cross_attention_forward, cross_attention_backward, rng=rng,
                  label="padding mask (B, 1, 1, Tk)", **w, n_heads=H, n_kv_heads=Hkv, mask=pad)]


@case
def sparse_attention(rng):
    from scratchllm.attention import (indexer_kl_loss_backward, indexer_kl_loss_forward,
                                      lightning_indexer_backward, lightning_indexer_forward,
                                      topk_select, topk_sparse_attention_backward,
                                      topk_sparse_attention_forward)
    B, T, HI, DI, H, Hkv, Dh, Dv = 2, 9, 3, 5, 6, 2, 4, 3
    q_idx, k_idx = rng.standard_normal((B, T, HI, DI)), rng.standard_normal((B, T, DI))
    scores = rng.standard_normal((B, T, T))  # distinct: the top 4 has no ties
    target = rng.random((B, T, T)) * np.tril(np.ones((T, T)))
    target /= target.sum(-1, keepdims=True)
    return [check(lightning_indexer_forward, lightning_indexer_backward, rng=rng,
                  label="indexer", q_idx=q_idx, k_idx=k_idx, w=rng.standard_normal((B, T, HI))),
            check(topk_sparse_attention_forward, topk_sparse_attention_backward, rng=rng,
                  label="top 4 of 9, GQA, blocks of 4", q=rng.standard_normal((B, H, T, Dh)),
                  k=rng.standard_normal((B, Hkv, T, Dh)), v=rng.standard_normal((B, Hkv, T, Dv)),
                  indices=topk_select(scores, 4), block_q=4),
            check(indexer_kl_loss_forward, indexer_kl_loss_backward, rng=rng, label="KL, causal",
                  wrt=["index_scores"], index_scores=scores, target=target,
                  allowed=np.tril(np.ones((T, T), bool)))]


@case
def sdpa_sinks(rng):
    from scratchllm.attention import causal_mask, sdpa_backward, sdpa_forward
    q, k, v = (rng.standard_normal((2, 6, 5, 4)), rng.standard_normal((2, 2, 7, 4)),
               rng.standard_normal((2, 2, 7, 3)))
    mask = rng.random((2, 6, 5, 7)) < 0.6
    mask[1, 4, 3] = False  # a fully masked row: all mass on the sink, zero output
    sinks = rng.standard_normal(6)
    return [check(sdpa_forward, sdpa_backward, rng=rng, label="gpt-oss sinks, grouped kv, "
                  "random mask", q=q, k=k, v=v, mask=mask, sinks=sinks),
            check(sdpa_forward, sdpa_backward, rng=rng, label="sinks, MHA, causal, scale",
                  q=q[:, :2], k=k[:, :, :5], v=v[:, :, :5], mask=causal_mask(5), scale=0.3,
                  sinks=sinks[:2])]


@case
def repeat_kv(rng):
    from scratchllm.attention import repeat_kv_backward, repeat_kv_forward
    return check(repeat_kv_forward, repeat_kv_backward, rng=rng,
                 kv=rng.standard_normal((2, 3, 5, 4)), group=2)


@case
def project_qkv(rng):
    from scratchllm.attention import project_qkv_backward, project_qkv_forward, rope_frequencies
    B, T, D, H, Hkv, Dh = 2, 5, 7, 6, 3, 4
    w = dict(x=rng.standard_normal((B, T, D)), wq=rng.standard_normal((D, H * Dh)),
             wk=rng.standard_normal((D, Hkv * Dh)), wv=rng.standard_normal((D, Hkv * Dh)))
    return [check(project_qkv_forward, project_qkv_backward, rng=rng, label="no rope", **w,
                  n_heads=H, n_kv_heads=Hkv),
            check(project_qkv_forward, project_qkv_backward, rng=rng, label="rope", **w,
                  wrt=list(w), n_heads=H, n_kv_heads=Hkv, inv_freq=rope_frequencies(Dh)[0])]


@case
def gqa(rng):
    from scratchllm.attention import (attention_sink_mask, block_sparse_mask, gqa_backward,
                                      gqa_forward, gqa_forward_ref)
    from scratchllm.attention import rope_frequencies
    B, T, D, H, Hkv, Dh = 2, 7, 5, 6, 2, 4
    w = dict(x=rng.standard_normal((B, T, D)), wq=rng.standard_normal((D, H * Dh)),
             wk=rng.standard_normal((D, Hkv * Dh)), wv=rng.standard_normal((D, Hkv * Dh)),
             wo=rng.standard_normal((H * Dh, D)))
    inv_freq, _ = rope_frequencies(Dh)
    rope = dict(inv_freq=inv_freq, wrt=list(w))
    variants = {"no rope, causal": {}, "no rope, no mask": dict(mask=None),
                "rope half, causal": rope,
                "rope interleaved, sliding 3, af 1.2": dict(rope, rope_style="interleaved",
                                                            mask="sliding", window=3,
                                                            attention_factor=1.2),
                "rope, sink(3, 1), (B,T) pos": dict(rope, mask=attention_sink_mask(T, 3, 1),
                                                    positions=rng.integers(0, 30, (B, T))),
                "rope, block sparse(2, 1)": dict(rope, mask=block_sparse_mask(T, 2, 1)),
                "MQA (Hkv=1), rope": dict(rope, wk=w["wk"][:, :Dh], wv=w["wv"][:, :Dh],
                                          n_kv_heads=1)}
    reports = [check(gqa_forward, gqa_backward, rng=rng, label=label,
                     **{**w, "n_heads": H, "n_kv_heads": Hkv, **kw})
               for label, kw in variants.items()]
    return reports + [check(gqa_forward_ref, gqa_backward, rng=rng, label="ref (repeat_kv)",
                            **w, **rope, n_heads=H, n_kv_heads=Hkv)]


@case
def gqa_options(rng):
    """The attention options of published checkpoints: q/k/v and output biases (Qwen2,
    GPT-2), QK-norm gains (Qwen3), a softmax scale other than Dh^-1/2 (Gemma 3), learned sink
    logits (gpt-oss)."""
    from scratchllm.attention import gqa_backward, gqa_forward, rope_frequencies
    from scratchllm.attention.gqa import AttnOptions
    B, T, D, H, Hkv, Dh = 2, 7, 5, 6, 2, 4
    w = dict(x=rng.standard_normal((B, T, D)), wq=rng.standard_normal((D, H * Dh)),
             wk=rng.standard_normal((D, Hkv * Dh)), wv=rng.standard_normal((D, Hkv * Dh)),
             wo=rng.standard_normal((H * Dh, D)))
    bias = dict(bq=rng.standard_normal(H * Dh), bk=rng.standard_normal(Hkv * Dh),
                bv=rng.standard_normal(Hkv * Dh))
    norm = dict(q_norm=1 + 0.3 * rng.standard_normal(Dh), k_norm=1 + 0.3 * rng.standard_normal(Dh))
    rope = dict(inv_freq=rope_frequencies(Dh)[0], n_heads=H, n_kv_heads=Hkv)
    return [check(gqa_forward, gqa_backward, rng=rng, label="qkv bias", wrt=[*w, *bias], **w,
                  **bias, **rope),
            check(gqa_forward, gqa_backward, rng=rng, label="qk-norm, scale 0.3",
                  wrt=[*w, *norm], **w, **norm, **rope, scale=0.3, norm_eps=1e-6),
            check(gqa_forward, gqa_backward, rng=rng, label="all biases but bk, no rope",
                  wrt=[*w, "bq", "bv", "bo"], **w, **bias, bo=rng.standard_normal(D),
                  n_heads=H, n_kv_heads=Hkv),  # without RoPE d/dbk = 0 (see lm_hub)
            check(gqa_forward, gqa_backward, rng=rng, label="gpt-oss: biases, sinks, window 3",
                  wrt=[*w, *bias, "bo", "sinks"], **w, **bias, bo=rng.standard_normal(D),
                  sinks=rng.standard_normal(H), mask="sliding", window=3, **rope),
            check(gqa_forward, gqa_backward, rng=rng, label="sinks through flash, causal",
                  wrt=[*w, "sinks"], **w, sinks=rng.standard_normal(H), **rope,
                  attn=AttnOptions("flash", block=3))]


@case
def mla(rng):
    from scratchllm.attention import mla_backward, mla_forward, mla_softmax_scale
    from scratchllm.attention import rope_frequencies
    B, T, D, H, dn, dr, dv, Dc, Dq = 2, 5, 11, 3, 4, 6, 5, 7, 9  # distinct sizes
    w = dict(wkv_a=0.4 * rng.standard_normal((D, Dc + dr)), kv_norm=1 + rng.random(Dc),
             wkv_b=0.4 * rng.standard_normal((Dc, H * (dn + dv))),
             wo=0.4 * rng.standard_normal((H * dv, D)))
    wq = dict(wq=0.4 * rng.standard_normal((D, H * (dn + dr))))
    wq_lora = dict(wq_a=0.4 * rng.standard_normal((D, Dq)), q_norm=1 + rng.random(Dq),
                   wq_b=0.4 * rng.standard_normal((Dq, H * (dn + dr))))
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2,
            "mscale": 1.0, "mscale_all_dim": 1.0}
    inv_freq, af = rope_frequencies(dr, scaling=yarn)
    x = rng.standard_normal((B, T, D))
    return [check(mla_forward, mla_backward, rng=rng, label="wq, interleaved", x=x, **w, **wq,
                  n_heads=H),
            check(mla_forward, mla_backward, rng=rng, label="wq_a/q_norm/wq_b", x=x, **w,
                  **wq_lora, n_heads=H),
            check(mla_forward, mla_backward, rng=rng, label="half, yarn, (B,T) pos", x=x, **w,
                  **wq_lora, wrt=["x", *w, *wq_lora], n_heads=H, rope_style="half", inv_freq=inv_freq,
                  attention_factor=af, softmax_scale=mla_softmax_scale(dn + dr, yarn),
                  positions=np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]]))]


@case
def mla_project(rng):
    from scratchllm.attention import mla_project_backward, mla_project_forward, rope_frequencies
    from scratchllm.attention.mla_projection import geometry
    B, T, D, H, dn, dr, dv, Dc, Dq = 2, 5, 11, 3, 4, 6, 5, 7, 9
    x = rng.standard_normal((B, T, D))
    w = dict(wkv_a=0.4 * rng.standard_normal((D, Dc + dr)), kv_norm=1 + rng.random(Dc),
             wq_a=0.4 * rng.standard_normal((D, Dq)), q_norm=1 + rng.random(Dq),
             wq_b=0.4 * rng.standard_normal((Dq, H * (dn + dr))))
    g = geometry("mla_project", x, w["wkv_a"], w["kv_norm"], np.zeros((Dc, H * (dn + dv))),
                 np.zeros((H * dv, D)), None, w["wq_a"], w["q_norm"], w["wq_b"], H)
    return check(mla_project_forward, mla_project_backward, rng=rng, wrt=["x", *w], x=x, **w,
                 geometry=g, positions=np.arange(T), inv_freq=rope_frequencies(dr)[0],
                 rope_style="interleaved", attention_factor=1.0, eps=1e-6)
