"""Gradient-check cases of scratchllm.dist on a group of one rank (no MPI needed), where every
collective is a copy (and a tensor-parallel Linear is the plain one). They keep every collective pair inside `python -m grads` and its shape
and contract checks; the real check, across ranks, is the distributed one:
`mpiexec -n 2 python -m grads.mpi` (grads/mpi.py; tests/dist spawns it on 2 and 4 ranks)."""

import numpy as np

from grads.cases._common import case
from grads.check import check


def _one_rank():
    from scratchllm.dist import Group
    return Group.single()


@case
def collectives_one_rank(rng):
    from scratchllm import dist
    g = _one_rank()
    x = rng.standard_normal((3, 4))
    pairs = [("all_reduce", {}), ("all_gather", {"axis": 1}), ("reduce_scatter", {}),
             ("all_to_all", {"counts": [3]}), ("ring_shift", {}), ("copy_to_group", {}),
             ("reduce_from_group", {}), ("all_gather", {"counts": [3]}),
             ("reduce_scatter", {"counts": [3]}), ("pipeline_hop", {})]
    return [check(getattr(dist, f"{name}_forward"), getattr(dist, f"{name}_backward"),
                  rng=rng, label=name + (" (v)" if "counts" in kw and name != "all_to_all" else ""),
                  x=x, group=g, **kw) for name, kw in pairs]


@case
def tensor_parallel_one_rank(rng):
    from scratchllm import dist
    g = _one_rank()
    x = rng.standard_normal((2, 3, 5))
    return [check(dist.column_linear_forward, dist.column_linear_backward, rng=rng,
                  label="column", x=x, W=rng.standard_normal((5, 4)), b=rng.standard_normal(4),
                  group=g),
            check(dist.row_linear_forward, dist.row_linear_backward, rng=rng, label="row",
                  x=x, W=rng.standard_normal((5, 4)), b=rng.standard_normal(4), group=g)]


@case
def vocab_parallel_one_rank(rng):
    """The vocab-parallel embedding and cross-entropy on one rank: the plain embedding and
    cross-entropy (the ids and targets are not differentiated)."""
    from scratchllm import dist
    g = _one_rank()
    ids = rng.integers(0, 6, (2, 3))
    return [check(dist.vocab_embedding_forward, dist.vocab_embedding_backward, rng=rng,
                  label="embedding", wrt=["E"], ids=ids, E=rng.standard_normal((6, 4)),
                  group=g),
            check(dist.vocab_cross_entropy_forward, dist.vocab_cross_entropy_backward,
                  rng=rng, label="cross_entropy", wrt=["logits"],
                  logits=rng.standard_normal((2, 3, 6)), targets=ids, group=g)]


@case
def ring_attention_one_rank(rng):
    """Ring attention on one rank: plain attention (causal or not) on the rank's tokens."""
    from scratchllm import dist
    g = _one_rank()
    q, k, v = (rng.standard_normal((1, 2, 4, 3)) for _ in range(3))
    return [check(dist.ring_attention_forward, dist.ring_attention_backward, rng=rng,
                  label="causal" if causal else "not causal", q=q, k=k, v=v, group=g,
                  causal=causal) for causal in (False, True)]


@case
def expert_parallel_one_rank(rng):
    """The expert-parallel experts pair on one rank: the experts pair between two all-to-alls
    that copy (3 experts, one with no rows)."""
    from scratchllm.train.expert_parallel import (expert_parallel_backward,
                                                  expert_parallel_forward)
    bounds = np.array([0, 2, 2, 5])
    return [check(expert_parallel_forward, expert_parallel_backward, rng=rng,
                  wrt=["xs", "w1", "w3", "w2"], xs=rng.standard_normal((5, 3)), bounds=bounds,
                  w1=rng.standard_normal((3, 3, 4)), w3=rng.standard_normal((3, 3, 4)),
                  w2=rng.standard_normal((3, 4, 3)), group=_one_rank())]


def cp_attention_inputs(rng, T=4):
    """(x (1, T, 5), AttentionWeights of 4 query heads, 2 KV heads of width 2 with q, k, v
    biases, spec) for the context-parallel attention cases."""
    from scratchllm.attention.qkv import AttentionWeights
    from scratchllm.specs import AttentionSpec
    D, H, Hkv, Dh = 5, 4, 2, 2
    std = rng.standard_normal
    w = AttentionWeights(std((D, H * Dh)), std((D, Hkv * Dh)), std((D, Hkv * Dh)),
                         std((H * Dh, D)), std(H * Dh), std(Hkv * Dh), std(Hkv * Dh))
    return std((1, T, D)), w, AttentionSpec(H, Hkv, head_dim=Dh, qkv_bias=True)


@case
def cp_attention_one_rank(rng):
    """The context-parallel attention layer on one rank: GQA attention with RoPE (the zig-zag
    split of one rank keeps the order), causal and not."""
    from dataclasses import replace

    from scratchllm.specs import Mask
    from scratchllm.train.parallel_context import cp_attention_backward, cp_attention_forward
    x, w, spec = cp_attention_inputs(rng)
    return [check(cp_attention_forward, cp_attention_backward, rng=rng, label=what, x=x, w=w,
                  spec=s, group=_one_rank())
            for what, s in (("causal", spec), ("not causal",
                                                replace(spec, mask=Mask(causal=False))))]


@case
def balance_loss_across_one_rank(rng):
    """The balance loss over every rank's tokens, on one rank: the Switch balance loss (the
    probabilities a softmax's, the top-2 choices fixed)."""
    from scratchllm.train.parallel_moe import (balance_loss_across_backward,
                                               balance_loss_across_forward)
    s = rng.standard_normal((6, 4))
    probs = np.exp(s) / np.exp(s).sum(axis=1, keepdims=True)
    return [check(balance_loss_across_forward, balance_loss_across_backward, rng=rng,
                  wrt=["probs"], probs=probs, topk_idx=np.argsort(-probs, axis=1)[:, :2],
                  group=_one_rank())]
