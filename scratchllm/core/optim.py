"""AdamW, global gradient-norm clipping, and the warmup + cosine learning-rate schedule.

AdamW (Loshchilov & Hutter 2019), exactly torch.optim.AdamW's update for step t >= 1:
    p     <- p - lr * wd * p                       (decoupled weight decay, applied first)
    m     <- b1 m + (1 - b1) g
    v     <- b2 v + (1 - b2) g^2
    p     <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
The update of one parameter is core/fused_adamw.py adamw_update (one Numba pass), or its readable
twin adamw_update_ref under SCRATCHLLM_READABLE. The update is elementwise and memory-bound
(p, grad, m, v read, p, m, v written: 28 bytes a float32 parameter), so the fused step gives
each of `opt.threads` threads whole parameters, balanced by size (a step of `only` some: every
parameter cut into equal spans, one per thread), updated at once (the Numba kernel releases the
GIL): the same numbers whatever the split. The flat views a step needs are kept between steps
while every p.data and p.grad stays the same array, so a step costs one kernel call a
parameter and no Python per element span. The clip's factor can come in as grad_scale
(`clip_scale`): the gradients are scaled in the same thread, just before their update.
"""
import math
import os
from typing import NamedTuple

import numpy as np

from scratchllm.core import fused_adamw
from scratchllm.core.blas import flat_spans, run_tasks
from scratchllm.core.flat_grads import balanced_split
from scratchllm.core.fused_adamw import AdamWStep
from scratchllm.core.twins import use_fused
from scratchllm.core.validate import expect_finite


class NonFiniteError(ValueError):
    """A loss, gradient norm or update that went NaN or inf: training must stop there."""


class _Plan(NamedTuple):
    flat: list    # per Param: flat views (p, grad, m, v)
    which: list   # per thread: the indices of its whole Params
    group: list   # per Param: its group's index
    dtype: np.dtype


class AdamW:
    """AdamW over Params (`.data`, `.grad`). `params` is a list of Params or of groups
    `{"params": [...], "weight_decay": wd, "lr_scale": s}` (torch-style, e.g. no decay for
    norms); a group's learning rate is s · opt.lr (s = 1 by default; s = 0 freezes it: no
    step and no decay), as torch's per-group lr under a schedule that scales every group
    alike. Set `opt.lr` before `step()` to follow a schedule. `opt.threads` (default: up to
    2 cores) threads share the fused update."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        expect_finite("AdamW", "lr", lr, 0, open_low=True)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0
                                      for b in betas):
            raise ValueError(f"AdamW: betas must lie in [0, 1) (two of them), got {betas}")
        expect_finite("AdamW", "eps", eps, 0, open_low=True)
        expect_finite("AdamW", "weight_decay", weight_decay, 0)
        self.lr, self.betas, self.eps = lr, betas, eps
        params = list(params)
        if params and not isinstance(params[0], dict):
            params = [{"params": params}]
        self.groups = [(list(g["params"]), expect_finite(
            "AdamW", "a group's weight_decay", g.get("weight_decay", weight_decay), 0),
            expect_finite("AdamW", "a group's lr_scale", g.get("lr_scale", 1.0), 0))
            for g in params]
        self.t = 0
        self.threads = min(2, os.cpu_count() or 1)
        # np.zeros (calloc), not zeros_like (which writes its zeros): a moment's pages stay
        # untouched until a step writes them, so the Params a rank never updates (a ZeRO
        # shard's or a pipeline stage's others) cost it no memory
        self.m = [np.zeros(p.data.shape, p.data.dtype) for p in self.params]
        self.v = [np.zeros(p.data.shape, p.data.dtype) for p in self.params]
        self._cached = None  # (key, _Plan or None) of the last step: _plan

    @property
    def params(self):
        return [p for ps, *_ in self.groups for p in ps]

    def step(self, only=None, grad_scale=None):
        """One update of every parameter from its .grad (opt.lr, set by a schedule, is checked
        here: a finite lr >= 0). only: the indices (into opt.params) of the parameters to
        update, the others untouched (a ZeRO shard: dist/zero.py); None for all.
        grad_scale: a factor every .grad is multiplied by first (left so in .grad, as
        `p.grad *= grad_scale` would: the clip's, clip_scale), or None."""
        expect_finite("AdamW.step", "lr", self.lr, 0)
        self.t += 1
        params, n = self.params, max(1, int(self.threads))
        plan = self._plan(params, n) if only is None and use_fused() else None
        if plan is not None:  # whole Params per thread, one kernel call each
            scalars = [fused_adamw.adamw_scalars(plan.dtype, AdamWStep(
                self.lr * s, self.betas, self.eps, wd, self.t)) for _, wd, s in self.groups]
            scale = None if grad_scale is None else plan.dtype.type(grad_scale)
            run_tasks(lambda k: fused_adamw.adamw_params(plan.flat, plan.which[k], plan.group,
                                                         scalars, scale), n, n)
            return
        hps = [(wd, s) for ps, wd, s in self.groups for _ in ps]
        todo = [(params[i], self.m[i], self.v[i],
                 AdamWStep(self.lr * hps[i][1], self.betas, self.eps, hps[i][0], self.t))
                for i in (range(len(params)) if only is None else only)]
        if not use_fused():
            for p, m, v, hp in todo:
                if grad_scale is not None:
                    p.grad *= grad_scale
                fused_adamw.adamw_update_ref(p.data, p.grad, m, v, hp)
            return
        if grad_scale is not None:
            for p, *_ in todo:
                p.grad *= grad_scale

        def span(k):  # the k-th of n equal spans of every parameter
            for p, m, v, hp in todo:
                arrays = (p.data, p.grad, m, v)
                same = all(a.dtype == p.data.dtype for a in arrays)
                views = flat_spans(arrays, k, n) if same else None
                if views is None:
                    if k == 0:  # whole: adamw_update's own error names the array
                        fused_adamw.adamw_update(*arrays, hp)
                    continue
                if views[0].size:  # flat views of the arrays, updated in place
                    fused_adamw.adamw_update(*views, hp)

        run_tasks(span, n, n)

    def _plan(self, params, n):
        """The flat views (p, grad, m, v) of every Param, their groups and each thread's
        whole Params (balanced by size), kept while every p.data and p.grad stays the same
        array; None when some Param's four arrays are not one dtype, shape and C layout
        (the span path then names it)."""
        key = (n, [id(p.data) for p in params], [id(p.grad) for p in params])
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1]
        dtype = params[0].data.dtype if params else None
        flat, ok = [], True
        for p, m, v in zip(params, self.m, self.v):
            arrays = (p.data, p.grad, m, v)
            ok = ok and all(a.dtype == dtype and a.flags.c_contiguous and a.shape == p.data.shape
                            for a in arrays)
            flat.append(tuple(a.reshape(-1) for a in arrays))
        plan = _Plan(flat, balanced_split([p.data.size for p in params], n),
                     [g for g, (ps, *_) in enumerate(self.groups) for _ in ps], dtype) \
            if ok and params else None
        self._cached = (key, plan)
        return plan

    def state_dict(self):
        """Arrays and counters needed to resume exactly."""
        state = {"t": np.asarray(self.t), "lr": np.asarray(self.lr)}
        for i, (m, v) in enumerate(zip(self.m, self.v)):
            state[f"m.{i}"], state[f"v.{i}"] = m, v
        return state

    def load_state_dict(self, state):
        if len(self.m) * 2 + 2 != len(state):
            raise ValueError(f"AdamW.load_state_dict: state has {len(state)} entries, "
                             f"expected {len(self.m) * 2 + 2} for {len(self.m)} parameters")
        self.t, self.lr = int(state["t"]), float(state["lr"])
        for i, (m, v) in enumerate(zip(self.m, self.v)):
            for name, buf in ((f"m.{i}", m), (f"v.{i}", v)):
                if state[name].shape != buf.shape:
                    raise ValueError(f"AdamW.load_state_dict: {name} has shape "
                                     f"{state[name].shape}, expected {buf.shape}")
                buf[...] = state[name]


