"""Gradient-check cases of scratchllm.attention: RoPE, scaled dot-product attention (masks,
biases, sinks, flash), cross, sparse and native sparse attention, GQA with the options of
published checkpoints, MLA. (The tokenizer has nothing to differentiate.)"""
import numpy as np

from grads.cases._common import case
from grads.check import check
from scratchllm.specs import AttentionSpec, Mask, MLASpec, RopeSpec, ScoresSpec, TemperatureSpec


@case
def rope(rng):
    from scratchllm.attention import Rope, rope_backward, rope_forward, rope_frequencies
    inv_freq, af = rope_frequencies(6, scaling={"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 8})
    x = rng.standard_normal((2, 3, 5, 6))
    return [check(rope_forward, rope_backward, rng=rng, label=f"{style}, {pos.ndim}-d pos",
                  x=x, rope=Rope(inv_freq, style, af, pos))
            for style in ("half", "interleaved")
            for pos in (np.arange(3, 8), rng.integers(0, 50, size=(2, 5)))] + [
        check(rope_forward, rope_backward, rng=rng, label=f"M-RoPE, {pos.ndim - 1}-d pos",
              x=x, rope=Rope(inv_freq, "half", af, pos, sections=(1, 2)))
        for pos in (rng.integers(0, 50, size=(3, 5)), rng.integers(0, 50, size=(3, 2, 5)))]


@case
def rope_heads(rng):
    from scratchllm.attention import Rope, rope_frequencies
    from scratchllm.attention import rope_heads as rh
    inv_freq, af = rope_frequencies(6, scaling={"rope_type": "yarn", "factor": 4.0,
                                                "original_max_position_embeddings": 8})
    t = rng.standard_normal((2, 5, 3 * 6))
    return [check(fwd, bwd, rng=rng, label=f"{label}, {style}", t=t,
                  rope=Rope(inv_freq, style, af, np.arange(3, 8)), n_heads=3)
            for label, fwd, bwd in (("fused", rh.rope_heads_forward, rh.rope_heads_backward),
                                    ("ref", rh.rope_heads_forward_ref,
                                     rh.rope_heads_backward_ref))
            for style in ("half", "interleaved")]


@case
def sdpa(rng):
    from scratchllm.attention import sdpa_backward, sdpa_forward
    q, k, v = (rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 7, 4)),
               rng.standard_normal((2, 3, 7, 6)))
    mask = rng.random((2, 1, 5, 7)) < 0.6
    mask[0, 0, 2] = False  # a fully masked row: zeros out, zero gradient
    return [check(sdpa_forward, sdpa_backward, rng=rng, label="no mask", q=q, k=k, v=v),
            check(sdpa_forward, sdpa_backward, rng=rng, label="random mask, scale", q=q, k=k,
                  v=v, mask=Mask(array=mask), scale=0.3),
            check(sdpa_forward, sdpa_backward, rng=rng, label="causal", q=q, k=k[:, :, :5],
                  v=v[:, :, :5], mask=Mask()),
            check(sdpa_forward, sdpa_backward, rng=rng, label="grouped kv (H=6, Hkv=2), "
                  "per-head mask", q=rng.standard_normal((2, 6, 5, 4)), k=k[:, :2],
                  v=v[:, :2], mask=Mask(array=rng.random((1, 6, 5, 7)) < 0.7)),
            check(sdpa_forward, sdpa_backward, rng=rng, label="soft-capped scores (cap 1.5), "
                  "grouped, causal", q=3 * rng.standard_normal((2, 6, 5, 4)), k=k[:, :2, :5],
                  v=v[:, :2, :5], mask=Mask(), softcap=1.5)]


