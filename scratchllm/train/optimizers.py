"""The optimizer of a training run (trainer.Run): AdamW over every Param, or Muon on the
blocks' matrices beside AdamW on the rest (core/muon.py), with the weight-decay split and the
per-name parameter groups of Settings.param_groups."""
import fnmatch

from scratchllm.core.muon import Muon, MuonAdamW
from scratchllm.core.optim import AdamW

OPTIMIZERS = ("adamw", "muon")


def _decays(name, p):
    """Weight decay on matrices only: not on norms' gains, vectors, or Mamba's A_log."""
    return p.data.ndim >= 2 and not name.endswith("A_log")


def muon_params(name, p):
    """Muon's Params: the matrices inside the blocks (attention and MLP projections,
    routers, mixers' projections), not Mamba's A_log or a depthwise convolution's taps, not
    3-D expert stacks, embeddings or the head (Keller Jordan's split: AdamW for those)."""
    return (name.startswith("layers.") and p.data.ndim == 2
            and name.rsplit(".", 1)[-1] not in ("A_log", "conv_w"))


def make_optimizer(model, s):
    """AdamW (betas 0.9, 0.95) with decoupled weight decay where _decays says so; with
    s.param_groups, the Params each rule's glob pattern matches (the first rule wins) form
    a group of their own lr scale and weight decay (an error names a rule that matches
    nothing). With s.optimizer "muon", the muon_params not matched by a rule get Muon
    (momentum 0.95, Nesterov; peak lr s.muon_lr) instead, decayed by the same factor
    1 - lr_t * weight_decay a step as AdamW's matrices (Muon's wd = wd * lr / muon_lr)."""
    if s.optimizer not in OPTIMIZERS:
        raise ValueError(f"Settings.optimizer must be one of {OPTIMIZERS}, got {s.optimizer!r}")
    rules = [tuple(r) for r in (s.param_groups or [])]
    groups = [{"params": [], "lr_scale": float(scale), "weight_decay": float(wd)}
              for _, scale, wd in rules]
    decay, rest, hidden = [], [], []
    for n, p in model.named_parameters():
        i = next((i for i, r in enumerate(rules) if fnmatch.fnmatchcase(n, r[0])), None)
        (groups[i]["params"] if i is not None else
         hidden if s.optimizer == "muon" and muon_params(n, p) else
         decay if _decays(n, p) else rest).append(p)
    empty = [r[0] for r, g in zip(rules, groups) if not g["params"]]
    if empty:
        raise ValueError(f"param_groups: no parameter name matches {empty} (names look like "
                         f"{next(iter(dict(model.named_parameters())))!r}, "
                         f"'layers.0.ffn.w_router')")
    adamw = AdamW([{"params": decay, "weight_decay": s.weight_decay},
                   {"params": rest, "weight_decay": 0.0}] + groups, lr=s.lr, betas=(0.9, 0.95))
    adamw.threads = s.threads  # the fused update's threads: the run's (--threads 1: one)
    if s.optimizer == "adamw":
        return adamw
    muon = Muon(hidden, lr=s.muon_lr, weight_decay=s.weight_decay * s.lr / s.muon_lr,
                threads=s.threads)
    return MuonAdamW(adamw, muon, s.muon_lr / s.lr)
