"""Pipeline parallelism: the blocks cut into P stages, one per rank of the pipeline group, a
rank's slice of the batch cut into M micro-batches that flow through the stages (GPipe, Huang et
al. 2019, arXiv:1811.06965; the 1F1B schedule of PipeDream-Flush, Narayanan et al. 2021,
arXiv:2104.04473).

    stage 0      embedding + its blocks       sends x_m forward, receives dx_m back
    stage s      its blocks                   receives x_m, sends x_m; receives dx_m, sends dx_m
    stage P-1    its blocks + norm, head, CE  receives x_m; sends dx_m back

Sending an activation forward is the identity across ranks (y on stage s+1 = x on stage s), so
its backward is the identity back: the gradient travels the reverse way (the pair
dist.pipeline_hop_forward / _backward, checked across ranks by grads.mpi; the stage posts the
same messages non-blocking, in its schedule's order). A micro-batch of n_m of the B sequences
has loss weight n_m / B, so the stages' summed gradients are the whole batch's, as with
data-parallel shards.

Schedules (F_m: micro-batch m's forward on this stage, B_m its backward):
    gpipe   F_0 .. F_{M-1}, then B_0 .. B_{M-1}: M micro-batches' activations held at once
    1f1b    P - 1 - s warm-up forwards, then one forward, one backward, ..., then the
            remaining backwards: at most P - s micro-batches held
Both idle for the same bubble: each stage waits (P - 1) micro-batch times of the M + P - 1
the step takes, a fraction (P - 1) / (M + P - 1) when the stages cost the same (Huang et al.);
1F1B's gain is memory. The measured bubble is 1 - (time computing) / (wall time of the
schedule), averaged over the stages: it includes the waits and the imbalance between stages
(the last stage's head and loss cost more than a block).

A rank holds only its stage's Params (the others are released placeholders: it builds its part
from the seed's draws, train/parallel_build.py) and updates only those. An evaluation passes
the activations through the stages forward only (`cross_entropy_sum`); a checkpoint gathers
every stage's Params and moments on the group's rank 0 alone (`gather_on_root`).
"""
import time

import numpy as np

from scratchllm.core import fused
from scratchllm.dist.zero_layers import empty_grad, released

SCHEDULES = ("gpipe", "1f1b")


def schedule(name, n_stages, stage, n_micro):
    """[("F" | "B", micro-batch)] of one stage, in order."""
    if name not in SCHEDULES:
        raise ValueError(f"pipeline: schedule must be one of {SCHEDULES}, got {name!r}")
    if name == "gpipe":
        return [("F", m) for m in range(n_micro)] + [("B", m) for m in range(n_micro)]
    warm = min(n_stages - 1 - stage, n_micro)
    ops = [("F", m) for m in range(warm)]
    for m in range(warm, n_micro):
        ops += [("F", m), ("B", m - warm)]
    return ops + [("B", m) for m in range(n_micro - warm, n_micro)]


def bubble_fraction(n_stages, n_micro):
    """(P - 1) / (M + P - 1): the idle share of a step with equal stages."""
    return (n_stages - 1) / (n_micro + n_stages - 1)


def simulated_bubble(schedule_name, n_stages, n_micro, f_cost=1.0, b_cost=2.0):
    """The idle share of a step when every stage runs `schedule` with forwards of f_cost and
    backwards of b_cost and messages take no time: each op starts when its stage is free and
    its input has arrived (F_m from stage s - 1's F_m; B_m from stage s + 1's B_m, or on the
    last stage from its own F_m). Returns 1 - (busy time) / (stages x makespan), which is
    (P - 1) / (M + P - 1) for both schedules when the stages cost the same: the measured bubble
    without the machine's noise."""
    P, M = n_stages, n_micro
    ops = [schedule(schedule_name, P, s, M) for s in range(P)]
    done, free, nxt = {}, [0.0] * P, [0] * P
    while any(nxt[s] < len(ops[s]) for s in range(P)):
        moved = False
        for s in range(P):
            if nxt[s] == len(ops[s]):
                continue
            kind, m = ops[s][nxt[s]]
            dep = (("F", s - 1, m) if s else None) if kind == "F" else \
                (("B", s + 1, m) if s < P - 1 else ("F", s, m))
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done[dep] if dep else 0.0)
            free[s] = done[(kind, s, m)] = start + (f_cost if kind == "F" else b_cost)
            nxt[s], moved = nxt[s] + 1, True
        if not moved:
            raise RuntimeError(f"pipeline: schedule {schedule_name} deadlocks on {P} stages "
                               f"with {M} micro-batches")
    return 1.0 - M * (f_cost + b_cost) / max(free)


