"""Gradient-check cases of scratchllm.core: the ops (linear, embedding, norms, activations,
the dense FFNs, softmax, cross-entropy, InfoNCE), their fused twins (core/fused.py) and the FP8
linear (core/fp8.py, by its straight-through definition)."""
import numpy as np

from grads.cases._common import case
from grads.check import check


@case
def linear(rng):
    from scratchllm.core.ops import linear_backward, linear_forward
    x, W, b = rng.standard_normal((2, 5, 7)), rng.standard_normal((7, 3)), rng.standard_normal(3)
    return [check(linear_forward, linear_backward, rng=rng, label="bias", x=x, W=W, b=b),
            check(linear_forward, linear_backward, rng=rng, label="no bias", x=x, W=W)]


@case
def lora(rng):
    from scratchllm.core import LoRAWeights, lora_backward, lora_forward
    x = rng.standard_normal((2, 5, 7))
    w = LoRAWeights(rng.standard_normal((7, 4)), rng.standard_normal((7, 2)),
                    rng.standard_normal((2, 4)), rng.standard_normal(4))
    return [check(lora_forward, lora_backward, rng=rng, label="bias", x=x, w=w, scale=0.5),
            check(lora_forward, lora_backward, rng=rng, label="no bias", x=x,
                  w=w._replace(b=None), scale=2.0)]


@case
def lora_merge(rng):
    from scratchllm.core import LoRAFactors, lora_merge_backward, lora_merge_forward
    W, w = rng.standard_normal((7, 4)), LoRAFactors(rng.standard_normal((7, 2)),
                                                   rng.standard_normal((2, 4)))
    return check(lora_merge_forward, lora_merge_backward, rng=rng, x=W, w=w, scale=1.5)


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
def softcap(rng):
    """y = c tanh(x / c) (Gemma 2's logit soft-capping), across the tanh's bend."""
    from scratchllm.core import softcap_backward, softcap_forward
    x = 3 * rng.standard_normal((2, 5, 7))
    return [check(softcap_forward, softcap_backward, rng=rng, label=f"cap {c}", x=x, cap=c)
            for c in (2.0, 30.0)]


@case
def rmsnorm(rng):
    x, g = rng.standard_normal((2, 5, 11)), rng.standard_normal(11)
    return [check(fwd, bwd, rng=rng, label=label, x=x, g=g, eps=1e-5)
            for label, fwd, bwd in _twins("rmsnorm")]


@case
def layernorm(rng):
    from scratchllm.core import layernorm_backward, layernorm_forward
    x = rng.standard_normal((2, 5, 11))
    return [check(layernorm_forward, layernorm_backward, rng=rng, label="bias", x=x,
                  g=rng.standard_normal(11), b=rng.standard_normal(11), eps=1e-5),
            check(layernorm_forward, layernorm_backward, rng=rng, label="no bias", x=x,
                  g=rng.standard_normal(11), eps=1e-5)]


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
def gelu(rng):
    from scratchllm.core import gelu_backward, gelu_forward
    x = 3 * rng.standard_normal((3, 7))
    return [check(gelu_forward, gelu_backward, rng=rng, label=a, x=x, approximate=a)
            for a in ("tanh", "none", "quick")]


@case
def swiglu(rng):
    D, F = 7, 9
    x, W2 = rng.standard_normal((2, 3, D)), rng.standard_normal((F, D))
    W1, W3 = rng.standard_normal((D, F)), rng.standard_normal((D, F))
    return [check(fwd, bwd, rng=rng, label=label, x=x, W1=W1, W3=W3, W2=W2)
            for label, fwd, bwd in _twins("swiglu")]


@case
def gelu_mlp(rng):
    from scratchllm.core import gelu_mlp_backward, gelu_mlp_forward
    D, F = 7, 9
    return check(gelu_mlp_forward, gelu_mlp_backward, rng=rng, x=rng.standard_normal((2, 3, D)),
                 W1=rng.standard_normal((D, F)), b1=rng.standard_normal(F),
                 W2=rng.standard_normal((F, D)), b2=rng.standard_normal(D))


@case
def relu_mlp(rng):
    """T5's DenseReluDense; inputs drawn away from ReLU's kink (|h| > 0.05 everywhere)."""
    from scratchllm.core import relu_mlp_backward, relu_mlp_forward
    D, F = 7, 9
    W1, W2 = rng.standard_normal((D, F)), rng.standard_normal((F, D))
    while True:
        x = rng.standard_normal((2, 3, D))
        if np.abs(x @ W1).min() > 0.05:
            return check(relu_mlp_forward, relu_mlp_backward, rng=rng, x=x, W1=W1, W2=W2)


