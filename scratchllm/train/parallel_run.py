"""The parallel plumbing of a training Run (trainer.py) on a rank grid (dist.RankGrid): which
model a rank builds, the ZeRO and pipeline wrappers, the rows of the global batch it takes,
the communication model, and the whole-model views of its checkpoints.

    axis   the model a rank builds                         its gradients
    dp     the whole LM, the rank's rows of the batch      all-reduced over dp (trainer.py)
    tp     MegatronLM: heads, SwiGLU units, vocab split    replicated ones whole on each rank
    pp     PipelineStage: its blocks only run              all-reduced over dp per stage
    cp     ContextParallelLM: its zig-zag chunks of T      summed over cp inside the backward
    ep     ExpertParallelLM: E/P experts per MoE layer     the experts' on their owner
Every rank draws the same global batch and keeps its data-parallel slice (np.array_split over
the dp ranks); the other axes see that slice whole.

Memory: a rank builds only what it holds (parallel_build.py: a split model's slices, a stage's
Params, ZeRO-3's shard), an evaluation runs on the parts (through the stages; ZeRO-3 gathering
block by block), and a checkpoint's whole model and moments are gathered on rank 0 alone
(`whole_on_root`).
"""
from contextlib import contextmanager

import numpy as np

from scratchllm.dist import Group, ShardedModel, ZeroAdamW, bytes_per_step
from scratchllm.train.parallel_build import build_part, skeleton, zero_owned
from scratchllm.train.megatron import MegatronLM, check_tensor_parallel
from scratchllm.train.parallel_context import ContextParallelLM, check_context_parallel
from scratchllm.train.parallel_moe import (ExpertParallelLM, balance_across,
                                          check_expert_parallel)
from scratchllm.train.pipeline import PipelineStage, stage_holds, stage_layers

SPLIT_MODELS = {"tp": MegatronLM, "cp": ContextParallelLM, "ep": ExpertParallelLM}


def check_combination(sizes, threads, zero, model=None):
    """ValueError naming a combination this version does not train: sizes {axis: ranks} of
    tp, pp, cp, ep; threads: data shards per rank; zero: the ZeRO stage; model: one given to
    the Run (a split axis builds its own)."""
    on = [a for a in ("tp", "pp", "cp", "ep") if sizes.get(a, 1) > 1]
    flags = ", ".join(f"--{a} {sizes[a]}" for a in on)
    if len(on) > 1 and on != ["tp", "pp"]:
        raise ValueError(f"{flags}: one of --tp, --pp, --cp, --ep at a time (each works with "
                         f"--dp; --tp also with --pp)")
    if on and on not in (["cp"], ["ep"]) and threads > 1:
        raise ValueError(f"{flags}: one data shard per rank (got --threads {threads}; use "
                         f"--threads 1; --cp and --ep take threads)")
    if on and zero > 1:
        raise ValueError(f"--zero {zero} with {flags}: ZeRO-1 shards the optimizer over the "
                         f"data-parallel ranks of a split model or a pipeline stage; ZeRO-2/3 "
                         f"(per-block gradients and weights) only with --dp, for now")
    if on and model is not None:
        raise ValueError(f"{flags}: the run builds its own slice of the model (no model=)")


def check_split(cfg, shape, seq_len):
    """ValueError naming what of cfg the split model of each axis above one rank of shape (a
    GridShape) does not cover (seq_len: the tokens per sequence, for the zig-zag split); the
    same checks the models make, callable before any work."""
    if shape.tp > 1:
        check_tensor_parallel(cfg, shape.tp)
    if shape.cp > 1:
        check_context_parallel(cfg, shape.cp, seq_len)
    if shape.ep > 1:
        check_expert_parallel(cfg, shape.ep)


