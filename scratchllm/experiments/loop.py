"""The training loop the trained experiments share: train's step (scratchllm/train/trainer.py
Run.train_step: CE + aux -> backward -> clip -> AdamW, warmup + cosine) on byte batches, the
validation loss read at a few steps on one fixed evaluation set, a progress bar."""
import numpy as np
from tqdm import tqdm

from scratchllm.train.trainer import Run, evaluate


def train_curve(model, settings, train_ids, eval_set, n_points=8, desc="train"):
    """Train `model` (an LM) as `settings` say on batches of train_ids; returns (curve, run):
    curve [(step, validation loss (nats/token))] at n_points evenly spaced steps (the last
    one the final step), run the trainer's Run (its .losses the training losses)."""
    run = Run(model.cfg, settings, model.dtype, model=model)
    steps = settings.steps
    marks = set(np.linspace(0, steps, n_points + 1).astype(int)[1:].tolist())
    curve = []
    for step in tqdm(range(1, steps + 1), desc=desc, leave=False, disable=steps < 20):
        run.train_step(train_ids)
        if step in marks:
            curve.append((step, float(evaluate(model, eval_set))))
    run.dp.close()
    return curve, run
