"""Use both cores of a laptop for one training step: data parallelism over Python threads.

NumPy releases the GIL inside BLAS calls and inside ufunc loops, so two threads that each run
forward + backward on half of the batch keep two cores busy with no Python-level locking.
Each thread owns a replica of the model whose Params share `.data` with the main model (one
copy of the weights, updated in place by the optimizer) but have their own `.grad`; after
both finish, the replicas' gradients are summed into the main model's, in a fixed order, so
the result is deterministic.

    loss = sum_s (n_s / B) loss(shard_s)      grad = sum_s (n_s / B) grad(shard_s)

for S shards of n_s of the B sequences: the cross-entropy part equals the full-batch mean;
MoE auxiliary losses are computed per shard, as on real data-parallel devices.

BLAS itself is kept at one thread per shard (`set_blas_threads`): OpenBLAS's own threads
spin-wait, which on a busy machine makes small matmuls many times slower.
"""
import numpy as np

from scratchllm.core.blas import blas_threads, set_blas_threads  # noqa: F401 (re-exported)
from scratchllm.core.blas import flat_spans, run_tasks
from scratchllm.core.flat_grads import FlatGrads
from scratchllm.core.twins import use_fused


class DataParallel:
    """loss + backward of a model over S batch shards on S threads, gradients summed into
    the main model's Params. S = 1 runs in the calling thread. A model whose forward and
    backward talk to other processes (`serial_shards = True`: context and expert parallel,
    whose ranks must meet in each collective) gets its shards one after another on one
    thread: a thread blocked in MPI while another waits for Numba's compiler lock can hang
    the job. The calling thread runs the first shard itself and the process's task pool
    (core/blas.run_tasks) the others: no thread is started or woken for it.
    The gradients of the model and its replicas live in one array (core/flat_grads.py) when
    they can (one float dtype): a shard zeroes its replica's in one fill, and one pass per
    thread sums them and leaves each Param's sum of squares in `squares` for the clip."""

    def __init__(self, model, n_shards):
        if n_shards < 1:
            raise ValueError(f"DataParallel: n_shards must be >= 1, got {n_shards}")
        self.model = model
        self.replicas = [model] + [model.replica() for _ in range(n_shards - 1)]
        self.workers = 1 if getattr(model, "serial_shards", False) else n_shards
        self.flat = FlatGrads(self.replicas, self.workers) if FlatGrads.fits(
            self.replicas) else None
        self.squares = None  # (P,) float64: each Param's summed gradient squared, or None

    def _shard(self, s, model, x, y, scale, docs):
        if self.flat is not None:
            self.flat.zero(s)
        else:
            model.zero_grad()
        _, cache = model.loss(x, y, docs)
        model.loss_backward(scale, cache)
        return cache

    def loss_backward(self, x, y, total=None, docs=None):
        """Returns (mean cross-entropy, [LossCache per shard]); grads in the main model.
        Shard s of n_s sequences (np.array_split: sizes differ by at most one) has weight
        n_s / B, so the cross-entropy is the mean over all B*T tokens. total: the B of the
        weights when x is one rank's slice of a larger batch (data parallelism across
        processes: the ranks' results then sum to the whole batch's); default x's own.
        docs: the packed batch's doc_ids (B, T) (LM.forward's), or None."""
        B = x.shape[0] if total is None else total
        S = min(len(self.replicas), x.shape[0])
        d = [None] * S if docs is None else np.array_split(docs, S)
        shards = [(m, a, b, len(a) / B, c) for m, a, b, c in
                  zip(self.replicas, np.array_split(x, S), np.array_split(y, S), d)]
        self.squares = None
        if self.flat is not None and not self.flat.valid():  # a p.grad was re-pointed
            self.flat = None
        caches = run_tasks(lambda s: self._shard(s, *shards[s]), S, self.workers)
        if self.flat is None:
            self._sum_grads(self.replicas[1:S])
        else:  # row 0 += rows 1 .. S-1, and the squares, one pass per thread
            n = len(self.flat.which)
            run_tasks(lambda k: self.flat.sum_rows(S, k), n, n)
            self.squares = self.flat.squares if use_fused() else None  # (the readable clip
            #                                                     squares in its own order)
        return sum(c.ce * sh[3] for c, sh in zip(caches, shards)), caches

    def _sum_grads(self, others):
        """main.grad += each replica's grad, in replica order: every Param's flat gradient is
        cut into one span per thread, so the threads share the pass (135M numbers: ~0.17 s on
        one) and each element sums in the same order as on one thread. A gradient that is not
        C-contiguous (no flat view) is added whole, by the first span's thread."""
        main = self.model.parameters()
        theirs = [r.parameters() for r in others]
        n = self.workers if others else 1

        def span(k):
            for i, p in enumerate(main):
                grads = [p.grad] + [q[i].grad for q in theirs]
                views = flat_spans(grads, k, n)
                if views is None:
                    if k == 0:
                        for g in grads[1:]:
                            p.grad += g
                    continue
                for g in views[1:]:
                    views[0] += g

        run_tasks(span, n, n)

    def map(self, fn, items):
        """[fn(item) for item in items] on the threads (forward-only work: a Module's forward
        reads its Params and writes nothing, so threads may share the main model)."""
        items = list(items)
        return run_tasks(lambda i: fn(items[i]), len(items), self.workers)

    def close(self):
        """Nothing to release: the threads are the process's task pool (core/blas.pool_for),
        kept for the next run."""