def parallel_model(cfg, settings, dtype, grid, model=None, zero=0, sequence=False,
                   optimizer=None):
    """(world, the dp group, {axis: group or None (size 1)}, the model to train: `model`, a
    split model of the one axis above one rank, a pipeline stage's or ZeRO-3's part of the LM,
    or None for a fresh LM); optimizer: model -> the run's AdamW (ZeRO-3's slot order)."""
    world = Group.single() if grid is None else grid.world
    dp = Group.single() if grid is None else grid.groups["dp"]
    axes = {a: None if grid is None or getattr(grid.shape, a) == 1 else grid.groups[a]
            for a in ("tp", "pp", "cp", "ep")}
    check_combination({a: 1 if g is None else g.size for a, g in axes.items()},
                      settings.threads, zero, model)
    if sequence and axes["pp"] is not None:
        raise ValueError("--sequence-parallel with --pp: the stages pass whole (B, T, D) "
                         "activations; use --tp with --pp without it")
    rng = np.random.default_rng(settings.seed)
    for axis, kind in SPLIT_MODELS.items():
        if axes[axis] is not None:
            extra = {"sequence": sequence} if axis == "tp" else {}
            model = kind(cfg, axes[axis], rng=rng, dtype=dtype, **extra)
    pp = axes["pp"]
    if model is None and pp is not None:  # this stage's Params only (its blocks, its ends)
        ids = stage_layers(cfg.n_layers, pp.size, pp.rank)
        first, last = pp.rank == 0, pp.rank == pp.size - 1
        model = build_part(cfg, rng, dtype, lambda n, a: a if stage_holds(n, ids, first, last)
                           else None)
    elif model is None and zero == 3 and dp.size > 1 and optimizer is not None:
        owned = zero_owned(cfg, dtype, optimizer, dp)  # this rank's ZeRO-3 shard only
        model = build_part(cfg, rng, dtype, lambda n, a: a if n in owned else None)
    return world, dp, axes, model


def attach_parallel(run, axes, zero, pipeline):
    """The pipeline stage, ZeRO's optimizer and hooks, this rank's rows of the global batch
    and the communication model, set on `run` (its model and AdamW built)."""
    s, group = run.s, run.group
    pp = axes["pp"]
    run.stage = None if pp is None else PipelineStage(run.model, pp, pipeline[1] or pp.size,
                                                      pipeline[0])
    run.shards = None  # ZeRO-2/3's hooks
    if zero:  # (a stage's ranks share its Params' optimizer slots only)
        only = None if run.stage is None else run.stage.opt_indices(run.opt)
        run.opt = ZeroAdamW(run.opt, group, stage=zero, only=only)
    if zero >= 2:
        if s.threads > 1:
            raise ValueError(f"--zero {zero} reduce-scatters each block's gradients inside "
                             f"the backward of one data shard per rank; --threads "
                             f"{s.threads} is not supported with it (use --threads 1)")
        run.shards = ShardedModel(run.model, run.opt.owners(), group, zero)
    run.balance_bytes = []  # the across-ranks balance loss's all-reduces (their bytes)
    if s.balance_across:
        if s.threads > 1:
            raise ValueError(f"--balance-across-ranks sums the balance loss's statistics over "
                             f"the data-parallel ranks, not threads: use --threads 1 (got "
                             f"{s.threads})")
        run.balance_bytes = balance_across(run.model, group)
    if s.batch_size < group.size:
        raise ValueError(f"--batch-size {s.batch_size} is smaller than the {group.size} "
                         f"data-parallel ranks (each needs a sequence)")
    run.rows = np.array_split(np.arange(s.batch_size), group.size)[
        group.rank]  # this rank's contiguous slice of the global batch
    run.comm_model = comm_model(run, zero)