@case
def relative_bias(rng):
    """T5's relative position bias: in a GQA layer (AttentionSpec.relative: encoder and causal
    decoder self-attention, unscaled, head dim apart from D / H), the table lookup alone
    (bidirectional; causal with the queries at offset 3), and through unscaled attention (T5
    does not scale q.k), where the table gets its gradient from sdpa's bias gradient."""
    from scratchllm.attention import (relative_bias_backward, relative_bias_forward,
                                      sdpa_backward, sdpa_forward)
    from scratchllm.specs import RelativeBiasSpec
    both, causal = RelativeBiasSpec(8, 12), RelativeBiasSpec(8, 12, bidirectional=False)
    table = rng.standard_normal((8, 3))
    q, k, v = (rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 9, 4)),
               rng.standard_normal((2, 3, 9, 4)))

    def forward(q, k, v, table):  # o = softmax(q k^T + bias(table)) v
        bias, c_bias = relative_bias_forward(table, spec=both, Tq=5, Tk=9)
        o, c = sdpa_forward(q, k, v, scale=1.0, bias=bias)
        return o, (c, c_bias)

    def backward(do, cache):
        g = sdpa_backward(do, cache[0])  # fwd: o = sdpa(q, k, v, bias)
        g["table"] = relative_bias_backward(g.pop("bias"), cache[1])["table"]
        return g

    from scratchllm.attention import AttentionWeights, gqa_backward, gqa_forward
    D, H, Dh = 6, 3, 4  # T5: head dim apart from D / H, no scaling, no RoPE
    w = AttentionWeights(*(rng.standard_normal(shape) * 0.5 for shape in (
        (D, H * Dh), (D, H * Dh), (D, H * Dh), (H * Dh, D))), rel_table=table)
    layers = [(f"gqa layer, {name}", AttentionSpec(H, H, Dh, scale=1.0, rope=None,
                                                    mask=Mask(causal=name == "causal"),
                                                    position_bias=rel))
              for name, rel in (("encoder", both), ("causal", causal))]
    reports = [check(gqa_forward, gqa_backward, rng=rng, label=label,
                     x=rng.standard_normal((2, 7, D)), w=w, spec=spec) for label, spec in layers]
    return reports + [check(relative_bias_forward, relative_bias_backward, rng=rng,
                  label="bidirectional, 5 x 9", table=table, spec=both, Tq=5, Tk=9),
            check(relative_bias_forward, relative_bias_backward, rng=rng,
                  label="causal, queries at 3..6", table=table, spec=causal, Tq=4, Tk=7,
                  offset=3),
            check(forward, backward, rng=rng, label="through unscaled attention", q=q, k=k,
                  v=v, table=table)]


@case
def sdpa_bias(rng):
    from scratchllm.attention import alibi_bias, alibi_slopes, sdpa_backward, sdpa_forward
    q, k, v = (rng.standard_normal((2, 6, 5, 4)), rng.standard_normal((2, 3, 7, 4)),
               rng.standard_normal((2, 3, 7, 3)))
    return [check(sdpa_forward, sdpa_backward, rng=rng, label="alibi (H, Tq, Tk), causal",
                  q=q, k=k, v=v, mask=Mask(), bias=alibi_bias(alibi_slopes(6), 5, 7)),
            check(sdpa_forward, sdpa_backward, rng=rng, label="per-batch (B, 1, Tq, Tk) bias",
                  q=q, k=k, v=v, bias=rng.standard_normal((2, 1, 5, 7)))]


@case
def flash_sdpa(rng):
    from scratchllm.attention import alibi_slopes, flash_sdpa_backward, flash_sdpa_forward
    q, k, v = (rng.standard_normal((1, 4, 7, 3)), rng.standard_normal((1, 2, 9, 3)),
               rng.standard_normal((1, 2, 9, 5)))
    qkv = dict(q=q, k=k, v=v, block=(3, 4))  # ragged: 7 = 3+3+1 rows, 9 = 4+4+1 keys
    slopes = alibi_slopes(4) * (1 + rng.random(4))
    return [check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="no mask, Tq != Tk",
                  **qkv),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="causal, scale",
                  **qkv, mask=Mask(), scale=0.4),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="window 3, 2 sinks",
                  **qkv, mask=Mask(window=3, n_sink=2)),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="learned alibi, causal",
                  **qkv, alibi_slopes=slopes, mask=Mask()),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="alibi bidirectional",
                  **qkv, alibi_slopes=slopes),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="gpt-oss sinks, causal "
                  "(Tq < Tk)", **qkv, sinks=rng.standard_normal(4), mask=Mask()),
            check(flash_sdpa_forward, flash_sdpa_backward, rng=rng, label="sinks, window 3",
                  **qkv, sinks=rng.standard_normal(4), mask=Mask(window=3))]


