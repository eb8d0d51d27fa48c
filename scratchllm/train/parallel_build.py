"""Building only this rank's part of a model: the one-process LM of the seed, without ever
holding all of it.

A run on a rank grid must start from the weights one process draws from the seed (the
equivalence with one process depends on it), but a rank that keeps a slice of each weight
(tensor and expert parallel), one stage's blocks (pipeline) or one shard of the Params (ZeRO-3)
should not hold the whole model first. `build_part` replays the seed's draws in their order and
cuts each Param as soon as it is created:

    pass 1   LM(cfg) on an rng that draws nothing (np.empty: no page touched): the name of
             each Param in the order the constructors create them
    pass 2   LM(cfg, rng) again, the real draws, each new Param replaced at once by
             hold(name, whole array): the array itself, a slice of it, or None (released: a
             zero-strided placeholder of its shape, one element held)

so a rank holds at most one whole Param beyond its part (the largest: the embedding or the
head). The draws are the one-process model's, in the same order: a slice is bit for bit the
slice of the one-process weight. An in-place change a constructor makes after creating a
Param (a tied embedding's scale) applies to the part alike.
"""
from contextlib import contextmanager

import numpy as np

from scratchllm.core.nn import NO_DRAWS, Param
from scratchllm.dist import partition
from scratchllm.dist.zero_layers import empty_grad, released
from scratchllm.lm import LM


@contextmanager
def _on_new_param(fn):
    """fn(param) right after each Param is created, for the duration (Param.__init__ wrapped,
    restored on exit)."""
    init = Param.__init__

    def hooked(self, data):
        init(self, data)
        fn(self)

    Param.__init__ = hooked
    try:
        yield
    finally:
        Param.__init__ = init


def skeleton(cfg, dtype):
    """(LM of cfg with uninitialised weights (untouched pages), [the name of each Param in
    creation order; None for one the model does not keep])."""
    made = []
    with _on_new_param(made.append):
        model = LM(cfg, rng=NO_DRAWS, dtype=dtype)
    names = {id(p): n for n, p in model.named_parameters()}
    return model, [names.get(id(p)) for p in made]


def build_part(cfg, rng, dtype, hold):
    """LM(cfg, rng=rng, dtype=dtype) holding, for each Param `name`, hold(name, whole array):
    an array (the whole or a part: the Param's data from then on) or None (released: a
    read-only zero-strided placeholder of the whole shape, and a writable zero-strided
    gradient). At most one whole Param is held at a time beyond the parts."""
    names = iter(skeleton(cfg, dtype)[1])
    gone = []

    def cut(p):
        name = next(names)
        if name is None:
            return
        part = hold(name, p.data)
        if part is None:  # a writable placeholder while the constructors run
            p.data = empty_grad(p)
            gone.append(p)
        else:
            p.data = np.ascontiguousarray(part)
        p.grad = empty_grad(p) if part is None else np.zeros(p.data.shape, p.data.dtype)

    with _on_new_param(cut):
        model = LM(cfg, rng=rng, dtype=dtype)
    for p in gone:
        p.data = released(p)
    return model


def zero_owned(cfg, dtype, optimizer, group):
    """The names of the Params ZeRO's partition (dist.ZeroAdamW) gives this rank of group, in
    the slot order of optimizer(model) (the run's AdamW: trainer.make_optimizer) on a skeleton
    of cfg."""
    model, _ = skeleton(cfg, dtype)
    names = {id(p): n for n, p in model.named_parameters()}
    params = optimizer(model).params
    owner = partition([p.data.size for p in params], group.size)
    return {names[id(p)] for p, r in zip(params, owner) if r == group.rank}
