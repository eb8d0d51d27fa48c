"""Fine-tuning LoRA adapters only (hub/peft.py's LoRA on any projection of an LM): each step
merges the adapters into their weights (W = W0 + s A B), runs the model's own forward and
backward, turns each target weight's gradient into its adapter's (lora_merge_backward) and
steps AdamW on the adapters alone, with train's warmup + cosine and gradient clip. The frozen
weights' gradients are still computed and dropped: what LoRA saves here is the optimizer state
and the checkpoint (R (Din + Dout) numbers per target instead of Din Dout), not backward
FLOPs (benchmarks/bench_lora.py: the frozen dW matmuls are 16% of a step of a small dense
model).
"""
import numpy as np
from tqdm import tqdm

from scratchllm.core import AdamW, clip_grad_norm, cosine_schedule
from scratchllm.train import corpus
from scratchllm.train.trainer import evaluate


def fit_lora(model, lora, train_ids, eval_set, settings, progress=True):
    """Train `lora` (on `model`) for settings.steps steps of settings.batch_size x
    settings.seq_len tokens of train_ids. Returns (training losses per step, validation loss
    on eval_set at the end); the adapters are left merged."""
    s = settings
    opt = AdamW(lora.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng([s.seed, 1])
    losses = []
    bar = tqdm(range(1, s.steps + 1), desc="lora", disable=not progress)
    for step in bar:
        x, y = corpus.sample_batch(train_ids, s.batch_size, s.seq_len, rng)
        lora.merge()  # fwd: W = W0 + s A B
        model.zero_grad()
        loss, cache = model.loss(x, y)
        model.loss_backward(1.0, cache)
        lora.backward()  # dW -> dA, dB
        clip_grad_norm(lora.parameters(), s.clip)
        opt.lr = cosine_schedule(step, s.lr, s.lr / 10, s.warmup, s.steps)
        opt.step()
        losses.append(float(cache.ce))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    lora.merge()
    model.zero_grad()
    return losses, evaluate(model, eval_set)
