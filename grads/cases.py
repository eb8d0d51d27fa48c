"""One gradient-check case per component: how every backward in scratchllm is checked.

Each case draws float64 inputs at distinct odd sizes (so a wrong transpose cannot hide) from
the seeded `rng` it is given and returns one Report, or a list of Reports for variants.
Imports stay inside each case so that one broken module never hides the others.
Register a case with @case; `python -m grads NAME ...` runs some, `--list` names them.
"""
import numpy as np

from grads.check import check

CASES = {}


def case(fn):
    """Register fn under its name."""
    CASES[fn.__name__] = fn
    return fn


# ------------------------------------------------------------------- core (ops)
@case
def linear(rng):
    from scratchllm.core.ops import linear_backward, linear_forward
    x, W, b = rng.standard_normal((2, 5, 7)), rng.standard_normal((7, 3)), rng.standard_normal(3)
    return [check(linear_forward, linear_backward, rng=rng, label="bias", x=x, W=W, b=b),
            check(linear_forward, linear_backward, rng=rng, label="no bias", x=x, W=W)]


@case
def embedding(rng):
    from scratchllm.core.ops import embedding_backward, embedding_forward
    ids = np.array([[1, 4, 1], [6, 0, 4]])  # repeated ids must accumulate
    return check(embedding_forward, embedding_backward, rng=rng,
                 ids=ids, E=rng.standard_normal((7, 5)))


def _twins(name):
    """(label, forward, backward) of ops' readable pair and of its fused twin (core/fused.py)."""
    from scratchllm.core import fused, ops
    return [(label, getattr(mod, f"{pre}{name}_forward"), getattr(mod, f"{pre}{name}_backward"))
            for label, mod, pre in (("readable", ops, ""), ("fused", fused, "fused_"))]


@case
def rmsnorm(rng):
    x, g = rng.standard_normal((2, 5, 11)), rng.standard_normal(11)
    return [check(fwd, bwd, rng=rng, label=label, x=x, g=g, eps=1e-5)
            for label, fwd, bwd in _twins("rmsnorm")]


@case
def silu(rng):
    from scratchllm.core.ops import silu_backward, silu_forward
    return check(silu_forward, silu_backward, rng=rng, x=3 * rng.standard_normal((3, 7)))


@case
def sigmoid(rng):
    from scratchllm.core.ops import sigmoid_backward, sigmoid_forward
    return check(sigmoid_forward, sigmoid_backward, rng=rng, x=4 * rng.standard_normal((3, 7)))


@case
def softplus(rng):
    from scratchllm.core.ops import softplus_backward, softplus_forward
    return check(softplus_forward, softplus_backward, rng=rng, x=4 * rng.standard_normal((3, 7)))


@case
def swiglu(rng):
    D, F = 7, 9
    x, W2 = rng.standard_normal((2, 3, D)), rng.standard_normal((F, D))
    W1, W3 = rng.standard_normal((D, F)), rng.standard_normal((D, F))
    return [check(fwd, bwd, rng=rng, label=label, x=x, W1=W1, W3=W3, W2=W2)
            for label, fwd, bwd in _twins("swiglu")]


@case
def softmax(rng):
    from scratchllm.core.ops import softmax_backward, softmax_forward
    x = rng.standard_normal((3, 5, 7))
    x[0, 1, 2:5] = -np.inf  # partly masked rows are part of the contract
    return [check(softmax_forward, softmax_backward, rng=rng, label="last axis", x=x),
            check(softmax_forward, softmax_backward, rng=rng, label="axis=1",
                  x=rng.standard_normal((3, 5, 7)), axis=1)]


@case
def log_softmax(rng):
    from scratchllm.core.ops import log_softmax_backward, log_softmax_forward
    return check(log_softmax_forward, log_softmax_backward, rng=rng,
                 x=rng.standard_normal((3, 5, 7)))


@case
def cross_entropy(rng):
    targets = rng.integers(0, 11, size=(3, 5))
    targets[1, 2] = -100  # ignored position
    logits = rng.standard_normal((3, 5, 11))
    return [check(fwd, bwd, rng=rng, label=label, logits=logits, targets=targets)
            for label, fwd, bwd in _twins("cross_entropy")]


# ------------------------------------------------------------------- tokenizer: nothing to check

# ------------------------------------------------------------------- attention

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


# ------------------------------------------------------------------- mixture of experts
def _routing_inputs(rng, N, D, E, k, score="softmax", bias=False, margin=1e-3):
    """Draw x (N, D), w_router (D, E) [and a selection bias] until every token's top-k choice
    is at least `margin` from a tie, far above what a 1e-5 step can move: no flips in the check."""
    from scratchllm.moe import router_forward, topk_margin
    while True:
        x, w = rng.standard_normal((N, D)), rng.standard_normal((D, E))
        b = 0.05 * rng.standard_normal(E) if bias else None
        _, cache = router_forward(x, w, k=k, score=score, selection_bias=b)
        if topk_margin(cache.score_cache.y + (0 if b is None else b), k).min() > margin:
            return x, w, b