@case
def geglu(rng):
    """The readable pair, and the fused tanh twin (core/fused_geglu.py)."""
    from scratchllm.core import geglu_backward, geglu_forward
    from scratchllm.core.fused_geglu import fused_geglu_backward, fused_geglu_forward
    D, F = 7, 9
    x, W2 = rng.standard_normal((2, 3, D)), rng.standard_normal((F, D))
    W1, W3 = rng.standard_normal((D, F)), rng.standard_normal((D, F))
    return [check(fwd, bwd, rng=rng, label=label, x=x, W1=W1, W3=W3, W2=W2)
            for label, fwd, bwd in (("readable", geglu_forward, geglu_backward),
                                    ("fused tanh", fused_geglu_forward, fused_geglu_backward))]


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


@case
def info_nce(rng):
    from scratchllm.core import info_nce_backward, info_nce_forward
    inputs = dict(q=rng.standard_normal((5, 7)), k=rng.standard_normal((5, 7)))
    return [check(info_nce_forward, info_nce_backward, rng=rng, label=label, temperature=0.7,
                  symmetric=symmetric, **inputs)
            for label, symmetric in (("in-batch negatives", False), ("symmetric (CLIP)", True))]


@case
def fp8_linear(rng):
    """The FP8 linear (core/fp8.py) against its straight-through definition: a custom check
    (grads/straight_through.py), since finite differences through the rounding measure its
    steps; then the generic checker with nothing to difference (wrt=[]) for the contract: the
    backward's keys and that no input or dout is mutated. Tiles of 4 on widths 10 and 6, so
    full and partial tiles both occur; per-tensor scaling; e4m3 gradients as DeepSeek-V3."""
    from grads.straight_through import check_fp8_linear
    from scratchllm.core import FP8Spec, fp8_linear_backward, fp8_linear_forward
    x, W, b = rng.standard_normal((2, 3, 10)), rng.standard_normal((10, 6)), rng.standard_normal(6)
    reports = []
    for label, spec, bias in (("tiles, e5m2 grads", FP8Spec(act_tile=4, weight_block=4), b),
                              ("per tensor", FP8Spec(act_tile=None, weight_block=None), None),
                              ("tiles, e4m3 grads", FP8Spec(grad_fmt="e4m3", act_tile=4,
                                                            weight_block=4), b)):
        report = check_fp8_linear(x, W, bias, spec=spec, rng=rng, label=label)
        report.rows += check(fp8_linear_forward, fp8_linear_backward, rng=rng, wrt=[], x=x,
                             W=W, b=bias, spec=spec).rows
        reports.append(report)
    return reports


@case
def fp8_cast(rng):
    """The quantiser pair's straight-through backward: dx = dx^ (the gradient of the smooth
    sum(dout * u) at u = x^, by the generic checker on the identity it stands for)."""
    from scratchllm.core import fp8_cast_backward, fp8_cast_forward

    def identity_at_rounded(x):  # the straight-through surrogate: x^ + (x - x^) = x
        y, cache = fp8_cast_forward(x, fmt="e4m3", tile=(1, 4))
        return y + (x - y), cache
    return check(identity_at_rounded, fp8_cast_backward, rng=rng,
                 x=rng.standard_normal((3, 10)))


@case
def pool(rng):
    from scratchllm.core import pool_backward, pool_forward
    mask = np.array([[True, True, False, True, False], [True] * 5, [True] + [False] * 4])
    return [check(pool_forward, pool_backward, rng=rng, label="mean, masked",
                  h=rng.standard_normal((3, 5, 7)), mask=mask, kind="mean"),
            check(pool_forward, pool_backward, rng=rng, label="cls",
                  h=rng.standard_normal((3, 5, 7)), kind="cls")]


@case
def sequence_head(rng):
    """A 3-class classifier on [CLS]; a reranker's one score on the masked mean."""
    from scratchllm.core import HeadWeights, sequence_head_backward, sequence_head_forward
    mask = np.array([[True, True, True, False], [True, False, False, False]])
    return [check(sequence_head_forward, sequence_head_backward, rng=rng, label=label,
                  h=rng.standard_normal((2, 4, 6)), mask=m, kind=kind,
                  w=HeadWeights(rng.standard_normal((6, C)), rng.standard_normal(C)))
            for label, kind, m, C in (("classifier, cls", "cls", None, 3),
                                      ("reranker, mean", "mean", mask, 1))]