@case
def cross_attention(rng):
    from scratchllm.attention import (AttentionWeights, cross_attention_backward,
                                      cross_attention_forward)
    B, Tq, Tk, D, Dc, H, Hkv, Dh = 2, 5, 7, 9, 11, 6, 3, 4
    x, ctx = rng.standard_normal((B, Tq, D)), rng.standard_normal((B, Tk, Dc))
    w = AttentionWeights(rng.standard_normal((D, H * Dh)), rng.standard_normal((Dc, Hkv * Dh)),
                         rng.standard_normal((Dc, Hkv * Dh)), rng.standard_normal((H * Dh, D)))
    spec = AttentionSpec(H, Hkv, head_dim=Dh, rope=None, mask=Mask(causal=False))
    pad = np.arange(Tk)[None, None, None, :] < np.array([Tk, 4])[:, None, None, None]
    return [check(cross_attention_forward, cross_attention_backward, rng=rng, label="GQA",
                  x=x, ctx=ctx, w=w, spec=spec),
            check(cross_attention_forward, cross_attention_backward, rng=rng,
                  label="padding mask (B, 1, 1, Tk)", x=x, ctx=ctx, w=w, spec=spec,
                  mask=Mask(array=pad))]


@case
def sparse_attention(rng):
    from scratchllm.attention import (indexer_kl_loss_backward, indexer_kl_loss_forward,
                                      lightning_indexer_backward, lightning_indexer_forward,
                                      topk_select, topk_sparse_attention_backward,
                                      topk_sparse_attention_forward)
    from scratchllm.attention import sparse as sp
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
            check(sp.topk_sparse_attention_forward_ref, sp.topk_sparse_attention_backward_ref,
                  rng=rng, label="readable twin, top 4 of 9, GQA",
                  q=rng.standard_normal((B, H, T, Dh)), k=rng.standard_normal((B, Hkv, T, Dh)),
                  v=rng.standard_normal((B, Hkv, T, Dv)), indices=topk_select(scores, 4),
                  block_q=4),
            check(sp.fused_topk_sparse_attention_forward, sp.fused_topk_sparse_attention_backward,
                  rng=rng, label="fused twin, one KV head (query chunks), top 3 of 9",
                  q=rng.standard_normal((1, 3, T, Dh)), k=rng.standard_normal((1, 1, T, Dh)),
                  v=rng.standard_normal((1, 1, T, Dv)), indices=topk_select(scores[:1], 3)),
            check(indexer_kl_loss_forward, indexer_kl_loss_backward, rng=rng, label="KL, causal",
                  wrt=["index_scores"], index_scores=scores, target=target,
                  allowed=np.tril(np.ones((T, T), bool)))]


@case
def sdpa_sinks(rng):
    from scratchllm.attention import sdpa_backward, sdpa_forward
    q, k, v = (rng.standard_normal((2, 6, 5, 4)), rng.standard_normal((2, 2, 7, 4)),
               rng.standard_normal((2, 2, 7, 3)))
    mask = rng.random((2, 6, 5, 7)) < 0.6
    mask[1, 4, 3] = False  # a fully masked row: all mass on the sink, zero output
    sinks = rng.standard_normal(6)
    return [check(sdpa_forward, sdpa_backward, rng=rng, label="gpt-oss sinks, grouped kv, "
                  "random mask", q=q, k=k, v=v, mask=Mask(array=mask), sinks=sinks),
            check(sdpa_forward, sdpa_backward, rng=rng, label="sinks, MHA, causal, scale",
                  q=q[:, :2], k=k[:, :, :5], v=v[:, :, :5], mask=Mask(), scale=0.3,
                  sinks=sinks[:2])]