def comm_model(run, zero):
    """{'[axis ]collective': bytes} this rank sends per step: predicted."""
    s, model = run.s, run.model
    moe = [layer.ffn for layer in model.layers if hasattr(layer.ffn, "update_bias")]
    reduced = model.parameters() if run.stage is None else run.stage.params
    out = bytes_per_step([p.data.nbytes for p in reduced], run.group.size, zero=zero,
                         small=[8 * f.spec.router.n_experts for f in moe] + run.balance_bytes,
                         rank=run.group.rank)
    if run.shards is not None:
        out.update(run.shards.bytes_per_step())
    shards = [len(c) for c in np.array_split(run.rows, min(s.threads, len(run.rows)))]
    if run.tp is not None:  # the split model's own collectives, per step (a stage's)
        out.update({f"tp {op}": n for op, n in model.bytes_per_step(
            len(run.rows), s.seq_len, stage=run.stage).items()})
    if run.cp is not None:  # each data shard's (thread's) ring and gradients' all-reduce
        for rows in shards:
            for op, n in model.bytes_per_step(rows, s.seq_len).items():
                out[f"cp {op}"] = out.get(f"cp {op}", 0) + n
    if run.ep is not None:  # the all-to-alls' sizes follow the routing: the config's bound
        out.update(model.bytes_bound(shards, s.seq_len))
    if run.stage is not None:
        out["pp send"] = run.stage.bytes_per_step(len(run.rows), s.seq_len)
    # the floats summed per step (Group.sum_scalar): the loss over the data-parallel ranks
    # (and ZeRO-2/3's gradient norm), the norm over a split model's group, the loss over
    # the context-parallel ranks, the loss and the norm over the stages
    scalars = {"": (run.group, 1 + (run.shards is not None)), "tp ": (run.tp, 1),
               "ep ": (run.ep, 1), "cp ": (run.cp, len(shards)),  # (a loss per shard)
               "pp ": (run.stage and run.stage.group, 2)}
    for axis, (group, n) in scalars.items():
        if group is not None and group.size > 1:
            out[f"{axis}sum_scalar"] = n * group.scalar_bytes()
    return out


def predicted_sent(run):
    """The bytes this rank should have sent in its last step: the communication model, its
    expert-parallel bounds replaced by the sizes the step's routing gives
    (ExpertParallelLM.routed_bytes)."""
    model = {k: n for k, n in run.comm_model.items() if not k.endswith("(at most)")}
    return sum(model.values()) + (0 if run.ep is None else sum(run.model.routed_bytes.values()))


def sent(run):
    """Bytes this rank has sent over its data-, tensor-, context-, expert- and pipeline-
    parallel groups."""
    groups = [run.group] + ([] if run.tp is None else [run.tp])
    if run.cp is not None or run.ep is not None:  # and the threads' twins of the group
        groups += run.model.groups()
    if run.stage is not None:  # its sends, and its group's collectives (the sums)
        return sum(g.total_sent() for g in groups + [run.stage.group]) + run.stage.sent
    return sum(g.total_sent() for g in groups)


def opt_names(run):
    """The Param name of each optimizer slot (AdamW's m.i / v.i)."""
    names = {id(p): n for n, p in run.model.named_parameters()}
    return [names[id(p)] for p in getattr(run.opt, "opt", run.opt).params]  # (ZeroAdamW's)


def evaluates_in_parts(run):
    """Whether an evaluation runs on the ranks' parts of the weights (a pipeline's stages,
    ZeRO-3's shards) or, with context or expert parallel threads, on one thread, rather than
    on each rank's threads and model (whole, or a split model's own)."""
    return run.stage is not None or (run.shards is not None and run.shards.stage == 3) or (
        (run.cp is not None or run.ep is not None) and run.s.threads > 1)


