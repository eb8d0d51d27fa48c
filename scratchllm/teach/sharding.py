"""Per-GPU memory and communication of training a real model on a dp x tp x pp grid (pure
Python: `size MODEL --parallel dp=8,tp=8,pp=4`), by the formulas the library's parallel
training counts with (scratchllm/dist, train/megatron.py, train/pipeline.py):

    memory per GPU, Psi = parameters / (tp pp) this GPU's share (mixed precision: Rajbhandari
    et al. 2020, arXiv:1910.02054, section 3.1: 2 + 2 + 12 bytes per parameter)
        weights   2 Psi            (/ dp with ZeRO-3)
        gradients 2 Psi            (/ dp with ZeRO-2 and 3)
        AdamW     12 Psi           fp32 master, m, v (/ dp with ZeRO-1, 2, 3)
    bytes one GPU sends per step (ring algorithms, Patarasuk & Yuan 2009)
        dp  all-reduce of its gradients: 2 (dp-1)/dp x 2 Psi (ZeRO-1/2: a reduce-scatter and
            an all-gather, the same; ZeRO-3: one more all-gather of the weights, 3 in all)
        tp  per block and micro-batch, 2 all-reduces forward and 2 backward of the b x T x D
            activation (Megatron's f and g): 4 x 2 (tp-1)/tp x b T D x 2 bytes, L/pp blocks
        pp  each micro-batch's activation forward and its gradient back, b T D x 2 bytes each
            (the middle stages; the first and last send one of the two)
    the pipeline bubble (pp-1) / (m + pp-1) for m micro-batches (GPipe and 1F1B alike).

Activations are left out (they depend on recomputation and the kernels); embeddings are counted
on the stages that hold them as if spread evenly, and the parameters split evenly over the tp
ranks (the norms, replicated, are a rounding error here).
"""
from typing import NamedTuple

from scratchllm.teach.sizing import parameters

BYTES = {"weights": 2, "gradients": 2, "adamw": 12}  # bf16 weights and grads, fp32 states


class Grid(NamedTuple):
    dp: int = 1
    tp: int = 1
    pp: int = 1


def parse_grid(text):
    """'dp=8,tp=8,pp=4' -> Grid(8, 8, 4); ValueError naming what is wrong."""
    sizes = {}
    for part in text.split(","):
        axis, _, value = part.strip().partition("=")
        if axis not in Grid._fields or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--parallel: {part.strip()!r} is not AXIS=N with AXIS one of "
                             f"{', '.join(Grid._fields)} and N >= 1 (e.g. dp=8,tp=8,pp=4)")
        sizes[axis] = int(value)
    return Grid(**sizes)


def per_gpu(cfg, grid, *, zero=0, micro_batch=1, context=4096, n_micro=None):
    """{name: value} of one GPU's share: 'params', memory in bytes ('weights', 'gradients',
    'adamw', 'total'), bytes sent per step per axis ('dp', 'tp', 'pp'), 'bubble'."""
    psi = parameters(cfg).total // (grid.tp * grid.pp)
    m = grid.pp if n_micro is None else n_micro
    shard = {"weights": 3, "gradients": 2, "adamw": 1}
    out = {"params": psi}
    for name, b in BYTES.items():
        out[name] = b * psi // (grid.dp if zero >= shard[name] else 1)
    out["total"] = out["weights"] + out["gradients"] + out["adamw"]
    grads = 2 * psi
    out["dp"] = 2 * (grid.dp - 1) * grads // grid.dp
    if zero >= 3:
        out["dp"] += (grid.dp - 1) * grads // grid.dp  # the weights gathered once more
    act = micro_batch * context * cfg.d_model * 2  # one (b, T, D) activation in bf16
    blocks = cfg.n_layers // grid.pp
    out["tp"] = m * blocks * 4 * 2 * (grid.tp - 1) * act // grid.tp
    out["pp"] = 0 if grid.pp == 1 else m * 2 * act
    out["bubble"] = (grid.pp - 1) / (m + grid.pp - 1)
    return out