@case
def router(rng):
    from scratchllm.moe import router_backward, router_forward
    reports = []
    for score, bias in (("softmax", False), ("sigmoid", True)):
        x, w, b = _routing_inputs(rng, 7, 6, 5, 2, score, bias)
        reports.append(check(router_forward, router_backward, rng=rng, wrt=["x", "w_router"],
                             label=score + (" + bias" if bias else ""), x=x, w_router=w, k=2,
                             score=score, selection_bias=b))
    return reports


ROUTINGS = {  # router options of real checkpoints: score, selection bias?, logit bias?, options
    "gpt-oss: logit bias, softmax over the chosen k (+ clamped experts in moe)": (
        "softmax", False, True, {}),
    "deepseek-v3: sigmoid + bias, groups 4 -> 2, r = 2.5": (
        "sigmoid", True, False, dict(n_group=4, topk_group=2, routed_scaling_factor=2.5)),
    "deepseek-v2: softmax, groups 2 -> 1, not normalised": (
        "softmax", False, False, dict(n_group=2, topk_group=1, norm_topk_prob=False)),
}


def _routed_inputs(rng, N, D, E, k, score, bias, logit_bias, options, margin=1e-3):
    """x, w_router (b_router, selection_bias) drawn until every row's choice (groups and
    top-k) is at least `margin` from a tie: no finite-difference step flips a decision."""
    from scratchllm.moe import router_forward, selection_margin
    while True:
        x, w = rng.standard_normal((N, D)), rng.standard_normal((D, E))
        b_r = rng.standard_normal(E) if logit_bias else None
        b = 0.05 * rng.standard_normal(E) if bias else None
        _, cache = router_forward(x, w, b_r, k=k, score=score, selection_bias=b, **options)
        sel = cache.score_cache.y + (0 if b is None else b)
        if selection_margin(sel, k, options.get("n_group", 1),
                            options.get("topk_group", 1)).min() > margin:
            return dict(x=x, w_router=w, b_router=b_r, score=score, selection_bias=b, **options)


@case
def router_routing(rng):
    from scratchllm.moe import router_backward, router_forward
    return [check(router_forward, router_backward, rng=rng, label=label, k=3,
                  wrt=["x", "w_router"] + ["b_router"] * logit_bias,
                  **_routed_inputs(rng, 7, 6, 8, 3, score, bias, logit_bias, options))
            for label, (score, bias, logit_bias, options) in ROUTINGS.items()]


@case
def normalise(rng):
    from scratchllm.moe import normalise_backward, normalise_forward
    return check(normalise_forward, normalise_backward, rng=rng, u=rng.uniform(0.1, 2, (5, 4)))


@case
def experts(rng):
    from scratchllm.moe import experts_backward, experts_forward
    M, D, E, F = 9, 6, 4, 5  # expert 2 gets no rows
    return check(experts_forward, experts_backward, rng=rng, xs=rng.standard_normal((M, D)),
                 bounds=np.array([0, 3, 7, 7, 9]), w1=rng.standard_normal((E, D, F)),
                 w3=rng.standard_normal((E, D, F)), w2=rng.standard_normal((E, F, D)))


def _far_from_clamps(h, limit, margin=1e-3):
    """Whether every gate (even column) and up (odd column) pre-activation of h lies >= margin
    from its clamp boundary (gate = limit, up = +-limit), with some on each side of them."""
    gate, up = h[..., 0::2], np.abs(h[..., 1::2])
    return bool(min(np.abs(gate - limit).min(), np.abs(up - limit).min()) > margin
                and (gate > limit).any() and (up > limit).any() and (up < limit).any())


@case
def clamped_swiglu(rng):
    from scratchllm.moe import clamped_swiglu_backward, clamped_swiglu_forward
    D, F, limit = 6, 5, 1.5  # a small limit, so that both clamps bind somewhere
    while True:
        x, gu, b = (rng.standard_normal((2, 3, D)), rng.standard_normal((D, 2 * F)),
                    rng.standard_normal(2 * F))
        if _far_from_clamps(x @ gu + b, limit):
            break
    return check(clamped_swiglu_forward, clamped_swiglu_backward, rng=rng, x=x, gate_up=gu,
                 gate_up_b=b, down=rng.standard_normal((F, D)), down_b=rng.standard_normal(D),
                 alpha=1.702, limit=limit)


@case
def clamped_experts(rng):
    from scratchllm.moe import clamped_experts_backward, clamped_experts_forward
    M, D, E, F, limit = 9, 6, 4, 5, 2.0
    bounds = np.array([0, 3, 7, 7, 9])  # expert 2 gets no rows
    while True:
        x, gu, b = (rng.standard_normal((M, D)), rng.standard_normal((E, D, 2 * F)),
                    rng.standard_normal((E, 2 * F)))
        h = np.concatenate([x[bounds[i]:bounds[i + 1]] @ gu[i] + b[i] for i in range(E)])
        if _far_from_clamps(h, limit):
            break
    return check(clamped_experts_forward, clamped_experts_backward, rng=rng, xs=x,
                 bounds=bounds, gate_up=gu, gate_up_b=b, down=rng.standard_normal((E, F, D)),
                 down_b=rng.standard_normal((E, D)), alpha=1.702, limit=limit)


