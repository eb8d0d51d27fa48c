"""Data parallelism across ranks: every rank holds the whole model, runs forward + backward on
its slice of the global batch, and the gradients are summed over the data-parallel group before
the (identical, replicated) optimizer step, so the weights stay equal on every rank.

    grad = sum_d (n_d / B) grad(slice_d)       (n_d of the B sequences on rank d)

Each rank scales its loss by n_d / B before the backward, so one all-reduce (a sum) gives the
global gradient; it is the all_reduce pair's backward applied to the replicated weights (the
weights enter every rank's forward through an identity, Megatron's f: collectives.py).

Bucketing (PyTorch DDP, Li et al. 2020, arXiv:2006.15704): instead of one all-reduce per Param
(a thousand small messages, each paying the latency), the gradients are packed, in the reverse
of the order the backward produces them, into flat buckets of about `bucket_bytes` and each
bucket is all-reduced as one message. DDP also overlaps a bucket's all-reduce with the rest of
the backward; here the backward runs as one call, so the buckets go after it.
"""
import numpy as np

from scratchllm.dist.collectives import all_reduce_forward
from scratchllm.dist.zero import partition

BUCKET_BYTES = 1 << 20  # 1 MiB (DDP's default is 25 MiB, for models a thousand times larger)


def bucket_plan(nbytes, bucket_bytes=BUCKET_BYTES):
    """[[index, ...], ...]: items of the given byte sizes in reverse order, cut into runs of
    about bucket_bytes (an item larger than that is a bucket of its own)."""
    out, size = [[]], 0
    for i in reversed(range(len(nbytes))):
        if out[-1] and size + nbytes[i] > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(i)
        size += nbytes[i]
    return [b for b in out if b]


def buckets(params, bucket_bytes=BUCKET_BYTES):
    """[[Param, ...], ...]: bucket_plan of the Params' gradients."""
    params = list(params)
    return [[params[i] for i in b]
            for b in bucket_plan([p.grad.nbytes for p in params], bucket_bytes)]


def bytes_per_step(nbytes, n_ranks, *, zero=0, small=(), rank=0):
    """The communication model of one data-parallel step: {collective: bytes one rank sends}
    for Params of the given gradient byte sizes on n_ranks ranks, from the ring formulas the
    collectives count with (collectives.py): each bucket's all-reduce 2 (P - 1) n_b / P; with
    zero=1 the all-gather of the updated Params (all but the next rank's shard, zero.py); plus
    the all-reduces of `small` arrays of those byte sizes (an MoE layer's routed counts).
    rank: whose bytes (ZeRO's shards differ by a Param's size). From zero=2 on the gradients
    are reduce-scattered instead (zero_layers.ShardedModel.bytes_per_step adds those)."""
    P = n_ranks
    if P == 1:
        return {}
    sizes = [sum(nbytes[i] for i in b) for b in bucket_plan(nbytes)] if zero < 2 else []
    out = {"all_reduce": sum(2 * (P - 1) * n // P for n in list(sizes) + list(small))}
    if not out["all_reduce"]:
        del out["all_reduce"]
    if zero == 1:
        owner = partition(list(nbytes), P)
        nxt = sum(n for n, r in zip(nbytes, owner) if r == (rank + 1) % P)
        out["all_gather"] = sum(nbytes) - nxt
    return out


def all_reduce_grads(params, group, bucket_bytes=BUCKET_BYTES):
    """p.grad <- sum over the group's ranks of p.grad, for every Param, one all-reduce per
    bucket. Returns the number of buckets."""
    plan = buckets(params, bucket_bytes)
    if group.size == 1:
        return len(plan)
    for bucket in plan:
        flat = np.concatenate([p.grad.ravel() for p in bucket])
        total, _ = all_reduce_forward(flat, group=group)
        start = 0
        for p in bucket:
            p.grad[...] = total[start:start + p.grad.size].reshape(p.grad.shape)
            start += p.grad.size
    return len(plan)