@case
def repeat_kv(rng):
    from scratchllm.attention import repeat_kv_backward, repeat_kv_forward
    return check(repeat_kv_forward, repeat_kv_backward, rng=rng,
                 kv=rng.standard_normal((2, 3, 5, 4)), group=2)


def _gqa_inputs(rng, D, H, Hkv, Dh, B=2, T=7):
    """x (B, T, D) and an AttentionWeights(wq, wk, wv, wo) of standard normals."""
    from scratchllm.attention import AttentionWeights
    x = rng.standard_normal((B, T, D))
    return x, AttentionWeights(rng.standard_normal((D, H * Dh)),
                               rng.standard_normal((D, Hkv * Dh)),
                               rng.standard_normal((D, Hkv * Dh)),
                               rng.standard_normal((H * Dh, D)))


@case
def project_qkv(rng):
    from scratchllm.attention import project_qkv_backward, project_qkv_forward
    H, Hkv, Dh = 6, 3, 4
    x, w = _gqa_inputs(rng, 7, H, Hkv, Dh, T=5)
    w = w._replace(wo=None)  # the projections use wq, wk, wv
    return [check(project_qkv_forward, project_qkv_backward, rng=rng, label="no rope", x=x,
                  w=w, spec=AttentionSpec(H, Hkv, head_dim=Dh, rope=None)),
            check(project_qkv_forward, project_qkv_backward, rng=rng, label="rope", x=x, w=w,
                  spec=AttentionSpec(H, Hkv, head_dim=Dh))]


@case
def gqa(rng):
    from scratchllm.attention import Rope, gqa_backward, gqa_forward, gqa_forward_ref
    from scratchllm.attention import rope_frequencies
    B, T, D, H, Hkv, Dh = 2, 7, 5, 6, 2, 4
    x, w = _gqa_inputs(rng, D, H, Hkv, Dh, B, T)
    inv_freq, _ = rope_frequencies(Dh)
    spec = AttentionSpec(H, Hkv, head_dim=Dh)  # RoPE "half", causal
    no_rope = AttentionSpec(H, Hkv, head_dim=Dh, rope=None)
    variants = {"no rope, causal": dict(spec=no_rope),
                "no rope, no mask": dict(spec=no_rope, mask=Mask(causal=False)),
                "rope half, causal": dict(spec=spec),
                "rope interleaved, sliding 3, af 1.2": dict(
                    spec=AttentionSpec(H, Hkv, head_dim=Dh, rope=RopeSpec(style="interleaved"),
                                       mask=Mask(window=3)),
                    rope=Rope(inv_freq, "interleaved", 1.2, np.arange(T))),
                "rope, sink(3, 1), (B,T) pos": dict(
                    spec=spec, mask=Mask(window=3, n_sink=1),
                    rope=Rope(inv_freq, "half", 1.0, rng.integers(0, 30, (B, T)))),
                "rope, block sparse(2, 1)": dict(spec=spec, mask=Mask(block=2, n_global=1)),
                "rope, chunks of 3 (Llama 4)": dict(spec=spec, mask=Mask(chunk=3)),
                "partial rope 0.5 (GPT-NeoX, Qwen3-Next)": dict(spec=AttentionSpec(
                    H, Hkv, head_dim=Dh, rope=RopeSpec(partial=0.5))),
                "no rope, query temperature (Llama 4)": dict(spec=AttentionSpec(
                    H, Hkv, head_dim=Dh, rope=None, position_bias=TemperatureSpec(0.5, 2)),
                    positions=rng.integers(0, 30, (B, T))),
                "MQA (Hkv=1), rope": dict(spec=AttentionSpec(H, 1, head_dim=Dh),
                                          w=w._replace(wk=w.wk[:, :Dh], wv=w.wv[:, :Dh]))}
    reports = [check(gqa_forward, gqa_backward, rng=rng, label=label, **{"x": x, "w": w, **kw})
               for label, kw in variants.items()]
    return reports + [check(gqa_forward_ref, gqa_backward, rng=rng, label="ref (repeat_kv)",
                            x=x, w=w, spec=spec)]