@case
def balance_loss(rng):
    from scratchllm.moe import balance_loss_backward, balance_loss_forward
    from scratchllm.core.ops import softmax_forward
    probs = softmax_forward(rng.standard_normal((9, 5)))[0]
    topk_idx = np.argsort(-probs, axis=-1)[:, :2]
    return check(balance_loss_forward, balance_loss_backward, rng=rng,
                 probs=probs, topk_idx=topk_idx)


@case
def z_loss(rng):
    from scratchllm.moe import z_loss_backward, z_loss_forward
    return check(z_loss_forward, z_loss_backward, rng=rng, logits=3 * rng.standard_normal((9, 5)))


@case
def moe(rng):
    from scratchllm.moe import moe_backward, moe_forward
    N, D, E, F, Fs, k = 11, 6, 4, 5, 3, 2
    reports = []
    variants = (("softmax", False, 0.75), ("sigmoid", True, 1.0), ("softmax", True, None))
    for score, bias, c in variants:
        x, w, b = _routing_inputs(rng, N, D, E, k, score, bias)
        experts = dict(w1=rng.standard_normal((E, D, F)), w3=rng.standard_normal((E, D, F)),
                       w2=rng.standard_normal((E, F, D)))
        shared = dict(shared_w1=rng.standard_normal((D, Fs)), shared_w3=rng.standard_normal(
            (D, Fs)), shared_w2=rng.standard_normal((Fs, D))) if c is not None else {}
        label = f"{score}{' + bias' if bias else ''}, capacity {c}{', shared' if shared else ''}"
        reports.append(check(moe_forward, moe_backward, rng=rng, label=label,
                             wrt=["x", "w_router", *experts, *shared],
                             x=x, w_router=w, k=k, capacity_factor=c, score=score,
                             selection_bias=b, **experts, **shared))
    return reports


def _gpt_oss_experts(rng, x, E, F, limit):
    """gpt-oss expert weights (E, D, 2F), (E, 2F), (E, F, D), (E, D) whose gate/up
    pre-activations on every row of x lie away from the clamps (_far_from_clamps)."""
    D = x.shape[-1]
    while True:
        gu, b = rng.standard_normal((E, D, 2 * F)), rng.standard_normal((E, 2 * F))
        if all(_far_from_clamps(x @ gu[i] + b[i], limit) for i in range(E)):
            return dict(gate_up=gu, gate_up_b=b, down=rng.standard_normal((E, F, D)),
                        down_b=rng.standard_normal((E, D)))


@case
def moe_routing(rng):
    from scratchllm.moe import moe_backward, moe_forward
    N, D, E, F, Fs, k = 11, 6, 8, 5, 3, 3
    reports = []
    for label, (score, bias, logit_bias, options) in ROUTINGS.items():
        inputs = _routed_inputs(rng, N, D, E, k, score, bias, logit_bias, options)
        experts = dict(w1=rng.standard_normal((E, D, F)), w3=rng.standard_normal((E, D, F)),
                       w2=rng.standard_normal((E, F, D)))
        if logit_bias:  # gpt-oss: its clamped experts too, every pre-activation off the clamps
            experts = _gpt_oss_experts(rng, inputs["x"], E, F, limit=2.5)
            inputs.update(swiglu_limit=2.5)
        shared = dict(shared_w1=rng.standard_normal((D, Fs)), shared_w3=rng.standard_normal(
            (D, Fs)), shared_w2=rng.standard_normal((Fs, D)))
        reports.append(check(moe_forward, moe_backward, rng=rng, label=label, k=k,
                             max_full=100, wrt=["x", "w_router", *["b_router"] * logit_bias,
                                                *experts, *shared],
                             **inputs, **experts, **shared))
    return reports


@case
def expert_choice(rng):
    from scratchllm.moe import expert_choice_backward, expert_choice_forward
    from scratchllm.moe import topk_margin
    from scratchllm.core.ops import softmax_forward
    N, D, E, F = 9, 6, 4, 5
    while True:  # each expert's top-C token choice far from a tie (C = ceil(2 * 9 / 4) = 5)
        x, w = rng.standard_normal((N, D)), rng.standard_normal((D, E))
        if topk_margin(softmax_forward(x @ w)[0].T, 5).min() > 1e-3:
            break
    return check(expert_choice_forward, expert_choice_backward, rng=rng, x=x, w_router=w,
                 w1=rng.standard_normal((E, D, F)), w3=rng.standard_normal((E, D, F)),
                 w2=rng.standard_normal((E, F, D)), capacity_factor=2.0)


# ------------------------------------------------------------------- state-space models
@case
def zoh(rng):
    from scratchllm.ssm import zoh_backward, zoh_forward
    near_zero = np.array([[0.0, 1e-12, -1e-7, 3e-3, -0.05],    # A = 0 and the series region
                          [0.1001, -0.0999, -3.0, -40.0, 2.0]])  # both sides of |ΔA| = 0.1
    return [check(zoh_forward, zoh_backward, rng=rng, label="A near 0", A=near_zero,
                  B=rng.standard_normal((2, 5)), delta=np.array([1.0, 1.0])),
            check(zoh_forward, zoh_backward, rng=rng, label="S4D-like",
                  A=-rng.uniform(0.5, 9, (3, 7)), B=rng.standard_normal((3, 7)),
                  delta=rng.uniform(1e-3, 0.5, 3))]