def clip_grad_norm(params, max_norm, across=None, squares=None):
    """Scale every .grad by max_norm / (norm + 1e-6) when the global L2 norm exceeds max_norm
    (as torch.nn.utils.clip_grad_norm_). Returns the norm before clipping.
    A NaN or inf norm (some gradient holds NaN or inf) raises NonFiniteError and scales
    nothing, like torch's error_if_nonfinite=True: scaling by max_norm / inf would zero
    every gradient, and NaN would pass through to the weights.
    across: a function summing a float over processes when params are this process's shard
    of the gradients (ZeRO-2/3: dist/zero_layers.py); None when they are all of them.
    squares: each Param's sum(grad^2), already computed (DataParallel's, core/flat_grads.py),
    or None: computed here."""
    params = list(params)
    norm, scale = clip_scale(params, max_norm, across, squares)
    if scale is not None:
        for p in params:
            p.grad *= scale
    return norm


def clip_scale(params, max_norm, across=None, squares=None):
    """(norm, scale): clip_grad_norm's global norm and the factor it would scale every .grad
    by, None when the norm is within max_norm; scales nothing (AdamW.step's grad_scale takes
    the factor into its pass). NonFiniteError for a NaN or inf norm; across, squares as
    clip_grad_norm's."""
    expect_finite("clip_grad_norm", "max_norm", max_norm, 0, open_low=True)
    if squares is None:
        fn = fused_adamw.sum_squares if use_fused() else fused_adamw.sum_squares_ref
        squares = [fn(p.grad) for p in params]
    local = sum(float(q) for q in squares)  # in Param order
    norm = math.sqrt(local if across is None else across(local))
    if not math.isfinite(norm):
        raise NonFiniteError(f"clip_grad_norm: the global gradient norm is {norm} (a gradient "
                             f"holds NaN or inf); nothing was clipped")
    return norm, (max_norm / (norm + 1e-6) if norm > max_norm else None)


def cosine_schedule(step, max_lr, min_lr, warmup, total):
    """lr at `step`: linear from 0 to max_lr over `warmup` steps, cosine down to min_lr at
    `total`, then min_lr.    lr = min + (max - min) * (1 + cos(pi * progress)) / 2."""
    for name, v in (("max_lr", max_lr), ("min_lr", min_lr)):
        expect_finite("cosine_schedule", name, v, 0)
    if not 0 <= warmup <= total:
        raise ValueError(f"cosine_schedule: need 0 <= warmup <= total, got warmup={warmup}, "
                         f"total={total}")
    if step < warmup:
        return max_lr * step / warmup
    if step >= total:
        return min_lr
    progress = (step - warmup) / max(total - warmup, 1)
    return min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * progress))
