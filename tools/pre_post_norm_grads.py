"""A small experiment: the gradient norm of each layer's parameters at initialisation, for a
pre-norm and a post-norm decoder (block="pre" / "post"), averaged over seeds. Xiong et al.
2020 (arXiv 2002.04745) analyse why post-norm needs a learning-rate warmup from these
norms; here they are measured on the library's own tiny model, with its hand-written backward.

    PYTHONPATH=$PWD python tools/pre_post_norm_grads.py [--layers 8] [--seeds 3]
"""
import argparse

import numpy as np

from scratchllm.lm import LM, preset


def grad_norms(block, n_layers, seed):
    """||d CE / d params of layer l|| for l = 0..L-1 at init, one random batch."""
    cfg = preset("dense", vocab_size=64, d_model=32, n_layers=n_layers, n_heads=4,
                 n_kv_heads=2, d_ff=64, block=block)
    model = LM(cfg, rng=np.random.default_rng(seed), dtype=np.float64)
    ids = np.random.default_rng(100 + seed).integers(0, 64, (4, 32))  # (B, T)
    _, cache = model.loss(ids, np.roll(ids, -1, axis=1))
    model.loss_backward(1.0, cache)
    return [float(np.sqrt(sum((p.grad ** 2).sum() for p in layer.parameters())))
            for layer in model.layers]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    print("layer  " + "  ".join(f"{i:>6}" for i in range(args.layers)))
    for block in ("pre", "post"):
        norms = np.mean([grad_norms(block, args.layers, s) for s in range(args.seeds)], axis=0)
        print(f"{block:<6} " + "  ".join(f"{n:6.3f}" for n in norms))


if __name__ == "__main__":
    main()