@case
def ssm_kernel(rng):
    from scratchllm.ssm import ssm_kernel_backward, ssm_kernel_forward
    from scratchllm.ssm import ssm_kernel_forward_ref
    inputs = dict(L=11, A_bar=rng.uniform(-0.95, 0.95, (3, 5)),  # odd L, |A_bar| < 1
                  B_bar=rng.standard_normal((3, 5)), C=rng.standard_normal((3, 5)))
    return [check(ssm_kernel_forward, ssm_kernel_backward, rng=rng, label="blocked", **inputs),
            check(ssm_kernel_forward_ref, ssm_kernel_backward, rng=rng, label="dense ref",
                  **inputs)]


@case
def fft_conv(rng):
    from scratchllm.ssm import (fft_conv_backward, fft_conv_backward_ref, fft_conv_forward,
                                fft_conv_forward_ref)
    shared = dict(x=rng.standard_normal((2, 3, 7)), K=rng.standard_normal((3, 7)))
    same = dict(x=rng.standard_normal((3, 13)), K=rng.standard_normal((3, 13)))
    return [check(fft_conv_forward, fft_conv_backward, rng=rng, label="K shared over batch",
                  **shared),
            check(fft_conv_forward, fft_conv_backward, rng=rng, label="T = 13, same shapes",
                  **same),
            check(fft_conv_forward_ref, fft_conv_backward_ref, rng=rng,
                  label="direct ref, K shared", **shared)]


@case
def s4d(rng):
    from scratchllm.ssm import s4d_backward, s4d_forward
    width, N = 3, 5
    return check(s4d_forward, s4d_backward, rng=rng, x=rng.standard_normal((2, 7, width)),
                 A_log=rng.normal(0, 0.7, (width, N)), B=rng.standard_normal((width, N)),
                 C=rng.standard_normal((width, N)), log_dt=rng.uniform(-4, 0, width),
                 D=rng.standard_normal(width))


@case
def s4d_complex(rng):
    from scratchllm.ssm import s4d_complex_backward, s4d_complex_forward, s4d_init
    width, N = 3, 5
    reports = []
    for init in ("lin", "inv"):  # the init's values, then perturbed off the special points
        p = {k: v + rng.normal(0, 0.1, v.shape) for k, v in
             s4d_init(width, N, init, rng=rng).items()}
        p["log_dt"] = rng.uniform(-3, -1, width)
        reports.append(check(s4d_complex_forward, s4d_complex_backward, rng=rng,
                             label=f"S4D-{init.capitalize()}",
                             x=rng.standard_normal((2, 7, width)), **p))
    return reports


@case
def selective_scan(rng):
    from scratchllm.ssm import (selective_scan_backward, selective_scan_backward_ref,
                                selective_scan_forward, selective_scan_forward_ref)
    batch, T, d, N = 2, 7, 5, 3  # Δ > 0 as after softplus; A < 0 as -exp(A_log)
    inputs = dict(x=rng.standard_normal((batch, T, d)), delta=rng.uniform(0.05, 1.0, (batch, T, d)),
                  A=-rng.uniform(0.2, 2.0, (d, N)), B=rng.standard_normal((batch, T, N)),
                  C=rng.standard_normal((batch, T, N)), D=rng.standard_normal(d))
    return [check(selective_scan_forward, selective_scan_backward, rng=rng, label="numba",
                  **inputs),
            check(selective_scan_forward_ref, selective_scan_backward_ref, rng=rng, label="ref",
                  **inputs)]


@case
def ssd(rng):
    from scratchllm.ssm import ssd_backward, ssd_forward
    batch, T, H, Dh, G, N = 2, 7, 4, 3, 2, 5  # Δ > 0 as after softplus; A < 0
    return [check(ssd_forward, ssd_backward, rng=rng, label=form, form=form, chunk=3,
                  x=rng.standard_normal((batch, T, H, Dh)),
                  dt=rng.uniform(0.05, 1.0, (batch, T, H)), A=-rng.uniform(0.2, 2.0, H),
                  B=rng.standard_normal((batch, T, G, N)), C=rng.standard_normal((batch, T, G, N)),
                  D=rng.standard_normal(H))
            for form in ("parallel", "chunked", "recurrent")]


@case
def mamba(rng):
    from scratchllm.ssm import (causal_conv1d_backward, causal_conv1d_forward, mamba_backward,
                                mamba_forward)
    batch, T, width, Di, N, R, K = 2, 7, 5, 9, 3, 2, 4
    block = check(mamba_forward, mamba_backward, rng=rng, label="block",
                  x=rng.standard_normal((batch, T, width)), W_in=rng.normal(0, 0.5, (width, 2 * Di)),
                  conv_w=rng.normal(0, 0.5, (Di, K)), conv_b=rng.normal(0, 0.1, Di),
                  W_x=rng.normal(0, 0.5, (Di, R + 2 * N)), W_dt=rng.normal(0, 0.5, (R, Di)),
                  b_dt=rng.normal(-1, 0.5, Di), A_log=rng.normal(0, 0.5, (Di, N)),
                  D=rng.standard_normal(Di), W_out=rng.normal(0, 0.5, (Di, width)))
    conv = check(causal_conv1d_forward, causal_conv1d_backward, rng=rng, label="causal conv1d",
                 x=rng.standard_normal((batch, T, 3)), w=rng.standard_normal((3, K)),
                 b=rng.standard_normal(3))
    return [block, conv]


