"""Write tests/fixtures/adamw_torch_float32.npz: five torch.optim.AdamW steps (float32,
single-tensor CPU path, the default) on a seeded parameter, with a different lr per step, so
tests/core/test_fused.py can check that scratchllm's AdamW update gives torch's bits.
Needs torch (the bench extra):  python tools/make_adamw_fixture.py
"""
from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "adamw_torch_float32.npz"
LRS = (1e-3, 8e-3, 5e-3, 2e-4, 3e-2)
BETAS, EPS, WD = (0.9, 0.95), 1e-8, 0.1


def main():
    rng = np.random.default_rng(0)
    p0 = (rng.standard_normal(4099) * np.logspace(-4, 1, 4099)).astype(np.float32)
    grads = (rng.standard_normal((len(LRS), 4099)) * np.logspace(-6, 0, 4099)).astype(np.float32)
    p = torch.from_numpy(p0.copy()).requires_grad_()
    opt = torch.optim.AdamW([p], lr=LRS[0], betas=BETAS, eps=EPS, weight_decay=WD)
    for lr, g in zip(LRS, grads):
        opt.param_groups[0]["lr"] = lr
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    state = opt.state[p]
    np.savez(OUT, p0=p0, grads=grads, lrs=np.array(LRS), betas=np.array(BETAS), eps=EPS,
             weight_decay=WD, p=p.detach().numpy(), m=state["exp_avg"].numpy(),
             v=state["exp_avg_sq"].numpy(), torch_version=torch.__version__)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