def evaluate_parts(run, batches):
    """The mean cross-entropy over batches ((x, y)) where evaluates_in_parts (collective):
    the data-parallel rank d takes batches d, d + size, ...; a pipeline passes them through
    its stages forward only, ZeRO-3 gathers each block on use, every rank running as many
    forwards (a rank short of batches repeats one, uncounted)."""
    g = run.group
    mine = batches[g.rank::g.size]
    if run.stage is not None:
        total = run.stage.pp_sum(run.stage.cross_entropy_sum(mine))
    elif run.shards is None:  # context or expert parallel: one thread (the threads'
        # forwards on one communicator would mix their messages; the group's ranks take
        # the same batches)
        total = sum(run.model.cross_entropy(*b) * b[1].size for b in mine)
    else:
        pad = [batches[0]] * (-(-len(batches) // g.size) - len(mine))
        with run.shards.evaluation():
            losses = [run.model.cross_entropy(*b) * b[1].size for b in mine + pad]
        total = sum(losses[:len(mine)])
    return (g.sum_scalar(total) if g.size > 1 else total) / sum(b[1].size for b in batches)


@contextmanager
def whole_on_root(run, opt_state):
    """(the whole model, AdamW's whole state_dict) on world rank 0 for the duration, (None,
    None) on the other ranks (collective; opt_state: this rank's run.opt.state_dict(), None
    off ZeRO's data-parallel rank 0). A split model's slices and a stage's Params and moments
    are gathered on rank 0 alone; ZeRO-3's shards too (`ShardedModel.on_root`)."""
    if run.shards is not None and run.shards.stage == 3:
        with run.shards.on_root():
            yield (run.model, opt_state) if run.writer else (None, None)
        return
    if run.stage is None and run.sliced is None:
        yield (run.model, opt_state) if run.writer else (None, None)
        return
    # data-parallel rank 0's split and pipeline groups gather (the others hold copies)
    whole = None if opt_state is None or run.group.rank else _gather_parts(run, opt_state)
    if whole is None or not run.writer:
        yield None, None
        return
    arrays, moments = whole
    model, _ = skeleton(run.cfg, run.model.dtype)  # np.empty weights, filled here
    for n, p in model.named_parameters():
        p.data = arrays[n]
    if run.stage is None:  # (a pipeline covers dense models: no buffers)
        for (_, b), (_, mine) in zip(model.named_buffers(), run.model.named_buffers()):
            b[...] = mine
    state = {k: opt_state[k] for k in ("t", "lr")}
    names = opt_names(run)
    for i in range(len(names)):
        state[f"m.{i}"], state[f"v.{i}"] = moments[f"m.{i}"], moments[f"v.{i}"]
    yield model, state


def _gather_parts(run, opt_state):
    """({name: whole Param}, {"m.i"/"v.i": whole moment}) on the first rank of the split and
    pipeline groups, None elsewhere (collective)."""
    names = opt_names(run)
    slot = {n: i for i, n in enumerate(names)}
    params = dict(run.model.named_parameters())
    held = names if run.stage is None else run.stage.names
    arrays = {n: params[n].data for n in held}
    moments = {f"{k}.{slot[n]}": opt_state[f"{k}.{slot[n]}"] for n in held for k in "mv"}
    if run.sliced is not None:
        arrays = run.model.gather_on_root(arrays)
        moments = run.model.gather_on_root(moments, {k: names[int(k[2:])] for k in moments})
    if run.stage is not None:
        arrays = run.stage.gather_on_root(arrays)
        moments = run.stage.gather_on_root(moments)
    return None if arrays is None else (arrays, moments)


def load_part(run, whole):
    """Keep this rank's part in `run` of `whole`, a one-process Run of the same config that
    loaded the checkpoint (checkpoints hold the whole model): a split model's slices
    (parallel_slices.py), a stage's Params; the moments likewise."""
    arrays = {n: p.data for n, p in whole.model.named_parameters()}
    state = whole.opt.state_dict()
    if run.sliced is not None:
        run.model.load_full(arrays)
        state = run.model.slice_state(opt_names(run), state)
    else:
        for n, p in run.model.named_parameters():
            if p.data.flags.writeable:  # (another stage's is released)
                p.data[...] = arrays[n]
    run.opt.load_state_dict(state)
    run.rng.bit_generator.state = whole.rng.bit_generator.state
    run.step, run.losses, run.evals = whole.step, whole.losses, whole.evals
    whole.dp.close()