# ------------------------------------------------------------------- linear-attention family
def _qkv(rng, B=2, H=2, T=7, Dk=3, Dv=5):
    return dict(q=rng.standard_normal((B, H, T, Dk)), k=rng.standard_normal((B, H, T, Dk)),
                v=rng.standard_normal((B, H, T, Dv)))


@case
def linear_attention(rng):
    from scratchllm.linear_attention import linear_attention_backward, linear_attention_forward
    return [check(linear_attention_forward, linear_attention_backward, rng=rng,
                  label=f"{form}, elu, normalised", form=form, chunk=3, **_qkv(rng))
            for form in ("parallel", "chunked", "recurrent")] + [
        check(linear_attention_forward, linear_attention_backward, rng=rng,
              label="chunked, identity, unnormalised", feature="identity", normalize=False,
              chunk=3, **_qkv(rng))]


@case
def retnet_attention(rng):
    from scratchllm.linear_attention import retnet_attention_backward, retnet_attention_forward
    return [check(retnet_attention_forward, retnet_attention_backward, rng=rng, label=form,
                  form=form, chunk=3, gamma=np.array([0.6, 0.9]), **_qkv(rng))
            for form in ("parallel", "chunked", "recurrent")]


@case
def gla_attention(rng):
    from scratchllm.linear_attention import gla_attention_backward, gla_attention_forward
    return [check(gla_attention_forward, gla_attention_backward, rng=rng,
                  label=f"{form}, gate per {'channel' if len(shape) == 4 else 'head'}",
                  form=form, chunk=3, g=np.log(rng.uniform(0.3, 1.0, shape)), **_qkv(rng))
            for form in ("parallel", "chunked", "recurrent") for shape in ((2, 2, 7, 3), (2, 2, 7))]


@case
def gla_scores(rng):
    from scratchllm.linear_attention import gla_scores as gs
    shape = (2, 3, 5, 4)  # (B, n, C, Dk)
    return [check(fwd, bwd, rng=rng, label=label, q=rng.standard_normal(shape),
                  k=rng.standard_normal(shape),
                  b=np.cumsum(np.log(rng.uniform(0.3, 1.0, shape)), axis=-2))
            for fwd, bwd, label in ((gs.gla_scores_forward, gs.gla_scores_backward, "numba"),
                                    (gs.gla_scores_forward_ref, gs.gla_scores_backward_ref,
                                     "ref"))]


@case
def delta_rule(rng):
    from scratchllm.linear_attention import delta_rule_backward, delta_rule_forward
    reports = []
    for gated in (False, True):
        for form in ("parallel", "chunked", "recurrent"):
            qkv = _qkv(rng)
            qkv["k"] /= np.linalg.norm(qkv["k"], axis=-1, keepdims=True)  # as DeltaNet
            g = np.log(rng.uniform(0.3, 1.0, (2, 2, 7))) if gated else None
            reports.append(check(delta_rule_forward, delta_rule_backward, rng=rng,
                                 label=f"{form}, {'gated' if gated else 'DeltaNet'}",
                                 form=form, chunk=3, beta=rng.uniform(0.1, 0.9, (2, 2, 7)),
                                 g=g, **qkv))
    return reports


@case
def rwkv4(rng):
    from scratchllm.linear_attention import (rwkv4_channel_mix_backward,
                                             rwkv4_channel_mix_forward, rwkv4_time_mix_backward,
                                             rwkv4_time_mix_forward, rwkv4_wkv_backward,
                                             rwkv4_wkv_forward)
    from scratchllm.linear_attention import rwkv_scan as sc
    batch, T, D, F = 2, 7, 5, 9
    W = {n: rng.normal(0, 0.5, (D, D)) for n in ("Wk", "Wv", "Wr", "Wo")}
    mix = {n: rng.uniform(0, 1, D) for n in ("mix_k", "mix_v", "mix_r")}
    wkv = [(rwkv4_wkv_forward, rwkv4_wkv_backward, "parallel", dict(form="parallel")),
           (rwkv4_wkv_forward, rwkv4_wkv_backward, "recurrent", {}),
           (sc.rwkv4_wkv_scan_forward, sc.rwkv4_wkv_scan_backward, "scan (numba)", {}),
           (sc.rwkv4_wkv_scan_forward_ref, sc.rwkv4_wkv_scan_backward_ref, "scan (ref)", {})]
    return [check(fwd, bwd, rng=rng, label=f"wkv, {label}", w=rng.uniform(0.1, 2.0, D),
                  u=rng.standard_normal(D), k=rng.standard_normal((batch, T, D)),
                  v=rng.standard_normal((batch, T, D)), **opts)
            for fwd, bwd, label, opts in wkv] + [
            check(rwkv4_time_mix_forward, rwkv4_time_mix_backward, rng=rng, label="time-mix",
                  x=rng.standard_normal((batch, T, D)), time_decay=rng.normal(-1, 0.5, D),
                  time_first=rng.standard_normal(D), **mix, **W),
            check(rwkv4_channel_mix_forward, rwkv4_channel_mix_backward, rng=rng,
                  label="channel-mix", x=rng.standard_normal((batch, T, D)),
                  mix_k=mix["mix_k"], mix_r=mix["mix_r"], Wk=rng.normal(0, 0.5, (D, F)),
                  Wr=W["Wr"], Wv=rng.normal(0, 0.5, (F, D)))]