@case
def gqa_options(rng):
    """The attention options of published checkpoints: q/k/v and output biases (Qwen2,
    GPT-2), QK-norm gains (Qwen3; Gemma 3's offset gains; OLMo 2's over the whole
    projection; Llama 4's without gains), a softmax scale other than Dh^-1/2
    (Gemma 3), learned sink logits (gpt-oss)."""
    from scratchllm.attention import gqa_backward, gqa_forward
    B, T, D, H, Hkv, Dh = 2, 7, 5, 6, 2, 4
    x, w = _gqa_inputs(rng, D, H, Hkv, Dh, B, T)
    bias = w._replace(bq=rng.standard_normal(H * Dh), bk=rng.standard_normal(Hkv * Dh),
                      bv=rng.standard_normal(Hkv * Dh))
    norm = w._replace(q_norm=1 + 0.3 * rng.standard_normal(Dh),
                      k_norm=1 + 0.3 * rng.standard_normal(Dh))
    gpt_oss = bias._replace(bo=rng.standard_normal(D), sinks=rng.standard_normal(H))
    no_bk = ["x"] + [f"w.{n}" for n in ("wq", "wk", "wv", "wo", "bq", "bv", "bo")]
    return [check(gqa_forward, gqa_backward, rng=rng, label="qkv bias", x=x, w=bias,
                  spec=AttentionSpec(H, Hkv, head_dim=Dh, qkv_bias=True)),
            check(gqa_forward, gqa_backward, rng=rng, label="qk-norm, scale 0.3", x=x, w=norm,
                  spec=AttentionSpec(H, Hkv, head_dim=Dh, qk_norm=True, scale=0.3)),
            check(gqa_forward, gqa_backward, rng=rng, label="qk-norm, gains 1 + g (Gemma)",
                  x=x, w=norm._replace(q_norm=norm.q_norm - 1, k_norm=norm.k_norm - 1),
                  spec=AttentionSpec(H, Hkv, head_dim=Dh, qk_norm=True, norm_offset=1.0)),
            check(gqa_forward, gqa_backward, rng=rng, label="L2 qk-norm, no gains (Llama 4)",
                  x=x, w=w, spec=AttentionSpec(H, Hkv, head_dim=Dh, qk_norm="l2",
                                               rope=RopeSpec(style="interleaved"))),
            check(gqa_forward, gqa_backward, rng=rng, label="qk-norm over the projection (OLMo 2)",
                  x=x, w=w._replace(q_norm=1 + 0.3 * rng.standard_normal(H * Dh),
                                    k_norm=1 + 0.3 * rng.standard_normal(Hkv * Dh)),
                  spec=AttentionSpec(H, Hkv, head_dim=Dh, qk_norm="full")),
            check(gqa_forward, gqa_backward, rng=rng,
                  label="soft-capped scores, window 3 (Gemma 2)",
                  x=x, w=w, spec=AttentionSpec(H, Hkv, head_dim=Dh, scale=0.7, mask=Mask(
                      window=3), scores=ScoresSpec(softcap=0.8))),
            check(gqa_forward, gqa_backward, rng=rng, label="all biases but bk, no rope",
                  wrt=no_bk, x=x, w=gpt_oss._replace(sinks=None),
                  spec=AttentionSpec(H, Hkv, head_dim=Dh, qkv_bias=True, o_bias=True,
                                     rope=None)),  # without RoPE d/dbk = 0 (see lm_hub)
            check(gqa_forward, gqa_backward, rng=rng, label="gpt-oss: biases, sinks, window 3",
                  x=x, w=gpt_oss, spec=AttentionSpec(H, Hkv, head_dim=Dh, qkv_bias=True,
                                                     o_bias=True, sinks=True,
                                                     mask=Mask(window=3))),
            check(gqa_forward, gqa_backward, rng=rng, label="sinks through flash, causal",
                  x=x, w=w._replace(sinks=gpt_oss.sinks), spec=AttentionSpec(
                      H, Hkv, head_dim=Dh, sinks=True, scores=ScoresSpec("flash", 3)))]


