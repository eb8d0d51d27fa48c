"""A needle beyond the window: full attention, sliding-window attention (Mistral) and
local/global attention (Gemma: a sliding layer, then a full one), 2 layers each, trained to
fetch the one needle token planted among filler at a random depth, then asked for it at
every depth (synthetic.py needle_batch).

A sliding window of W lets a query see W - 1 tokens back; L such layers relay at most
L (W - 1) (each layer's output at t holds what its window saw), so a needle deeper than that
is out of reach, however well the model is trained. One full layer in the stack (local/global)
reaches every depth. "Lost in the middle" (Liu et al. 2023, arXiv 2307.03172) is the U shape
of large trained models' retrieval against the needle's position; a model trained here with
depths drawn uniformly has no reason to form it, and the table says whether it does.
Metrics: accuracy[model][depth] (depth: the needle's distance from the end, the query token),
reach[model] (the deepest depth the masks can relay: L (W - 1), or T - 1).
"""
import numpy as np

from scratchllm.experiments.base import Experiment, Outcome, pick
from scratchllm.experiments.synthetic import accuracy, needle_batch, train_task
from scratchllm.lm import LM
from scratchllm.specs import preset

_NAME = "needle"
_CLAIM = ("a sliding window loses a needle planted beyond the reach of its layers, while full "
         "and local/global attention retrieve it at every depth; trained LLMs lose needles in "
         "the middle of the context")
N_FILL, N_NEEDLES, N_LAYERS = 32, 16, 2
NEEDLE_MODELS = {
    "full": lambda w: dict(),
    "swa": lambda w: dict(window=w),
    "local_global": lambda w: dict(window=w, layer_types=["sliding_attention",
                                                          "full_attention"]),
}


def _sizes(mode):
    """The settings of a mode: seq_len, window, d_model, steps, batch, eval batch, lr."""
    return dict(seq_len=pick(mode, 16, 64, 128), window=pick(mode, 4, 8, 16),
                d_model=pick(mode, 16, 64, 64), steps=pick(mode, 6, 300, 800),
                batch=pick(mode, 4, 32, 32), eval_batch=pick(mode, 4, 64, 128), lr=3e-3)


def depths_of(T, W):
    """The depths asked: within the window, within the stack's reach, beyond it, the middle,
    and the very start (depth T - 1)."""
    return sorted({W // 2, W + W // 2, N_LAYERS * W + W // 2, T // 2, 3 * T // 4, T - 1})


def needle_config(name, z):
    return preset("dense", vocab_size=N_FILL + N_NEEDLES + 1, d_model=z["d_model"],
                  n_layers=N_LAYERS, n_heads=4, n_kv_heads=4, ffn="none",
                  **NEEDLE_MODELS[name](z["window"]))


def reach(name, z):
    """The deepest needle the masks can carry to the query."""
    T, W = z["seq_len"], z["window"]
    return T - 1 if name != "swa" else min(T - 1, N_LAYERS * (W - 1))


def _run(mode, seed, z=None):
    z = _sizes(mode) if z is None else z
    T, W = z["seq_len"], z["window"]
    depths = depths_of(T, W)
    acc = {}
    for name in NEEDLE_MODELS:
        model = LM(needle_config(name, z), rng=np.random.default_rng(seed), dtype=np.float32)
        rng = np.random.default_rng([seed, 1])

        def sample(step):
            d = rng.integers(1, T, z["batch"])
            return needle_batch(rng, z["batch"], T, d, N_FILL, N_NEEDLES)
        train_task(model, sample, z["steps"], z["lr"], desc=name)
        eval_rng = np.random.default_rng([seed, 2])
        B = z["eval_batch"]
        acc[name] = {d: accuracy(model, *needle_batch(eval_rng, B, T, np.full(B, d), N_FILL,
                                                      N_NEEDLES)) for d in depths}
    reaches = {name: reach(name, z) for name in NEEDLE_MODELS}
    lines = [f"{'model':<14}{'reach':>6} | " + "".join(f"{'d=' + str(d):>7}" for d in depths)]
    lines += [f"{m:<14}{reaches[m]:>6} | " + "".join(f"{acc[m][d]:>7.2f}" for d in depths)
              for m in NEEDLE_MODELS]
    lines.append(f"T={T}, window {W}, {N_LAYERS} layers; depth d: the needle d tokens before "
                 f"the query; chance 1/{N_NEEDLES}")
    beyond = [d for d in depths if d > reaches["swa"]]
    mid = [d for d in depths if T // 4 <= d <= 3 * T // 4]
    swa_beyond = float(np.mean([acc["swa"][d] for d in beyond]))
    full_mid = float(np.mean([acc["full"][d] for d in mid]))
    full_ends = float(np.mean([acc["full"][min(depths)], acc["full"][max(depths)]]))
    holds = swa_beyond < 0.5 * min(np.mean([acc[m][d] for d in beyond])
                                   for m in ("full", "local_global"))
    dip = ("a dip: lost in the middle" if full_mid < full_ends - 0.05 else "no dip: trained "
           "on uniform depths, this model is not lost in the middle")
    verdict = (f"beyond the window's reach (d > {reaches['swa']}) swa {swa_beyond:.2f}, full "
               f"{np.mean([acc['full'][d] for d in beyond]):.2f}, local/global "
               f"{np.mean([acc['local_global'][d] for d in beyond]):.2f}: "
               f"{'the window loses the needle, as claimed' if holds else 'not shown here'}; full "
               f"attention in the middle {full_mid:.2f} against {full_ends:.2f} at the ends "
               f"({dip})")
    config = dict(z, n_layers=N_LAYERS, n_heads=4, ffn="none", fillers=N_FILL,
                  needles=N_NEEDLES, depths=depths, reach=reaches)
    metrics = dict(accuracy=acc, reach=reaches)
    return Outcome(metrics, config, "\n".join(lines), verdict)


def _figure(fig, outcome):
    ax = fig.subplots()
    m = outcome.metrics
    for name, by_depth in m["accuracy"].items():
        ax.plot([int(d) for d in by_depth], list(by_depth.values()), "o-", label=name)
    ax.axvline(m["reach"]["swa"], ls="--", c="gray", label="sliding window's reach")
    ax.set(xlabel="needle depth (tokens before the query)", ylabel="retrieval accuracy",
           ylim=(0, 1.02), title="a needle beyond the window")
    ax.legend()


NEEDLE = Experiment(_NAME, _CLAIM, _run, _figure)