@case
def recurrent_mixer(rng):
    from scratchllm.linear_attention import recurrent_mixer_backward, recurrent_mixer_forward
    D, H = 6, 2
    reports = []
    for kind, wa in (("linear", None), ("retnet", None), ("gla", D), ("delta", H)):
        W = {n: rng.normal(0, 0.5, (D, D)) for n in ("Wq", "Wk", "Wv", "Wo")}
        if wa:
            W["Wa"] = rng.normal(0, 0.5, (D, wa))
        reports.append(check(recurrent_mixer_forward, recurrent_mixer_backward, rng=rng,
                             label=kind, kind=kind, n_heads=H, chunk=3,
                             x=rng.standard_normal((2, 7, D)), **W))
    return reports


@case
def mamba2(rng):
    from scratchllm.ssm import mamba2_backward, mamba2_forward
    D, Di, H, N, K = 5, 8, 2, 3, 3
    shapes = dict(Wz=(D, Di), Wx=(D, Di), WB=(D, N), WC=(D, N), Wdt=(D, H),
                  conv_w=(Di + 2 * N, K), conv_b=(Di + 2 * N,))
    W = {n: rng.normal(0, 0.5, s) for n, s in shapes.items()}
    return check(mamba2_forward, mamba2_backward, rng=rng, x=rng.standard_normal((2, 7, D)),
                 dt_bias=rng.normal(-1, 0.5, H), A_log=rng.normal(0, 0.5, H),
                 D=rng.standard_normal(H), norm=1 + rng.random(Di),
                 Wout=rng.normal(0, 0.5, (Di, D)), chunk=3, **W)


@case
def mamba_inner_norms(rng):
    from scratchllm.ssm import mamba_backward, mamba_forward
    batch, T, width, Di, N, R, K = 2, 7, 5, 9, 3, 2, 4  # Jamba: rmsnorm on dt_low, B, C
    return check(mamba_forward, mamba_backward, rng=rng, label="jamba inner norms",
                 max_full=30, x=rng.standard_normal((batch, T, width)),
                 W_in=rng.normal(0, 0.5, (width, 2 * Di)), conv_w=rng.normal(0, 0.5, (Di, K)),
                 conv_b=rng.normal(0, 0.1, Di), W_x=rng.normal(0, 0.5, (Di, R + 2 * N)),
                 W_dt=rng.normal(0, 0.5, (R, Di)), b_dt=rng.normal(-1, 0.5, Di),
                 A_log=rng.normal(0, 0.5, (Di, N)), D=rng.standard_normal(Di),
                 W_out=rng.normal(0, 0.5, (Di, width)), dt_norm=1 + 0.3 * rng.standard_normal(R),
                 B_norm=1 + 0.3 * rng.standard_normal(N), C_norm=1 + 0.3 * rng.standard_normal(N),
                 norm_eps=1e-6)


# ------------------------------------------------------------------- language models
LM_TINY = dict(vocab_size=23, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=12,
               n_experts=4, kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=4,
               v_head_dim=6, d_state=4, expand=2)
LM_TINY_EXTRA = {"swa": dict(window=3, n_sink=1), "hybrid": dict(layer_pattern="MA")}


def lm_tiny(name, **overrides):
    """A model preset shrunk to LM_TINY sizes (tests share it)."""
    from scratchllm.lm import preset
    return preset(name, **{**LM_TINY, **LM_TINY_EXTRA.get(name, {}), **overrides})


def _lm(name, rng, label=None, **overrides):
    """d loss / d every Param of a whole tiny model (CE + weighted MoE aux terms), along 2
    random directions per Param, float64.
    Mamba layers: at init the step-size path (W_x, W_dt, b_dt, A_log) moves the loss by only
    ~1e-5 per unit step, so round-off swamps h = 1e-5 there. The check point takes b_dt + 2
    (Δ ~ 2) and W_out x 4, and that path is checked in a second report at h = 3e-4."""
    from scratchllm.lm import LM, loss_pair
    model = LM(lm_tiny(name, **overrides), rng=rng, dtype=np.float64)
    forward, backward, params = loss_pair(model)
    for n in params:
        if n.endswith(".W_out"):
            params[n] = 4.0 * params[n]
        if n.endswith(".b_dt"):
            params[n] = params[n] + 2.0
    V = model.cfg.vocab_size
    data = dict(ids=rng.integers(0, V, (2, 7)), targets=rng.integers(0, V, (2, 7)), **params)
    slow = [n for n in params if n.rsplit(".", 1)[-1] in ("W_x", "W_dt", "b_dt", "A_log")]
    fast = [n for n in params if n not in slow]
    reports = [check(forward, backward, rng=rng, max_full=0, n_directions=2, wrt=fast,
                     label=label or name, **data)]
    if slow:
        reports.append(check(forward, backward, rng=rng, max_full=0, n_directions=2,
                             wrt=slow, fd_step=3e-4,
                             label=f"{label or name}, mamba dt path, h=3e-4",
                             **data))
    return reports