def _mla_inputs(rng, D, H, dn, dr, dv, Dc, Dq):
    """The MLAWeights of both query forms, 0.4 x standard normals (gains 1 + U[0, 1))."""
    from scratchllm.attention import MLAWeights
    kv = dict(wkv_a=0.4 * rng.standard_normal((D, Dc + dr)), kv_norm=1 + rng.random(Dc),
              wkv_b=0.4 * rng.standard_normal((Dc, H * (dn + dv))),
              wo=0.4 * rng.standard_normal((H * dv, D)))
    wq = MLAWeights(**kv, wq=0.4 * rng.standard_normal((D, H * (dn + dr))))
    lora = MLAWeights(**kv, wq_a=0.4 * rng.standard_normal((D, Dq)), q_norm=1 + rng.random(Dq),
                      wq_b=0.4 * rng.standard_normal((Dq, H * (dn + dr))))
    return wq, lora


@case
def mla(rng):
    from scratchllm.attention import make_rope, mla_backward, mla_forward
    B, T, D, H, dn, dr, dv, Dc, Dq = 2, 5, 11, 3, 4, 6, 5, 7, 9  # distinct sizes
    w_wq, w_lora = _mla_inputs(rng, D, H, dn, dr, dv, Dc, Dq)
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2,
            "mscale": 1.0, "mscale_all_dim": 1.0}
    interleaved = RopeSpec(style="interleaved")
    yarn_spec = MLASpec(H, Dq, Dc, dn, dr, dv, rope=RopeSpec(scaling=yarn, style="half"))
    x = rng.standard_normal((B, T, D))
    return [check(mla_forward, mla_backward, rng=rng, label="wq, interleaved", x=x, w=w_wq,
                  spec=MLASpec(H, 0, Dc, dn, dr, dv, rope=interleaved)),
            check(mla_forward, mla_backward, rng=rng, label="wq_a/q_norm/wq_b", x=x, w=w_lora,
                  spec=MLASpec(H, Dq, Dc, dn, dr, dv, rope=interleaved)),
            check(mla_forward, mla_backward, rng=rng, label="half, yarn, (B,T) pos", x=x,
                  w=w_lora, spec=yarn_spec, rope=make_rope(yarn_spec.rope, dr, np.array(
                      [[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]]))),
            _mla_indexed(rng, x, w_lora, MLASpec(H, Dq, Dc, dn, dr, dv, rope=interleaved))]


def _mla_indexed(rng, x, w, spec):
    """mla with DeepSeek-V3.2's indexer (top 3 of T = 5 keys), its weights drawn until every
    choice is 1e-3 clear of a tie, so no finite-difference step changes one. The indexer's
    own weights get no gradient (a discrete choice), so wrt leaves them out."""
    import dataclasses
    from scratchllm.attention import lightning_indexer_forward, make_rope, mla_backward
    from scratchllm.attention import mla_forward
    from scratchllm.attention.dsa import indexer_project
    from scratchllm.specs import IndexerSpec
    spec = dataclasses.replace(spec, indexer=IndexerSpec(n_heads=2, head_dim=8, top_k=3))
    D, Dq = x.shape[2], spec.q_lora_rank
    rope = make_rope(spec.rope, spec.qk_rope_head_dim, np.arange(x.shape[1]))
    while True:
        w = w._replace(idx_wq=0.5 * rng.standard_normal((Dq, 16)),
                       idx_wk=0.5 * rng.standard_normal((D, 8)), idx_k_norm=1 + rng.random(8),
                       idx_k_norm_b=0.1 * rng.standard_normal(8),
                       idx_w=rng.standard_normal((D, 2)))
        scores = lightning_indexer_forward(*indexer_project(x, w, spec=spec, rope=rope))[0]
        rows = [np.sort(scores[:, t, :t + 1], axis=-1) for t in (3, 4)]  # 3 of 4, 5 keys
        gaps = [r[:, -3] - r[:, -4] for r in rows]
        if min(np.min(g) for g in gaps) > 1e-3:
            break
    wrt = ["x"] + [f"w.{n}" for n in ("wkv_a", "kv_norm", "wkv_b", "wo", "wq_a", "q_norm",
                                      "wq_b")]
    return check(mla_forward, mla_backward, rng=rng, label="indexer top 3 (DeepSeek-V3.2)",
                 wrt=wrt, x=x, w=w, spec=spec)


