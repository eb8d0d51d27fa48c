"""Fine-tuning LoRA adapters only (hub/peft.py's LoRA on any projection of an LM): each step
merges the adapters into their weights (W = W0 + s A B), runs the model's own forward and
backward, turns each target weight's gradient into its adapter's (lora_merge_backward) and
steps AdamW on the adapters alone, with train's warmup + cosine and gradient clip. The
backward runs under core/frozen.py's frozen_weights for every weight but the targets, so the
linear pair skips their x^T dy (benchmarks/bench_lora.py measures the step with and without);
the embedding's and the norms' gradients are still computed and dropped. LoRA also saves the
optimizer state and the checkpoint (R (Din + Dout) numbers per target instead of Din Dout).

Resuming: with a state directory, every settings.eval_every steps (and at the end) the
adapters, AdamW's moments and step, the batch RNG and the losses so far go to DIR/state.npz
(train/checkpoint.py's save_state); resume=True continues from it bit for bit (the base
weights are frozen, so the adapters are the whole model state).
"""
import numpy as np
from tqdm import tqdm

from scratchllm.core import AdamW, clip_grad_norm, cosine_schedule
from scratchllm.core.frozen import frozen_weights
from scratchllm.train import corpus
from scratchllm.train.checkpoint import CheckpointError, load_state, save_state
from scratchllm.train.trainer import evaluate


def _identity(lora):
    """What a saved state must match: rank, alpha, scale and the adapted modules."""
    return {"rank": lora.rank, "alpha": lora.alpha, "scale": lora.scale,
            "modules": sorted(lora.sites)}


def _save(directory, lora, opt, rng, step, losses, settings):
    arrays = {f"{k}.{m}": getattr(site, k).data for m, site in lora.sites.items()
              for k in ("A", "B")}
    arrays.update({f"opt.m.{i}": m for i, m in enumerate(opt.m)})
    arrays.update({f"opt.v.{i}": v for i, v in enumerate(opt.v)})
    meta = {"step": step, "rng": rng.bit_generator.state, "settings": vars(settings).copy(),
            "dtype": str(next(iter(lora.sites.values())).A.data.dtype), "manifest": None,
            "opt_t": opt.t, "losses": losses, "lora": _identity(lora)}
    meta["settings"] = {k: v for k, v in meta["settings"].items()
                        if isinstance(v, (int, float, str, bool, type(None)))}
    save_state(directory, arrays, meta)


def _load(directory, lora, opt, rng, settings):
    """Restore a saved state into lora, opt and rng; returns (step, losses)."""
    arrays, meta = load_state(directory)
    if meta.get("lora") != _identity(lora):
        raise CheckpointError(f"fit_lora: {directory} holds adapters {meta.get('lora')}, "
                              f"but this run has {_identity(lora)}")
    if meta["step"] > settings.steps:
        raise CheckpointError(f"fit_lora: {directory} is at step {meta['step']}, past "
                              f"steps={settings.steps}; give at least that many steps")
    for m, site in lora.sites.items():
        site.A.data[...], site.B.data[...] = arrays[f"A.{m}"], arrays[f"B.{m}"]
    for i in range(len(opt.m)):
        opt.m[i][...], opt.v[i][...] = arrays[f"opt.m.{i}"], arrays[f"opt.v.{i}"]
    opt.t = meta["opt_t"]
    rng.bit_generator.state = meta["rng"]
    return meta["step"], list(meta["losses"])


def fit_lora(model, lora, train_ids, eval_set, settings, progress=True, state=None,
             resume=False):
    """Train `lora` (on `model`) for settings.steps steps of settings.batch_size x
    settings.seq_len tokens of train_ids. state: a directory for the resumable state (None:
    none is kept); resume: continue the state in it. Returns (training losses per step,
    validation loss on eval_set at the end); the adapters are left merged."""
    s = settings
    opt = AdamW(lora.parameters(), lr=s.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng([s.seed, 1])
    if resume and state is None:
        raise ValueError("fit_lora: resume=True needs the state directory")
    done, losses = _load(state, lora, opt, rng, s) if resume else (0, [])
    targets = {id(w) for site in lora.sites.values() for w in site.weights}
    frozen = [p.data for p in model.parameters() if id(p) not in targets]
    bar = tqdm(range(done + 1, s.steps + 1), desc="lora", disable=not progress)
    for step in bar:  # an interrupted run resumes from the last save (a step cut midway
        _step(model, lora, opt, rng, (train_ids, s, step, frozen), losses)  # is not whole)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if state is not None and (step % s.eval_every == 0 or step == s.steps):
            _save(state, lora, opt, rng, step, losses, s)
    lora.merge()
    model.zero_grad()
    return losses, evaluate(model, eval_set)


def _step(model, lora, opt, rng, where, losses):
    """One step on a batch of train_ids; where = (train_ids, settings, step, the frozen
    weights' arrays: their x^T dy is skipped)."""
    train_ids, s, step, frozen = where
    x, y = corpus.sample_batch(train_ids, s.batch_size, s.seq_len, rng)
    lora.merge()  # fwd: W = W0 + s A B
    model.zero_grad()
    for p in lora.parameters():  # the adapters are not the model's Params
        p.grad[...] = 0
    _, cache = model.loss(x, y)
    with frozen_weights(frozen):
        model.loss_backward(1.0, cache)
    lora.backward()  # dW -> dA, dB
    clip_grad_norm(lora.parameters(), s.clip)
    opt.lr = cosine_schedule(step, s.lr, s.lr / 10, s.warmup, s.steps)
    opt.step()
    losses.append(float(cache.ce))