def stage_layers(n_layers, n_stages, stage):
    """[block index] of a stage: np.array_split of the blocks, earlier stages the longer."""
    return [int(i) for i in np.array_split(np.arange(n_layers), n_stages)[stage]]


def stage_holds(name, layer_ids, first, last):
    """Whether the stage of blocks layer_ids (first and/or last of the pipeline) holds the
    Param of this name: its blocks', the first stage the embedding's, the last the rest."""
    if name.startswith("layers."):
        return int(name.split(".")[1]) in layer_ids
    if name.startswith(("embed.", "pos.", "types.", "embed_norm.")):
        return first
    return last  # the final norm, head transform, head and its bias


class PipelineStage:
    """This rank's stage of a model (an LM) over a pipeline group: `step(x, y, total)` runs
    the schedule on this rank's rows and leaves the stage's gradients in its Params."""

    def __init__(self, model, group, n_micro, schedule_name="1f1b"):
        P, s = group.size, group.rank
        if len(model.layers) < P:
            raise ValueError(f"--pp {P}: the model has {len(model.layers)} blocks, fewer than "
                             f"the stages")
        if model.cfg.tie_embeddings or any(hasattr(b.ffn, "update_bias") for b in model.layers):
            raise ValueError(f"--pp {P}: pipeline stages cover untied, dense models (a tied "
                             f"head or MoE aux losses span the stages)")
        schedule(schedule_name, P, s, n_micro)  # checks the name
        self.model, self.group, self.n_micro, self.name = model, group, n_micro, schedule_name
        self.layer_ids = stage_layers(len(model.layers), P, s)
        self.first, self.last = s == 0, s == P - 1
        self.names = [n for n, _ in model.named_parameters() if self._mine(n)]
        self.params = [p for n, p in model.named_parameters() if self._mine(n)]
        for n, p in model.named_parameters():  # the other stages' (when built whole)
            if not self._mine(n) and p.data.flags.writeable:
                p.data, p.grad = released(p), empty_grad(p)
        self.sent = 0        # bytes sent to the neighbouring stages (counted like the groups')
        self.busy = self.wall = 0.0  # seconds computing and of the whole schedule, last step
        self.held = 0        # most micro-batches' activations held at once, last step

    def _mine(self, name):
        return stage_holds(name, self.layer_ids, self.first, self.last)

    # ------------------------------------------------------------------ point to point
    def _send(self, x, to, tag, pending):
        x = np.ascontiguousarray(x)
        pending.append((self.group.comm.Isend(x, dest=to, tag=tag), x))
        self.sent += x.nbytes

    def _recv(self, shape, dtype, source, tag):
        buf = np.empty(shape, dtype)
        self.group.comm.Recv(buf, source=source, tag=tag)
        return buf

    # ------------------------------------------------------------------ one step
    def step(self, x, y, total):
        """Forward and backward of this rank's rows x, y (n, T) in M micro-batches on the
        schedule; each micro-batch's loss weighted by its rows / total. Returns this stage's
        share of the mean cross-entropy (the last stage's; 0 elsewhere)."""
        model, s = self.model, self.group.rank
        rows = np.array_split(np.arange(x.shape[0]), self.n_micro)
        if min(len(r) for r in rows) == 0:
            raise ValueError(f"pipeline: {x.shape[0]} sequences on this rank do not fill "
                             f"{self.n_micro} micro-batches")
        D, dtype = model.cfg.d_model, model.dtype
        caches, pending, ce = {}, [], 0.0
        self.busy, self.held, t_start = 0.0, 0, time.perf_counter()
        for op, m in schedule(self.name, self.group.size, s, self.n_micro):
            shape, w = (len(rows[m]), x.shape[1], D), len(rows[m]) / total
            if op == "F":
                h = self._recv(shape, dtype, s - 1, 2 * m) if not self.first else None
                t0 = time.perf_counter()
                caches[m], out = self._forward(x[rows[m]], y[rows[m]], h, w)
                self.busy += time.perf_counter() - t0
                if self.last:
                    ce += out
                else:
                    self._send(out, s + 1, 2 * m, pending)
                self.held = max(self.held, len(caches))
            else:
                dh = self._recv(shape, dtype, s + 1, 2 * m + 1) if not self.last else None
                t0 = time.perf_counter()
                dx = self._backward(caches.pop(m), dh, w)
                self.busy += time.perf_counter() - t0
                if not self.first:
                    self._send(dx, s - 1, 2 * m + 1, pending)
        for request, _ in pending:
            request.Wait()
        self.wall = time.perf_counter() - t_start
        return ce

    def _forward(self, ids, targets, h, w):
        """(cache, the activation to send on, or on the last stage the weighted CE)."""
        model, c_emb = self.model, None
        if self.first:
            h, c_emb = model._embed_forward(ids)  # (b, T, D)
        blocks = []
        for i in self.layer_ids:
            h, c = model.layers[i].forward(h)  # (b, T, D)
            blocks.append(c)
        if not self.last:
            return (c_emb, blocks, None), h
        logits, c_head = model.head_forward(h)  # (b, T, V) (V/tp: a MegatronLM's columns)
        ce, c_ce = getattr(model, "ce_forward", fused.CROSS_ENTROPY.forward)(logits, targets)
        return (c_emb, blocks, (c_head, c_ce)), float(ce) * w

    def _backward(self, cache, dh, w):
        """The stage's backward for one micro-batch: dh the gradient received (None on the
        last stage, which starts from its loss) -> the gradient to send back (None on the
        first stage)."""
        model = self.model
        c_emb, blocks, tail = cache
        if self.last:
            c_head, c_ce = tail
            dlogits = getattr(model, "ce_backward", fused.CROSS_ENTROPY.backward)(
                np.asarray(w, model.dtype), c_ce)
            dh = model.head_backward(dlogits["logits"], c_head)  # (b, T, D)
        for i, c in zip(reversed(self.layer_ids), reversed(blocks)):
            dh = model.layers[i].backward(dh, c, w)  # fwd: h = block_i(h)
        if self.first:
            model.embed_backward(dh, c_emb)
            return None
        return dh

    def pp_sum(self, value):
        """A float summed over the stages (the loss, the squared gradient norm)."""
        return self.group.sum_scalar(value)

    def measured_bubble(self):
        """(mean over the stages of 1 - busy / wall in the last step, most micro-batches held
        on any stage) (collective)."""
        parts = self.group.comm.allgather((self.busy, self.wall, self.held))
        return (float(np.mean([1 - b / w for b, w, _ in parts if w > 0])),
                max(h for _, _, h in parts))

    def cross_entropy_sum(self, batches):
        """Sum over batches (x, y) of the cross-entropy times y.size, forward only through the
        stages (collective over the group: every stage takes the same batches): the last
        stage's sum, 0 on the others."""
        s, total = self.group.rank, 0.0
        for i, (x, y) in enumerate(batches):
            h = None
            if not self.first:
                h = self._recv((x.shape[0], x.shape[1], self.model.cfg.d_model),
                               self.model.dtype, s - 1, i)
            _, out = self._forward(x, y, h, y.size)  # (its cache dropped at once)
            if self.last:
                total += out
            else:
                self.group.comm.Send(np.ascontiguousarray(out), dest=s + 1, tag=i)
        return total

    def gather_on_root(self, arrays):
        """{key: array} of every stage merged on the group's rank 0, None elsewhere
        (collective; arrays: this stage's, e.g. its Params and their moments by name; not
        counted: outside the steps). arrays None on every rank: None."""
        parts = self.group.comm.gather(arrays, root=0)
        if self.group.rank != 0 or arrays is None:
            return None
        out = {}
        for part in parts:
            out.update(part)
        return out

    def opt_indices(self, opt):
        """The optimizer slots of this stage's Params (AdamW.step(only=...))."""
        index = {id(p): i for i, p in enumerate(opt.params)}
        return sorted(index[id(p)] for p in self.params)

    def bytes_per_step(self, n_rows, seq_len):
        """Bytes this stage sends per step: each micro-batch's activation forward (not from
        the last stage) and its gradient back (not from the first)."""
        act = n_rows * seq_len * self.model.cfg.d_model * self.model.dtype.itemsize
        return (0 if self.last else act) + (0 if self.first else act)