@case
def mla_project(rng):
    from scratchllm.attention import mla_project_backward, mla_project_forward
    B, T, D, H, dn, dr, dv, Dc, Dq = 2, 5, 11, 3, 4, 6, 5, 7, 9
    x = rng.standard_normal((B, T, D))
    _, w = _mla_inputs(rng, D, H, dn, dr, dv, Dc, Dq)
    return check(mla_project_forward, mla_project_backward, rng=rng, x=x,
                 w=w._replace(wkv_b=None, wo=None),  # the projections use neither
                 spec=MLASpec(H, Dq, Dc, dn, dr, dv, rope=RopeSpec(style="interleaved")))


@case
def nsa(rng):
    from scratchllm.attention import nsa_backward, nsa_forward
    B, H, Hkv, T, Dh = 2, 4, 2, 13, 5  # blocks of 3: four complete, one partial
    return check(nsa_forward, nsa_backward, rng=rng, q=rng.standard_normal((B, H, T, Dh)),
                 k=rng.standard_normal((B, Hkv, T, Dh)), v=rng.standard_normal((B, Hkv, T, Dh)),
                 phi=rng.standard_normal(3), gates=rng.standard_normal((B, H, T, 3)), block=3,
                 n_select=2, window=4)


def _compress_weights(rng, block, Dh, F):
    from scratchllm.attention import CompressWeights
    return CompressWeights(rng.standard_normal((block, Dh)), rng.normal(0, 0.5, (block * Dh, F)),
                           rng.standard_normal(F), rng.normal(0, 0.5, (F, Dh)),
                           rng.standard_normal(Dh))


@case
def nsa_compress(rng):
    """The MLP compressor on overlapping blocks (4 tokens at stride 2) and on adjacent ones."""
    from scratchllm.attention import nsa_compress_backward, nsa_compress_forward
    return [check(nsa_compress_forward, nsa_compress_backward, rng=rng, label=f"stride {d}",
                  x=rng.standard_normal((2, 2, 11, 3)), w=_compress_weights(rng, 4, 3, 5),
                  block=4, stride=d) for d in (2, 4)]


@case
def nsa_mlp(rng):
    from scratchllm.attention import NSAWeights, nsa_mlp_backward, nsa_mlp_forward
    from scratchllm.specs import NSASpec
    B, H, Hkv, T, Dh = 2, 4, 2, 13, 5  # blocks of 4 at stride 2: five compressed tokens
    w = NSAWeights(*_compress_weights(rng, 4, Dh, 6), *_compress_weights(rng, 4, Dh, 6))
    # w.k_b2 shifts every compressed key alike: q·b is constant along a softmax row, so its
    # gradient is exactly 0 (round-off on both sides; tests/attention/test_nsa_mlp.py)
    fields = [f"w.{f}" for f in NSAWeights._fields if f != "k_b2"]
    return check(nsa_mlp_forward, nsa_mlp_backward, rng=rng,
                 wrt=["q", "k", "v", "gates"] + fields,
                 q=rng.standard_normal((B, H, T, Dh)), k=rng.standard_normal((B, Hkv, T, Dh)),
                 v=rng.standard_normal((B, Hkv, T, Dh)), w=w,
                 gates=rng.standard_normal((B, H, T, 3)),
                 spec=NSASpec(block=4, stride=2, n_select=2, window=3))