@case
def lm_dense(rng):
    return _lm("dense", rng) + _lm("dense", rng, "dense, tied", tie_embeddings=True)


@case
def lm_moe(rng):
    return _lm("moe", rng)


@case
def lm_mla(rng):
    return _lm("mla", rng)


@case
def lm_swa(rng):
    return _lm("swa", rng)


@case
def lm_hybrid(rng):
    return _lm("hybrid", rng)


@case
def lm_positions(rng):
    """Issue 14's attention options, whole model: ALiBi with flash attention on a sliding
    window with sinks, sinusoidal positions, NoPE."""
    return (_lm("swa", rng, "swa, alibi, flash", positions="alibi", attn_impl="flash")
            + _lm("dense", rng, "dense, sinusoidal", positions="sinusoidal")
            + _lm("dense", rng, "dense, nope", positions="nope"))


def _module_loss_pair(model, *data):
    """model.loss(*data) as a pair over the model's Params (as lm.loss_pair does for the LM)."""
    params = dict(model.named_parameters())

    def forward(**arrays):
        for name, p in params.items():
            p.data = arrays[name]
        return model.loss(*data)

    def backward(dloss, cache):
        model.zero_grad()
        model.loss_backward(float(dloss), cache)
        return {name: p.grad.copy() for name, p in params.items()}

    return forward, backward, {name: p.data for name, p in params.items()}


@case
def lm_encoders(rng):
    """Whole encoder models (issue 14), every Param: the masked LM (BERT masking) and the
    encoder-decoder (teacher-forced), float64."""
    from scratchllm.attention import EncoderDecoder, MaskedLM, mlm_corrupt
    V, D, L, H, F = 13, 8, 2, 2, 10
    mlm = MaskedLM(V, D, L, H, F, rng=rng, dtype=np.float64)
    ids = rng.integers(1, V, (2, 7))
    inputs, targets = mlm_corrupt(ids, rng, mask_id=0, vocab_size=V, rate=0.5)
    targets[0, 0] = ids[0, 0]  # at least one counted position
    s2s = EncoderDecoder(V, D, L, H, F, rng=rng, dtype=np.float64)
    src, tgt = rng.integers(0, V, (2, 5)), rng.integers(0, V, (2, 6))
    reports = []
    for label, model, data in (("masked LM", mlm, (inputs, targets)),
                               ("encoder-decoder", s2s, (src, tgt[:, :-1], tgt[:, 1:]))):
        forward, backward, params = _module_loss_pair(model, *data)
        reports.append(check(forward, backward, rng=rng, max_full=0, n_directions=2,
                             label=label, **params))
    return reports


# ------------------------------------------------------------------- published checkpoints
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


HF_FIXTURES = ("llama", "llama_yarn", "llama_linear", "llama_dynamic", "mistral", "qwen2",
               "qwen3", "gemma3", "gpt2",
               "mamba", "jamba")  # tools/make_hf_fixtures_ssm.py
HF_FIXTURES += ("mixtral", "deepseek_v3", "deepseek_v3_plain")  # tools/make_hf_fixtures_moe.py


@case
def lm_hub(rng):
    """d loss / d every Param of each tiny Hugging Face checkpoint of tests/fixtures/hf,
    loaded in float64 (2 random directions per Param, from a seed of its own)."""
    from pathlib import Path
    from scratchllm.hub import load_pretrained
    from scratchllm.lm import loss_pair
    import zlib
    root = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf"
    reports = []
    for family in HF_FIXTURES:
        model = load_pretrained(root / family, dtype=np.float64)
        forward, backward, params = loss_pair(model)
        # Without RoPE (GPT-2) a key bias adds q . bk to every score of a query's row, which
        # softmax ignores: d loss / d bk = 0 exactly, so there is nothing to compare.
        wrt = [n for n in params if not (n.endswith(".bk") and model.cfg.positions != "rope")]
        # Mamba layers: the dt path (A_log, b_dt, ...) moves the loss little, so at h = 1e-5
        # round-off reaches ~1e-7 of those gradients, and at 1e-4 the curvature of Jamba's
        # attention does; h = 3e-5 keeps both below.
        # Each family draws its ids and directions from its own seed, so adding a fixture
        # does not change the others' checks. Jamba's W_dt (under the inner dt RMSNorm) is the
        # worst conditioned: over 6 seeds 2 directions reach a kink at 1.6e-7 to 8.6e-7, while
        # its gradient equals torch autograd to 2e-14 (tests/hub/test_ssm_families.py).
        h = 3e-5 if "M" in model.cfg.layer_kinds() else 1e-5
        fam_rng = np.random.default_rng(zlib.crc32(family.encode()))
        reports.append(check(forward, backward, rng=fam_rng, max_full=0, n_directions=2, wrt=wrt,
                             label=family, fd_step=h, **_hub_ids(model, fam_rng), **params))
    return reports


