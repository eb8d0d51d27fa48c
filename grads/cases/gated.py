"""Gradient-check cases of Qwen3-Next's gated layers: the output gate of gated attention (its
pair, and through gqa with QK-norm gains 1 + g and partial RoPE), and the gated DeltaNet
layer."""
import numpy as np

from grads.cases._common import case
from grads.check import check
from scratchllm.specs import AttentionSpec, RopeSpec


@case
def output_gate(rng):
    """y = o sigmoid(x Wg + bg), with and without the bias."""
    from scratchllm.attention import output_gate_backward, output_gate_forward
    B, T, D, HD = 2, 5, 7, 6
    x, o = rng.standard_normal((B, T, D)), rng.standard_normal((B, T, HD))
    wg, bg = 0.5 * rng.standard_normal((D, HD)), rng.standard_normal(HD)
    return [check(output_gate_forward, output_gate_backward, rng=rng, label="with bg",
                  x=x, o=o, wg=wg, bg=bg),
            check(output_gate_forward, output_gate_backward, rng=rng, label="no bias",
                  x=x, o=o, wg=wg)]


@case
def gqa_output_gate(rng):
    """Qwen3-Next's gated attention: the gate on the merged heads, QK-norm with gains 1 + g,
    RoPE on a quarter of each head; and with every bias."""
    from scratchllm.attention import AttentionWeights, gqa_backward, gqa_forward
    B, T, D, H, Hkv, Dh = 2, 7, 5, 4, 2, 8
    n = lambda *shape: 0.5 * rng.standard_normal(shape)  # noqa: E731
    w = AttentionWeights(n(D, H * Dh), n(D, Hkv * Dh), n(D, Hkv * Dh), n(H * Dh, D),
                         q_norm=n(Dh), k_norm=n(Dh), wg=n(D, H * Dh))
    spec = AttentionSpec(H, Hkv, head_dim=Dh, qk_norm=True, norm_offset=1.0,
                         rope=RopeSpec(partial=0.25), output_gate=True)
    biased = w._replace(bq=n(H * Dh), bk=n(Hkv * Dh), bv=n(Hkv * Dh), bo=n(D), bg=n(H * Dh))
    x = rng.standard_normal((B, T, D))
    return [check(gqa_forward, gqa_backward, rng=rng, label="qk-norm 1 + g, partial rope",
                  x=x, w=w, spec=spec),
            check(gqa_forward, gqa_backward, rng=rng, label="every bias, no rope", x=x,
                  w=biased, spec=AttentionSpec(H, Hkv, head_dim=Dh, qkv_bias=True, o_bias=True,
                                               qk_norm=True, norm_offset=1.0, rope=None,
                                               output_gate=True))]



def _gdn_inputs(rng, spec, D, B=2, T=7):
    """x (B, T, D) and a GatedDeltaWeights: 0.5 x standard normal matrices, the conv
    U(±0.7), dt_bias N(0, 0.5^2), A_log = log U[1, 4], norm 1 + N(0, 0.1^2)."""
    from scratchllm.linear_attention import GatedDeltaWeights
    kd, vd, C = spec.widths()
    Hv = spec.n_v_heads
    n = lambda *shape: 0.5 * rng.standard_normal(shape)  # noqa: E731
    w = GatedDeltaWeights(n(D, kd), n(D, kd), n(D, vd), n(D, vd), n(D, Hv), n(D, Hv),
                          rng.uniform(-0.7, 0.7, (C, spec.d_conv)), n(Hv),
                          np.log(rng.uniform(1, 4, Hv)), 1 + 0.1 * rng.standard_normal(
                              spec.v_head_dim), n(vd, D))
    return rng.standard_normal((B, T, D)), w


@case
def gated_deltanet(rng):
    """Qwen3-Next's gated DeltaNet layer: two value heads per query/key head, chunks of 3 of
    T = 7 (a ragged last chunk), and one chunk (the parallel form)."""
    from scratchllm.linear_attention import gated_deltanet_backward, gated_deltanet_forward
    from scratchllm.specs import GatedDeltaNetSpec
    reports = []
    for chunk, Hk in ((3, 1), (64, 2)):
        spec = GatedDeltaNetSpec(n_k_heads=Hk, n_v_heads=2, k_head_dim=3, v_head_dim=4,
                                 d_conv=3, chunk=chunk)
        x, w = _gdn_inputs(rng, spec, D=5)
        reports.append(check(gated_deltanet_forward, gated_deltanet_backward, rng=rng,
                             label=f"Hk {Hk}, Hv 2, chunk {chunk}", x=x, w=w, spec=spec))
    return reports
