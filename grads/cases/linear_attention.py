"""Gradient-check cases of scratchllm.linear_attention: linear attention, RetNet, GLA,
the delta rule, RWKV-4, RWKV-7 and the recurrent mixer, each in its parallel, chunked and
recurrent forms (RWKV-7: recurrent and chunked)."""
import numpy as np

from grads.cases._common import case
from grads.check import check


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
    from scratchllm.linear_attention import (ChannelMixWeights, TimeMixWeights,
                                             rwkv4_channel_mix_backward,
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
                  x=rng.standard_normal((batch, T, D)),
                  w=TimeMixWeights(time_decay=rng.normal(-1, 0.5, D),
                                   time_first=rng.standard_normal(D), **mix, **W)),
            check(rwkv4_channel_mix_forward, rwkv4_channel_mix_backward, rng=rng,
                  label="channel-mix", x=rng.standard_normal((batch, T, D)),
                  w=ChannelMixWeights(mix["mix_k"], mix["mix_r"], rng.normal(0, 0.5, (D, F)),
                                      W["Wr"], rng.normal(0, 0.5, (F, D))))]


@case
def recurrent_mixer(rng):
    from scratchllm.linear_attention import (RecurrentWeights, recurrent_mixer_backward,
                                             recurrent_mixer_forward)
    from scratchllm.specs import RecurrentSpec
    D, H = 6, 2
    reports = []
    for kind, wa in (("linear", None), ("retnet", None), ("gla", D), ("delta", H)):
        W = {n: rng.normal(0, 0.5, (D, D)) for n in ("Wq", "Wk", "Wv", "Wo")}
        if wa:
            W["Wa"] = rng.normal(0, 0.5, (D, wa))
        reports.append(check(recurrent_mixer_forward, recurrent_mixer_backward, rng=rng,
                             label=kind, spec=RecurrentSpec(kind, H, chunk=3),
                             x=rng.standard_normal((2, 7, D)), w=RecurrentWeights(**W)))
    return reports


@case
def rwkv7(rng):
    from scratchllm.linear_attention import rwkv7_backward, rwkv7_forward
    B, H, T, Dk, Dv = 2, 2, 6, 3, 5
    kappa = rng.standard_normal((B, H, T, Dk))
    inputs = dict(r=rng.standard_normal((B, H, T, Dk)), w=rng.uniform(0.5, 0.99, (B, H, T, Dk)),
                  k=rng.standard_normal((B, H, T, Dk)), v=rng.standard_normal((B, H, T, Dv)),
                  kappa=kappa / np.linalg.norm(kappa, axis=-1, keepdims=True),
                  a=rng.uniform(0.05, 0.95, (B, H, T, Dk)))
    return [check(rwkv7_forward, rwkv7_backward, rng=rng, label=form, form=form, chunk=4,
                  **inputs) for form in ("recurrent", "chunked")]