def _hub_ids(model, rng, margin=1e-3):
    """ids, targets (2, 7); with MoE layers, drawn again until every router's top-k choice is
    at least `margin` from a tie (no finite-difference step flips it)."""
    from scratchllm.moe import selection_margin
    V = model.cfg.vocab_size
    while True:
        data = dict(ids=rng.integers(0, V, (2, 7)), targets=rng.integers(0, V, (2, 7)))
        moe = [layer.ffn for layer in model.layers if layer.moe]
        if not moe:
            return data
        blocks = model.forward(data["ids"])[1].blocks
        routers = [c.ffn.router for c, layer in zip(blocks, model.layers) if layer.moe]
        if all(selection_margin(r.score_cache.y + f.selection_bias, f.k, f.routing["n_group"],
                                f.routing["topk_group"]).min() > margin
               for r, f in zip(routers, moe)):
            return data


@case
def hub_gpt_oss(rng):
    """d loss / d every Param of the tiny gpt-oss checkpoint (tests/fixtures/hf/gpt_oss) in
    float64, on the fixture's ids, whose routing is at least 1e-3 from a top-k tie."""
    from pathlib import Path
    from scratchllm.hub import load_pretrained
    from scratchllm.lm import loss_pair
    d = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "hf" / "gpt_oss"
    model = load_pretrained(d, dtype=np.float64)
    forward, backward, params = loss_pair(model)
    ids = np.load(d / "expected.npz")["ids"]  # (B, T)
    return check(forward, backward, rng=rng, max_full=0, n_directions=2, label="gpt_oss",
                 ids=ids, targets=np.roll(ids, -1, axis=1), **params)


@case
def lm_recurrent(rng):
    """The recurrent mixers inside a whole model: L R G D, then S (Mamba-2) and W (RWKV-4)
    between attention layers."""
    return (_lm("dense", rng, "LRGD", layer_pattern="LRGD", n_layers=4)
            + _lm("dense", rng, "SAWA", layer_pattern="SAWA", n_layers=4))

# Config options of released checkpoints, on tiny models: HF Mamba-1 (mixer-only blocks),
# Jamba's inner Mamba norms (dt rank 3: an RMSNorm over a single number is only its sign),
# DeepSeek-V3 group-limited routing with scaling plus gpt-oss's router logit bias.
LM_CHECKPOINTS = {
    "mamba1": ("hybrid", dict(ffn="none", layer_pattern="MM")),
    "jamba": ("hybrid", dict(mamba_inner_norms=True, dt_rank=3)),
    "routing": ("mla", dict(n_group=2, topk_group=1, routed_scaling_factor=2.5,
                            router_bias=True)),
}


@case
def lm_checkpoint_options(rng):
    return [report for label, (name, overrides) in LM_CHECKPOINTS.items()
            for report in _lm(name, rng, label, **overrides)]


@case
def layernorm(rng):
    from scratchllm.core import layernorm_backward, layernorm_forward
    x = rng.standard_normal((2, 5, 11))
    return [check(layernorm_forward, layernorm_backward, rng=rng, label="bias", x=x,
                  g=rng.standard_normal(11), b=rng.standard_normal(11), eps=1e-5),
            check(layernorm_forward, layernorm_backward, rng=rng, label="no bias", x=x,
                  g=rng.standard_normal(11), eps=1e-5)]


@case
def gelu(rng):
    from scratchllm.core import gelu_backward, gelu_forward
    x = 3 * rng.standard_normal((3, 7))
    return [check(gelu_forward, gelu_backward, rng=rng, label=a, x=x, approximate=a)
            for a in ("tanh", "none")]


@case
def gelu_mlp(rng):
    from scratchllm.core import gelu_mlp_backward, gelu_mlp_forward
    D, F = 7, 9
    return check(gelu_mlp_forward, gelu_mlp_backward, rng=rng, x=rng.standard_normal((2, 3, D)),
                 W1=rng.standard_normal((D, F)), b1=rng.standard_normal(F),
                 W2=rng.standard_normal((F, D)), b2=rng.standard_normal(D))


@case
def geglu(rng):
    from scratchllm.core import geglu_backward, geglu_forward
    D, F = 7, 9
    return check(geglu_forward, geglu_backward, rng=rng, x=rng.standard_normal((2, 3, D)),
                 W1=rng.standard_normal((D, F)), W3=rng.standard_normal((D, F)),
                 W2=rng.standard_normal((F, D)))


@case
def lm_post(rng):
    """The post-norm block (block="post") and the sandwich block in a whole tiny model."""
    return (_lm("dense", rng, "dense, post-norm", block="post")
            + _lm("dense", rng, "dense, sandwich", block="sandwich", norm_offset=1.0))
